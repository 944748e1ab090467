"""Flower's quickstart-pytorch app, offline, with flwr-importance strategies."""

"""Flower's NumPyClient quickstart-pytorch with flwr-importance's legacy strategies."""

"""Flower's quickstart-pytorch with a ResNet-18, trained by ISFedAvg."""

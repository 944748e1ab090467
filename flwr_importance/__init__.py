"""Importance sampling strategies for federated learning with Flower."""

__version__ = "0.1.0"

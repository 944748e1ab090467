"""The Flower App run by ``flwr run .``: ServerApp, ClientApp, methods, presets."""

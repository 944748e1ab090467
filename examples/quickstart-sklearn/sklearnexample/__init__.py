"""sklearnexample: Flower's quickstart-sklearn with flwr-importance's strategies."""

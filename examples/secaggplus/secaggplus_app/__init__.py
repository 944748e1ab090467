"""A Flower App running the library's strategies under Flower's SecAgg+."""

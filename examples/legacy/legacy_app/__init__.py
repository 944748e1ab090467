"""A legacy-API Flower App running the importance-sampling strategies."""

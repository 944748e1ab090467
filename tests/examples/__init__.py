"""Tests of the example apps under ``examples/``."""

"""The Gaussian mixture over clients of log-normal sizes (FedSampling's scale)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flwr_importance.tasks import FederatedSplit
from flwr_importance.tasks.generators import MIXTURE_DIMENSION, lognormal_mixture

NUM_CLIENTS = 400
MEAN_SIZE = 200.0
SIGMA = 0.5


@pytest.fixture(scope="module")
def split() -> FederatedSplit:
    return lognormal_mixture(
        NUM_CLIENTS, mean_size=MEAN_SIZE, sigma=SIGMA, num_classes=5, seed=3
    )


def test_same_seed_same_data(split: FederatedSplit) -> None:
    again = lognormal_mixture(
        NUM_CLIENTS, mean_size=MEAN_SIZE, sigma=SIGMA, num_classes=5, seed=3
    )
    assert all(
        torch.equal(first.x, second.x) and torch.equal(first.y, second.y)
        for first, second in zip(split.partitions, again.partitions, strict=True)
    )


def test_log_sizes_follow_the_lognormal(split: FederatedSplit) -> None:
    # log n_k ~ N(ln(mean) - sigma^2 / 2, sigma^2): its sample mean lies within
    # 4 standard errors, and its standard deviation within 4 of those of a
    # normal's standard deviation (sigma / sqrt(2 n)). Rounding to integers
    # moves a log size of ~200 by at most 1/(2 * 24) at the smallest sizes here.
    log_sizes = np.log(split.partition_sizes)
    expected_mean = math.log(MEAN_SIZE) - SIGMA**2 / 2
    standard_error = SIGMA / math.sqrt(NUM_CLIENTS)
    assert abs(log_sizes.mean() - expected_mean) < 4 * standard_error + 0.02
    assert abs(log_sizes.std() - SIGMA) < 4 * SIGMA / math.sqrt(2 * NUM_CLIENTS) + 0.02


def test_shapes_labels_and_test_share(split: FederatedSplit) -> None:
    sizes = split.partition_sizes
    assert split.input_shape == (MIXTURE_DIMENSION,) and split.num_outputs == 5
    assert len(split.test.x) == sum(math.ceil(0.2 * size) for size in sizes)
    labels = torch.cat([part.y for part in split.partitions])
    assert labels.min() >= 0 and labels.max() < 5


def test_clients_hold_skewed_labels(split: FederatedSplit) -> None:
    # Dirichlet(0.5) over 5 classes: a client's largest class share has mean
    # about 0.55; an IID split would give 0.2 plus sampling noise (about 0.07
    # at 200 samples), so a median above 0.35 shows the skew.
    shares = [
        np.bincount(part.y.numpy(), minlength=5).max() / len(part.y)
        for part in split.partitions
    ]
    assert np.median(shares) > 0.35


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        lognormal_mixture(0, mean_size=10, sigma=1, seed=0)
    with pytest.raises(ValueError):
        lognormal_mixture(10, mean_size=10, sigma=1, label_concentration=0, seed=0)

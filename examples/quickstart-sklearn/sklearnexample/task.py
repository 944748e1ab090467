"""sklearnexample: the model and the data of Flower's quickstart-sklearn, offline.

Flower's ``LogisticRegression`` with its parameter helpers, on scikit-learn's
bundled 8x8 digits instead of a downloaded MNIST: a fifth of the images is the
server's central test set, the rest is split over the nodes with label skew
(each node's label proportions drawn from a Dirichlet distribution), so nodes
differ in size and content and which ones are sampled matters. Every node
holds a few images of every digit, so every local ``LogisticRegression``
knows all ten classes and has the global model's shape.

The multi-model method (``mmfl``) trains a second model at once, on a second
task over the same nodes: the same images transposed (``task=1``).
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numpy.typing import NDArray
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

#: The ten digits: every model has one row of coefficients per label.
UNIQUE_LABELS = np.arange(10)

#: Fraction of the images held out as the server's central test set, and of a
#: node's images (per digit) held out as its local test set.
TEST_FRACTION = 0.2

#: Concentration of the Dirichlet draw of each node's label proportions: the
#: smaller, the more skewed.
DIRICHLET_ALPHA = 0.5

#: Images of every digit each node gets before the skewed draw.
MIN_PER_DIGIT = 3

SEED = 42

#: Tasks of the multi-model run: the digits, and the digits transposed.
NUM_TASKS = 2

#: ``(X_train, y_train, X_test, y_test)`` of one node.
Partition = tuple[
    NDArray[np.float64], NDArray[np.int64], NDArray[np.float64], NDArray[np.int64]
]


def get_model(local_epochs: int) -> LogisticRegression:
    """A ``LogisticRegression`` that continues from the weights it is given.

    ``warm_start`` makes ``fit`` start from ``coef_``/``intercept_`` (the
    received global model), and ``max_iter`` caps the local solver's
    iterations, the local epochs.
    """
    return LogisticRegression(max_iter=local_epochs, warm_start=True)


def get_model_params(model: LogisticRegression) -> list[NDArray[np.float64]]:
    """The model's parameters: ``[coef_, intercept_]``."""
    return [model.coef_, model.intercept_]


def set_model_params(
    model: LogisticRegression, params: list[NDArray[np.float64]]
) -> LogisticRegression:
    """Set the model's ``coef_`` and ``intercept_`` (and its classes)."""
    model.coef_, model.intercept_ = params
    model.classes_ = UNIQUE_LABELS
    return model


def set_initial_params(model: LogisticRegression) -> None:
    """Zero parameters of the right shape, so the server has a first model.

    scikit-learn creates ``coef_`` in ``fit``; the server never fits.
    """
    num_features = _digits()[0].shape[1]
    set_model_params(
        model,
        [
            np.zeros((len(UNIQUE_LABELS), num_features)),
            np.zeros(len(UNIQUE_LABELS)),
        ],
    )


@cache
def _digits(task: int = 0) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """All images of ``task`` as 64 features scaled to ``[0, 1]``, and their labels."""
    if task not in range(NUM_TASKS):
        raise ValueError(f"task must be in 0..{NUM_TASKS - 1}, got {task}")
    digits = load_digits()
    images = digits.images if task == 0 else digits.images.transpose(0, 2, 1)
    features = images.reshape(len(images), -1) / 16.0
    return np.asarray(features, dtype=np.float64), digits.target


@cache
def _central_split() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The central test set's image indices, and those left for the nodes."""
    order = np.random.default_rng(SEED).permutation(len(_digits()[1]))
    num_test = int(TEST_FRACTION * len(order))
    return order[:num_test], order[num_test:]


@cache
def _partitions(num_partitions: int) -> list[NDArray[np.int64]]:
    """Each node's image indices: ``MIN_PER_DIGIT`` of each digit, then skewed."""
    labels = _digits()[1]
    pool = _central_split()[1]
    rng = np.random.default_rng([SEED, num_partitions])
    nodes: list[list[int]] = [[] for _ in range(num_partitions)]
    for digit in UNIQUE_LABELS:
        images = pool[labels[pool] == digit]
        floor = MIN_PER_DIGIT * num_partitions
        if len(images) < floor:
            raise ValueError(
                f"{num_partitions} partitions need {floor} images of digit {digit}"
            )
        shares = rng.dirichlet(np.full(num_partitions, DIRICHLET_ALPHA))
        extra = rng.multinomial(len(images) - floor, shares)
        bounds = np.cumsum(MIN_PER_DIGIT + extra)[:-1]
        for node, part in zip(nodes, np.split(images, bounds), strict=True):
            node.extend(int(index) for index in part)
    return [np.array(sorted(node)) for node in nodes]


def load_data(partition_id: int, num_partitions: int, task: int = 0) -> Partition:
    """The node's train and local test sets (of ``task``), split per digit.

    A fifth of each digit's images (rounded down) is the local test set, so
    the training set keeps at least ``MIN_PER_DIGIT - 1`` of every digit.
    Both tasks hold the same images of each node.
    """
    features, labels = _digits(task)
    indices = _partitions(num_partitions)[partition_id]
    test_parts = []
    for digit in UNIQUE_LABELS:
        of_digit = indices[labels[indices] == digit]
        test_parts.append(of_digit[: int(TEST_FRACTION * len(of_digit))])
    test = np.concatenate(test_parts)
    train = np.setdiff1d(indices, test)
    return features[train], labels[train], features[test], labels[test]


def load_centralized_data(
    task: int = 0,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The server's central test set of ``task`` (no node holds these images)."""
    features, labels = _digits(task)
    central_test = _central_split()[0]
    return features[central_test], labels[central_test]

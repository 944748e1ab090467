"""Splitting a labelled data set over clients with ``flwr_datasets`` partitioners.

The partitioners work on a two-column Hugging Face ``datasets.Dataset`` (sample
index, label) built in memory, so the same code partitions the offline digits
and the Hub data sets, and the features never pass through Arrow.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

# HF `datasets` and `flwr_datasets` (whose package import loads matplotlib and
# seaborn) are imported in partition_indices, not here: deployment starts a
# ClientApp process per message, and one training on an already generated data
# set, or using lognormal_partition_sizes alone, should not pay for them.
if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

PARTITIONINGS = ("iid", "pathological", "dirichlet", "lognormal", "label-sorted")

_INDEX = "index"
_LABEL = "label"


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    partitioning: str,
    *,
    seed: int,
    classes_per_client: int = 2,
    dirichlet_alpha: float = 0.5,
    lognormal_sigma: float = 1.0,
) -> list[np.ndarray]:
    """Split sample indices ``0..len(labels)-1`` over ``num_partitions`` clients.

    Parameters
    ----------
    labels : numpy.ndarray
        Class label of every sample.
    num_partitions : int
        Number of clients (at most the number of samples).
    partitioning : str
        ``"iid"``: shuffled, then ``IidPartitioner`` (sizes differ by at most
        one). ``"pathological"``: ``PathologicalPartitioner`` with
        ``classes_per_client`` classes per client in ``"first-deterministic"``
        mode: client ``i`` gets class ``i mod C`` plus random others, so every
        class is used as soon as there are ``C`` clients, and with one class per
        client each class goes to ``num_partitions / C`` clients (10 per digit
        for 100 clients, the clustered-sampling MNIST setting); a class's samples
        are split evenly among its clients. ``"dirichlet"``:
        ``DirichletPartitioner`` (each class spread over the clients with
        proportions ``Dir(dirichlet_alpha)``) with ``min_partition_size=0``, so
        it ends on its first draw even for ``alpha = 0.001``, where most clients
        get nothing; each empty client then takes one sample from the currently
        largest client, so every client can train. ``"lognormal"``: shuffled,
        then ``SizePartitioner`` with sizes from :func:`lognormal_partition_sizes`.
        ``"label-sorted"``: ``ShardPartitioner`` with one shard per client: the
        data sorted by label, cut into ``num_partitions`` equal contiguous shards
        dealt to clients at random (FedSampling's non-IID split); the last
        ``len(labels) mod num_partitions`` samples of the sorted order are left
        out. All other partitionings use every sample exactly once.
    seed : int
        Seed of the shuffles and of the partitioners' random draws.
    classes_per_client : int
        Classes per client of ``"pathological"``.
    dirichlet_alpha : float
        Concentration of ``"dirichlet"`` (> 0; smaller is more skewed).
    lognormal_sigma : float
        Log-scale standard deviation of ``"lognormal"`` sizes (>= 0).

    Returns
    -------
    list of numpy.ndarray
        The ``int64`` sample indices of every client, none empty.

    Raises
    ------
    ValueError
        For an unknown partitioning, more clients than samples, or an invalid
        option.
    """
    if partitioning not in PARTITIONINGS:
        raise ValueError(
            f"unknown partitioning {partitioning!r}; valid: {', '.join(PARTITIONINGS)}"
        )
    num_samples = len(labels)
    if not 1 <= num_partitions <= num_samples:
        raise ValueError(
            f"need 1 <= num_partitions <= {num_samples} samples, got {num_partitions}"
        )
    from datasets import Dataset  # on first use, see top
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
        SizePartitioner,
    )

    table = Dataset.from_dict({_INDEX: np.arange(num_samples), _LABEL: labels})
    partitioner: Partitioner
    if partitioning == "iid":
        # IidPartitioner cuts contiguous shards, so shuffle first.
        table = table.shuffle(seed=seed)
        partitioner = IidPartitioner(num_partitions)
    elif partitioning == "pathological":
        partitioner = PathologicalPartitioner(
            num_partitions,
            partition_by=_LABEL,
            num_classes_per_partition=classes_per_client,
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    elif partitioning == "dirichlet":
        if not dirichlet_alpha > 0:
            raise ValueError(f"dirichlet_alpha must be > 0, got {dirichlet_alpha}")
        partitioner = DirichletPartitioner(
            num_partitions,
            partition_by=_LABEL,
            alpha=float(dirichlet_alpha),
            min_partition_size=0,
            # Balancing can zero every remaining proportion of a class when alpha
            # is tiny (a 0/0 in the library); plain Dirichlet proportions cannot.
            self_balancing=False,
            seed=seed,
        )
    elif partitioning == "lognormal":
        table = table.shuffle(seed=seed)
        sizes = lognormal_partition_sizes(
            num_samples, num_partitions, lognormal_sigma, np.random.default_rng(seed)
        )
        partitioner = SizePartitioner([int(size) for size in sizes])
    else:
        partitioner = ShardPartitioner(
            num_partitions, partition_by=_LABEL, num_shards_per_partition=1, seed=seed
        )
    partitioner.dataset = table
    with warnings.catch_warnings():
        # datasets' sort (in ShardPartitioner) passes a pyarrow option that
        # pyarrow 25 deprecates; nothing the caller can act on.
        warnings.filterwarnings(
            "ignore", message="Specifying null_placement", category=FutureWarning
        )
        indices = [
            np.asarray(partitioner.load_partition(partition_id)[_INDEX], dtype=np.int64)
            for partition_id in range(num_partitions)
        ]
    return _fill_empty_partitions(indices)


def lognormal_partition_sizes(
    total: int, num_partitions: int, sigma: float, rng: np.random.Generator
) -> np.ndarray:
    """Client sizes summing to ``total``, each at least 1, log-normally spread.

    Every client gets one sample, and the other ``total - num_partitions`` are
    shared in proportion to weights ``exp(sigma z_i)``, ``z_i ~ N(0, 1)``
    (largest-remainder rounding). The ``z_i`` do not depend on ``sigma``, so for
    one seed a larger ``sigma`` spreads the same clients further apart.

    Parameters
    ----------
    total : int
        Number of samples to share (>= ``num_partitions``).
    num_partitions : int
        Number of clients (>= 1).
    sigma : float
        Log-scale standard deviation (>= 0; 0 gives equal sizes up to rounding).
    rng : numpy.random.Generator
        Source of the ``z_i``.

    Returns
    -------
    numpy.ndarray
        ``int64`` sizes.
    """
    if not sigma >= 0:
        raise ValueError(f"lognormal_sigma must be >= 0, got {sigma}")
    if not 1 <= num_partitions <= total:
        raise ValueError(f"need 1 <= num_partitions <= total, got {num_partitions}")
    log_weights = sigma * rng.standard_normal(num_partitions)
    # Softmax form, stable for sigma = 4 and beyond.
    shares = np.exp(log_weights - log_weights.max())
    quotas = (total - num_partitions) * shares / shares.sum()
    extra = np.floor(quotas).astype(np.int64)
    leftover = total - num_partitions - int(extra.sum())
    extra[np.argsort(extra - quotas, kind="stable")[:leftover]] += 1
    return 1 + extra


def _fill_empty_partitions(indices: list[np.ndarray]) -> list[np.ndarray]:
    """Give every empty partition one sample of the currently largest one."""
    indices = list(indices)
    for empty in [i for i, part in enumerate(indices) if len(part) == 0]:
        largest = int(np.argmax([len(part) for part in indices]))
        indices[empty] = indices[largest][-1:]
        indices[largest] = indices[largest][:-1]
    return indices

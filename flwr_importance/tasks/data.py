"""Federated data sets by name: generated, offline digits, and (online) Hub images.

:func:`load_dataset` serves the simulations and tests; it never downloads. The
generated data sets carry their own split over clients (one generating model per
client); ``"digits"`` is scikit-learn's bundled 8x8 digits, split with the
``flwr_datasets`` partitioners of :mod:`flwr_importance.tasks.partitioning`.
:func:`load_hub_dataset` gives users with a network the papers' real image data
sets through ``flwr_datasets.FederatedDataset``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from flwr_importance.tasks.generators import (
    TEST_FRACTION,
    isfedavg_logistic,
    isfedavg_regression,
    synthetic_fedprox,
)
from flwr_importance.tasks.partitioning import PARTITIONINGS, partition_indices
from flwr_importance.tasks.splits import ClientData, FederatedSplit

# Deployment starts a ClientApp process per message, which pays every import
# every time: scikit-learn, HF `datasets` and `flwr_datasets` (which loads
# matplotlib and seaborn) are imported where the digits or Hub data are built,
# not here, so a message on a generated data set loads none of them.
if TYPE_CHECKING:
    from typing import Unpack

    from datasets import Dataset

__all__ = [
    "DATASET_NAMES",
    "HUB_DATASET_NAMES",
    "ClientData",
    "FederatedSplit",
    "PartitionOptions",
    "load_dataset",
    "load_hub_dataset",
]

logger = logging.getLogger(__name__)

DATASET_NAMES = (
    "synthetic",
    "synthetic-iid",
    "synthetic-1-1",
    "isfedavg-regression",
    "isfedavg-logistic",
    "digits",
)
_GENERATED = frozenset(DATASET_NAMES) - {"digits"}


class PartitionOptions(TypedDict, total=False):
    """Keyword options of the label-skewed partitionings, each optional.

    :func:`load_dataset` and :func:`load_hub_dataset` take them as keyword
    arguments (``**partition_options``), checked against this dictionary by the
    type checker and on construction of the split at run time; a partitioning
    uses only its own option (see
    :func:`~flwr_importance.tasks.partitioning.partition_indices`).

    Attributes
    ----------
    classes_per_client : int
        Classes per client of the ``"pathological"`` partitioning; default 2.
    dirichlet_alpha : float
        Concentration of the ``"dirichlet"`` partitioning; default 0.5.
    lognormal_sigma : float
        Spread of the client sizes of the ``"lognormal"`` partitioning; default
        1.0.
    """

    classes_per_client: int
    dirichlet_alpha: float
    lognormal_sigma: float


def load_dataset(
    name: str,
    num_partitions: int,
    *,
    partitioning: str = "iid",
    seed: int = 0,
    samples_per_client: int = 100,
    synthetic_alpha: float = 1.0,
    synthetic_beta: float = 1.0,
    synthetic_iid: bool = False,
    regression_dimension: int = 10,
    regression_rho: float = 0.001,
    **partition_options: Unpack[PartitionOptions],
) -> FederatedSplit:
    """A named data set split over ``num_partitions`` clients, offline.

    Memoized: every simulated ClientApp call asks for the same split, and gets
    the same object back (treat its tensors as read-only). The same arguments
    give the same data on every run. Options that a data set does not use are
    ignored, so one run configuration can carry them all.

    Parameters
    ----------
    name : str
        ``"synthetic"``: FedProx Synthetic(``synthetic_alpha``,
        ``synthetic_beta``), or Synthetic-IID with ``synthetic_iid``;
        ``"synthetic-iid"`` and ``"synthetic-1-1"`` are those two settings
        whatever the ``synthetic_*`` options (see
        :func:`~flwr_importance.tasks.generators.synthetic_fedprox`).
        ``"isfedavg-regression"``: ``samples_per_client`` samples per agent in
        dimension ``regression_dimension``, ``optimum`` for the risk with
        ``regression_rho`` (see
        :func:`~flwr_importance.tasks.generators.isfedavg_regression`).
        ``"isfedavg-logistic"``: agent sizes uniform in
        ``[samples_per_client / 5, samples_per_client]`` (see
        :func:`~flwr_importance.tasks.generators.isfedavg_logistic`).
        ``"digits"``: scikit-learn's 1,797 8x8 digits, pixels scaled to
        ``[0, 1]``, input shape ``(1, 8, 8)``, a stratified 20% test split and
        the 1,437 training images split by ``partitioning``.
    num_partitions : int
        Number of clients (devices, agents).
    partitioning : str
        How ``"digits"`` is split, one of
        :data:`~flwr_importance.tasks.partitioning.PARTITIONINGS` (see
        :func:`~flwr_importance.tasks.partitioning.partition_indices`). The
        generated data sets are split by construction, one generating model per
        client, and ignore it (checked and logged).
    seed : int
        Seed of the generator, of the test split and of the partitioner.
    samples_per_client : int
        ISFedAvg data sets: ``N_k`` (regression) or the largest ``N_k``
        (logistic).
    synthetic_alpha, synthetic_beta, synthetic_iid
        Settings of ``"synthetic"``.
    regression_dimension, regression_rho
        Dimension and regularization weight of ``"isfedavg-regression"``; train
        with ``Objective("regression", l2=regression_rho)`` for the MSD against
        ``optimum`` to be meaningful.
    **partition_options
        ``classes_per_client``, ``dirichlet_alpha``, ``lognormal_sigma``: see
        :class:`PartitionOptions`.

    Returns
    -------
    FederatedSplit
        ``num_partitions`` non-empty client partitions and the test set.

    Raises
    ------
    ValueError
        For an unknown name or partitioning, or invalid options.
    """
    if name not in DATASET_NAMES:
        raise ValueError(
            f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)} "
            "(image data sets from the Hub: load_hub_dataset)"
        )
    # Checked for every data set, also the generated ones that ignore it.
    split_options = _SplitOptions(
        num_partitions, partitioning, seed, **partition_options
    )
    if name == "synthetic-iid":
        synthetic_iid = True
    elif name == "synthetic-1-1":
        synthetic_alpha, synthetic_beta, synthetic_iid = 1.0, 1.0, False
    if name == "digits":
        return _cached_digits(split_options)
    return _generate(
        name,
        num_partitions,
        partitioning,
        seed,
        samples_per_client,
        float(synthetic_alpha),
        float(synthetic_beta),
        bool(synthetic_iid),
        regression_dimension,
        float(regression_rho),
    )


# Few distinct splits live in one process (one per run configuration); a handful
# of slots keeps a parameter sweep in one process from recomputing them.
_CACHE_SLOTS = 8


@functools.lru_cache(maxsize=_CACHE_SLOTS)
# One BLAS thread: the per-client products are small, and a threaded OpenBLAS
# product never returns if another thread of the process forks meanwhile
# (OpenBLAS's fork handler stops its worker threads). Flower's simulation starts
# the ServerApp thread, which builds the data for central evaluation, while Ray
# forks its processes in the same process: the run hung.
@threadpool_limits.wrap(limits=1, user_api="blas")
def _generate(
    name: str,
    num_partitions: int,
    partitioning: str,
    seed: int,
    samples_per_client: int,
    synthetic_alpha: float,
    synthetic_beta: float,
    synthetic_iid: bool,
    regression_dimension: int,
    regression_rho: float,
) -> FederatedSplit:
    """One of the generated data sets, memoized on the options it uses.

    See :func:`load_dataset`.
    """
    if partitioning != "iid":
        logger.info(
            "dataset %r is split by construction (one generating model per client); "
            "partitioning=%r is ignored",
            name,
            partitioning,
        )
    if name == "isfedavg-regression":
        return isfedavg_regression(
            num_partitions,
            samples_per_agent=samples_per_client,
            dimension=regression_dimension,
            rho=regression_rho,
            seed=seed,
        )
    if name == "isfedavg-logistic":
        return isfedavg_logistic(
            num_partitions, max_samples_per_agent=samples_per_client, seed=seed
        )
    return synthetic_fedprox(
        num_partitions,
        alpha=synthetic_alpha,
        beta=synthetic_beta,
        iid=synthetic_iid,
        seed=seed,
    )


@dataclass(frozen=True)
class _SplitOptions:
    """How a labelled training set is split over clients: a memoization key.

    The arguments of :func:`~flwr_importance.tasks.partitioning.partition_indices`
    but the labels. Both loaders build it from their arguments,
    ``_SplitOptions(num_partitions, partitioning, seed, **partition_options)``:
    the one place that holds the defaults of :class:`PartitionOptions` and checks
    them all. An unknown keyword is a :class:`TypeError`, fewer than one client
    or an unknown partitioning a :class:`ValueError`; the float options are made
    floats (a run configuration may give ``1`` for ``1.0``).
    """

    num_partitions: int
    partitioning: str
    seed: int
    classes_per_client: int = 2
    dirichlet_alpha: float = 0.5
    lognormal_sigma: float = 1.0

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {self.num_partitions}")
        for option in ("dirichlet_alpha", "lognormal_sigma"):
            # Frozen: object.__setattr__ is how a dataclass normalizes a field.
            object.__setattr__(self, option, float(getattr(self, option)))
        if self.partitioning not in PARTITIONINGS:
            raise ValueError(
                f"unknown partitioning {self.partitioning!r}; "
                f"valid: {', '.join(PARTITIONINGS)}"
            )

    def client_indices(self, labels: np.ndarray) -> list[np.ndarray]:
        """Each client's indices into ``labels``, by :func:`partition_indices`."""
        return partition_indices(
            labels,
            self.num_partitions,
            self.partitioning,
            seed=self.seed,
            classes_per_client=self.classes_per_client,
            dirichlet_alpha=self.dirichlet_alpha,
            lognormal_sigma=self.lognormal_sigma,
        )


@functools.lru_cache(maxsize=_CACHE_SLOTS)
def _cached_digits(split_options: _SplitOptions) -> FederatedSplit:
    """Scikit-learn's 8x8 digits, split over clients (memoized)."""
    from sklearn.datasets import load_digits  # on first use, see top

    digits = load_digits()
    # Pixel intensities are 0..16.
    images = (digits.images / 16.0).astype(np.float32)[:, np.newaxis]
    labels = digits.target.astype(np.int64)
    return _split_arrays(
        *_hold_out_test(images, labels, split_options.seed),
        num_classes=10,
        split_options=split_options,
    )


def _hold_out_test(
    images: np.ndarray, labels: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A stratified ``TEST_FRACTION`` of labelled images held out for testing.

    Parameters
    ----------
    images : np.ndarray
        The images, one per row.
    labels : np.ndarray
        Their labels, the strata.
    seed : int
        Seed of the split.

    Returns
    -------
    tuple of np.ndarray
        Training images, training labels, test images and test labels.
    """
    from sklearn.model_selection import train_test_split  # on first use, see top

    train_index, test_index = train_test_split(
        np.arange(len(labels)),
        test_size=TEST_FRACTION,
        stratify=labels,
        random_state=seed,
    )
    return (
        images[train_index],
        labels[train_index],
        images[test_index],
        labels[test_index],
    )


def _split_arrays(
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    *,
    num_classes: int,
    split_options: _SplitOptions,
) -> FederatedSplit:
    """Partition labelled ``(n, C, H, W)`` images into a :class:`FederatedSplit`."""
    client_indices = split_options.client_indices(train_labels)
    features = torch.from_numpy(train_images)
    targets = torch.from_numpy(train_labels)
    index_tensors = [torch.from_numpy(indices) for indices in client_indices]
    return FederatedSplit(
        partitions=tuple(
            ClientData(features[indices], targets[indices]) for indices in index_tensors
        ),
        test=ClientData(torch.from_numpy(test_images), torch.from_numpy(test_labels)),
        task="classification",
        input_shape=tuple(train_images.shape[1:]),
        num_outputs=num_classes,
    )


@dataclass(frozen=True)
class _HubSpec:
    """Where a Hub data set lives and what its columns are called."""

    hub_id: str
    image_column: str
    label_column: str
    num_classes: int
    has_test_split: bool


_HUB_DATASETS = {
    "mnist": _HubSpec("ylecun/mnist", "image", "label", 10, True),
    "fashion_mnist": _HubSpec(
        "zalando-datasets/fashion_mnist", "image", "label", 10, True
    ),
    "cifar10": _HubSpec("uoft-cs/cifar10", "img", "label", 10, True),
    "femnist": _HubSpec("flwrlabs/femnist", "image", "character", 62, False),
}
HUB_DATASET_NAMES = tuple(_HUB_DATASETS)


def load_hub_dataset(
    name: str,
    num_partitions: int,
    partitioning: str = "iid",
    seed: int = 0,
    **partition_options: Unpack[PartitionOptions],
) -> FederatedSplit:
    """An image data set from the Hugging Face Hub, split like ``"digits"``.

    Needs a network (or a local Hugging Face cache of the data set); nothing in
    the tests or the default runs calls it. The data set is fetched with
    ``flwr_datasets.FederatedDataset``, pixels are scaled to ``[0, 1]`` as
    ``(C, H, W)``, and the train split is partitioned by
    :func:`~flwr_importance.tasks.partitioning.partition_indices` with the same
    options as :func:`load_dataset`. FEMNIST has no test split: a stratified 20%
    of it is held out (its writers are not used as clients).

    Parameters
    ----------
    name : str
        One of :data:`HUB_DATASET_NAMES`: ``"mnist"`` (``ylecun/mnist``),
        ``"fashion_mnist"`` (``zalando-datasets/fashion_mnist``), ``"cifar10"``
        (``uoft-cs/cifar10``), ``"femnist"`` (``flwrlabs/femnist``).
    num_partitions : int
        Number of clients.
    partitioning : str
        As in :func:`load_dataset`.
    seed : int
        Seed of the partitioning (and of FEMNIST's test split).
    **partition_options
        As in :func:`load_dataset`: see :class:`PartitionOptions`.

    Returns
    -------
    FederatedSplit
        Classification data.

    Raises
    ------
    ValueError
        For an unknown name or partitioning, or fewer than one client.
    RuntimeError
        When the data set cannot be fetched: no network, or Hugging Face offline
        mode without a cached copy.
    """
    if name not in _HUB_DATASETS:
        raise ValueError(
            f"unknown Hub dataset {name!r}; valid names: {', '.join(HUB_DATASET_NAMES)}"
        )
    split_options = _SplitOptions(
        num_partitions, partitioning, seed, **partition_options
    )
    from flwr_datasets import FederatedDataset  # on first use, see top

    spec = _HUB_DATASETS[name]
    try:
        # The partitioner given here is unused: partition_indices splits the data.
        federated = FederatedDataset(dataset=spec.hub_id, partitioners={"train": 1})
        train = federated.load_split("train")
        test = federated.load_split("test") if spec.has_test_split else None
    except OSError as error:  # ConnectionError, offline mode, missing cache
        raise RuntimeError(
            f"could not fetch {spec.hub_id!r} from the Hugging Face Hub: "
            f"load_hub_dataset needs a network connection (or a cached copy); "
            f"use load_dataset('digits', ...) offline. Cause: {error}"
        ) from error
    train_images, train_labels = _images_and_labels(train, spec)
    if test is None:
        train_images, train_labels, test_images, test_labels = _hold_out_test(
            train_images, train_labels, seed
        )
    else:
        test_images, test_labels = _images_and_labels(test, spec)
    return _split_arrays(
        train_images,
        train_labels,
        test_images,
        test_labels,
        num_classes=spec.num_classes,
        split_options=split_options,
    )


def _images_and_labels(split: Dataset, spec: _HubSpec) -> tuple[np.ndarray, np.ndarray]:
    """``float32`` ``(n, C, H, W)`` images in ``[0, 1]`` and ``int64`` labels."""
    table = split.with_format("numpy")
    images = np.asarray(table[spec.image_column], dtype=np.float32) / 255.0
    # Grayscale images come as (n, H, W), colour ones as (n, H, W, C).
    images = images[:, np.newaxis] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(images), np.asarray(table[spec.label_column], np.int64)

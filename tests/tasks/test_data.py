"""Generated and offline data sets, and every partitioning of the digits."""

from __future__ import annotations

import os
import threading
import time

import datasets
import huggingface_hub.constants
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from flwr_importance.tasks import (
    DATASET_NAMES,
    PARTITIONINGS,
    FederatedSplit,
    Objective,
    build_model,
    load_dataset,
    load_hub_dataset,
    partition_indices,
    set_weights,
)
from flwr_importance.tasks.partitioning import lognormal_partition_sizes

DIGIT_LABELS = load_digits().target


def label_histograms(split: FederatedSplit) -> np.ndarray:
    """Per-client label frequencies, one row per client."""
    counts = np.stack(
        [
            np.bincount(part.y.numpy(), minlength=split.num_outputs)
            for part in split.partitions
        ]
    )
    return counts / counts.sum(axis=1, keepdims=True)


def mean_label_skew(split: FederatedSplit) -> float:
    """Mean total-variation distance of client label mixes from the pooled one."""
    histograms = label_histograms(split)
    pooled = np.bincount(
        torch.cat([part.y for part in split.partitions]).numpy(),
        minlength=split.num_outputs,
    )
    pooled = pooled / pooled.sum()
    return float(0.5 * np.abs(histograms - pooled).sum(axis=1).mean())


def assert_same_split(first: FederatedSplit, second: FederatedSplit) -> None:
    for a, b in zip(
        (*first.partitions, first.test), (*second.partitions, second.test), strict=True
    ):
        assert torch.equal(a.x, b.x)
        assert torch.equal(a.y, b.y)


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_deterministic_by_seed_and_memoized(name: str) -> None:
    first = load_dataset(name, 12, seed=3)
    assert load_dataset(name, 12, seed=3) is first
    other = load_dataset(name, 12, seed=4)
    assert not torch.equal(first.test.x[:5], other.test.x[:5])
    assert len(first.partitions) == 12
    assert all(len(part) > 0 for part in first.partitions)
    for part in (*first.partitions, first.test):
        assert part.x.dtype == torch.float32
        assert part.x.shape[1:] == first.input_shape
        expected = torch.int64 if first.task == "classification" else torch.float32
        assert part.y.dtype == expected


def test_generators_are_reproducible_without_the_cache() -> None:
    from flwr_importance.tasks.generators import synthetic_fedprox

    first = synthetic_fedprox(5, alpha=1.0, beta=1.0, iid=False, seed=0)
    assert_same_split(
        first, synthetic_fedprox(5, alpha=1.0, beta=1.0, iid=False, seed=0)
    )


def test_generating_data_survives_forks_from_another_thread() -> None:
    """Flower's simulation builds the ServerApp's data while Ray forks processes.

    A threaded OpenBLAS product under way when another thread forks never
    returns (the fork handler stops OpenBLAS's threads): the run hung.
    """
    finished = threading.Event()

    def generate() -> None:
        # Fresh seeds: not memoized, so each one generates (about 0.3 s).
        for seed in range(1_000, 1_003):
            load_dataset("synthetic", 300, seed=seed)
        finished.set()

    threading.Thread(target=generate, daemon=True).start()
    deadline = time.monotonic() + 60
    while not finished.is_set() and time.monotonic() < deadline:
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
    assert finished.is_set()


def test_synthetic_shapes_sizes_and_heterogeneity() -> None:
    split = load_dataset("synthetic-1-1", 30)
    assert split.input_shape == (60,)
    assert split.num_outputs == 10
    assert split.task == "classification"
    sizes = split.partition_sizes
    # floor(lognormal) + 50 per device, of which ceil(20%) are held out.
    assert sizes.min() >= 40
    assert len(set(sizes.tolist())) > 20
    total = sizes.sum() + len(split.test)
    assert len(split.test) == pytest.approx(0.2 * total, rel=0.05)
    iid = load_dataset("synthetic-iid", 30)
    assert mean_label_skew(split) > 2 * mean_label_skew(iid)
    assert mean_label_skew(iid) < 0.15


def test_synthetic_aliases() -> None:
    assert_same_split(
        load_dataset("synthetic-1-1", 6, seed=1),
        load_dataset("synthetic", 6, seed=1, synthetic_alpha=1.0, synthetic_beta=1.0),
    )
    assert_same_split(
        load_dataset("synthetic-iid", 6, seed=1),
        load_dataset("synthetic", 6, seed=1, synthetic_iid=True),
    )
    same_features = load_dataset("synthetic", 6, seed=1, synthetic_beta=0.0)
    assert not torch.equal(
        same_features.partitions[0].x,
        load_dataset("synthetic-1-1", 6, seed=1).partitions[0].x,
    )


def test_regression_shapes_and_optimum() -> None:
    split = load_dataset("isfedavg-regression", 40, samples_per_client=100)
    assert split.task == "regression"
    assert split.input_shape == (10,)
    assert split.num_outputs == 1
    assert split.partition_sizes.tolist() == [100] * 40
    assert len(split.test) == 40 * 20
    # Normal equations of (1/K) sum_k (1/N_k) sum_n (d - u w)^2 + rho ||w||^2.
    dimension, rho = 10, 0.001
    lhs = rho * np.eye(dimension)
    rhs = np.zeros(dimension)
    for part in split.partitions:
        u = part.x.double().numpy()
        d = part.y.double().numpy()
        lhs += u.T @ u / len(u) / 40
        rhs += u.T @ d / len(u) / 40
    assert split.optimum is not None
    (optimum,) = split.optimum
    assert optimum.shape == (1, dimension)
    np.testing.assert_allclose(optimum[0], np.linalg.solve(lhs, rhs), rtol=1e-9)
    # The optimum's parameter order is the linear model's.
    model = build_model("linear", split.input_shape, 1, seed=0)
    set_weights(model, list(split.optimum))


def test_regression_agents_differ_in_gradient_size() -> None:
    split = load_dataset("isfedavg-regression", 60)
    assert split.optimum is not None
    model = build_model("linear", split.input_shape, 1, seed=0)
    set_weights(model, list(split.optimum))
    objective = Objective("regression", l2=0.001)
    # At the optimum only the gradient noise is left, which importance sampling
    # can exploit only if it differs between agents.
    mean_norms = np.array(
        [
            float(objective.per_sample_grad_norms(model, part.x, part.y).mean())
            for part in split.partitions
        ]
    )
    assert mean_norms.max() > 20 * mean_norms.min()
    assert np.median(mean_norms) > 0


def test_regression_dimension_and_rho_options() -> None:
    split = load_dataset(
        "isfedavg-regression",
        5,
        samples_per_client=30,
        regression_dimension=3,
        regression_rho=10.0,
    )
    assert split.input_shape == (3,)
    assert split.partition_sizes.tolist() == [30] * 5
    assert split.optimum is not None
    unregularized = load_dataset(
        "isfedavg-regression",
        5,
        samples_per_client=30,
        regression_dimension=3,
        regression_rho=0.0,
    )
    assert unregularized.optimum is not None
    # A heavy ridge shrinks the optimum.
    assert np.linalg.norm(split.optimum[0]) < np.linalg.norm(unregularized.optimum[0])


def test_logistic_shapes_sizes_and_non_iid() -> None:
    split = load_dataset("isfedavg-logistic", 100, samples_per_client=100)
    assert split.input_shape == (2,)
    assert split.num_outputs == 2
    sizes = split.partition_sizes
    assert sizes.min() >= 20
    assert sizes.max() <= 100
    assert len(set(sizes.tolist())) > 30
    # Features in different regions: many agents see (almost) one class.
    majority_share = label_histograms(split).max(axis=1)
    assert (majority_share > 0.9).mean() > 0.3
    # The test labels come from one linear model through the origin.
    classifier = LogisticRegression(C=1e6, fit_intercept=False, max_iter=1000)
    classifier.fit(split.test.x.numpy(), split.test.y.numpy())
    assert classifier.score(split.test.x.numpy(), split.test.y.numpy()) > 0.99


def test_digits_split() -> None:
    split = load_dataset("digits", 10)
    assert split.input_shape == (1, 8, 8)
    assert split.num_outputs == 10
    assert split.partition_sizes.sum() == 1437
    assert len(split.test) == 360
    assert float(split.test.x.min()) >= 0.0
    assert float(split.test.x.max()) == 1.0
    # Stratified: every digit is about 10% of the test set.
    test_counts = np.bincount(split.test.y.numpy(), minlength=10)
    assert test_counts.min() >= 35
    assert test_counts.max() <= 37
    pooled = torch.cat([part.x for part in split.partitions] + [split.test.x])
    digits = load_digits()
    expected = torch.from_numpy((digits.images / 16.0).astype(np.float32))
    # Every image appears exactly once across the clients and the test set.
    assert sorted(map(tuple, pooled.reshape(-1, 64).tolist())) == sorted(
        map(tuple, expected.reshape(-1, 64).tolist())
    )


def assert_each_sample_once(indices: list[np.ndarray], num_samples: int) -> None:
    assert all(len(part) > 0 for part in indices)
    np.testing.assert_array_equal(
        np.sort(np.concatenate(indices)), np.arange(num_samples)
    )


def classes_per_client(indices: list[np.ndarray]) -> list[int]:
    return [len(np.unique(DIGIT_LABELS[part])) for part in indices]


def test_iid_partitioning() -> None:
    indices = partition_indices(DIGIT_LABELS, 10, "iid", seed=0)
    assert_each_sample_once(indices, len(DIGIT_LABELS))
    sizes = [len(part) for part in indices]
    assert max(sizes) - min(sizes) <= 1
    assert min(classes_per_client(indices)) == 10


@pytest.mark.parametrize("classes", [1, 2, 3])
def test_pathological_partitioning_has_k_classes_per_client(classes: int) -> None:
    indices = partition_indices(
        DIGIT_LABELS, 30, "pathological", seed=0, classes_per_client=classes
    )
    assert_each_sample_once(indices, len(DIGIT_LABELS))
    assert classes_per_client(indices) == [classes] * 30


def test_pathological_one_class_for_100_clients_is_ten_clients_per_digit() -> None:
    split = load_dataset(
        "digits", 100, partitioning="pathological", classes_per_client=1
    )
    client_digits = [int(part.y.unique().item()) for part in split.partitions]
    assert np.bincount(client_digits, minlength=10).tolist() == [10] * 10
    assert split.partition_sizes.sum() == 1437


@pytest.mark.parametrize(("alpha", "single_class_share"), [(0.001, 0.9), (0.01, 0.7)])
def test_dirichlet_with_tiny_alpha_terminates_with_no_empty_client(
    alpha: float, single_class_share: float
) -> None:
    indices = partition_indices(
        DIGIT_LABELS, 100, "dirichlet", seed=0, dirichlet_alpha=alpha
    )
    assert_each_sample_once(indices, len(DIGIT_LABELS))
    assert np.mean(np.array(classes_per_client(indices)) == 1) > single_class_share


def test_dirichlet_skew_follows_alpha() -> None:
    def skew(alpha: float) -> float:
        split = load_dataset(
            "digits", 10, partitioning="dirichlet", dirichlet_alpha=alpha
        )
        return mean_label_skew(split)

    assert skew(0.1) > skew(1.0) > skew(100.0)
    assert skew(100.0) < 0.1


def coefficient_of_variation(sizes: np.ndarray) -> float:
    return float(sizes.std() / sizes.mean())


def test_lognormal_partitioning_sizes() -> None:
    cvs = []
    for sigma in (0.25, 1.0, 2.0):
        indices = partition_indices(
            DIGIT_LABELS, 50, "lognormal", seed=0, lognormal_sigma=sigma
        )
        assert_each_sample_once(indices, len(DIGIT_LABELS))
        sizes = np.array([len(part) for part in indices])
        assert len(set(sizes.tolist())) > 5
        cvs.append(coefficient_of_variation(sizes))
    assert cvs[0] < cvs[1] < cvs[2]
    assert cvs[0] > 0.1


@given(
    total=st.integers(1, 5000),
    clients=st.integers(1, 300),
    sigma=st.floats(0.0, 6.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_lognormal_sizes_sum_to_total_with_one_each(
    total: int, clients: int, sigma: float, seed: int
) -> None:
    clients = min(clients, total)
    sizes = lognormal_partition_sizes(
        total, clients, sigma, np.random.default_rng(seed)
    )
    assert sizes.sum() == total
    assert sizes.min() >= 1
    assert len(sizes) == clients


def test_label_sorted_partitioning() -> None:
    num_clients = 20
    indices = partition_indices(DIGIT_LABELS, num_clients, "label-sorted", seed=0)
    shard = len(DIGIT_LABELS) // num_clients
    assert [len(part) for part in indices] == [shard] * num_clients
    used = np.concatenate(indices)
    assert len(np.unique(used)) == shard * num_clients
    # A contiguous shard of sorted labels, shorter than any class: <= 2 classes.
    assert max(classes_per_client(indices)) <= 2
    split = load_dataset("digits", num_clients, partitioning="label-sorted")
    assert split.partition_sizes.tolist() == [1437 // num_clients] * num_clients


@pytest.mark.parametrize("partitioning", PARTITIONINGS)
def test_every_partitioning_is_deterministic(partitioning: str) -> None:
    def draw(seed: int) -> list[np.ndarray]:
        return partition_indices(DIGIT_LABELS, 15, partitioning, seed=seed)

    for a, b in zip(draw(1), draw(1), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(draw(1), draw(2), strict=True))


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="digits"):
        load_dataset("imagenet", 10)
    with pytest.raises(ValueError, match="label-sorted"):
        load_dataset("digits", 10, partitioning="by-writer")
    with pytest.raises(ValueError, match="label-sorted"):
        partition_indices(DIGIT_LABELS, 10, "by-writer", seed=0)
    with pytest.raises(ValueError, match="num_partitions"):
        partition_indices(DIGIT_LABELS[:5], 10, "iid", seed=0)
    with pytest.raises(ValueError, match="mnist"):
        load_hub_dataset("imagenet", 10)


def test_both_loaders_check_the_split_options_alike() -> None:
    # One place checks them: a misspelt option, no client or an unknown
    # partitioning fail in both loaders, the Hub one before any download.
    for load in (load_dataset, load_hub_dataset):
        name = "digits" if load is load_dataset else "mnist"
        with pytest.raises(TypeError, match="classes_per_clients"):
            load(name, 10, classes_per_clients=3)  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="num_partitions"):
            load(name, 0)
        with pytest.raises(ValueError, match="label-sorted"):
            load(name, 10, partitioning="by-writer")
    with pytest.raises(ValueError, match="num_partitions"):
        load_dataset("synthetic", 0)
    with pytest.raises(TypeError):
        load_hub_dataset("mnist", 10, "iid", 0, 2)  # type: ignore[call-arg]


def test_partition_options_default_and_normalize() -> None:
    split = load_dataset("digits", 10, partitioning="dirichlet")
    assert (
        load_dataset("digits", 10, partitioning="dirichlet", dirichlet_alpha=0.5)
        is split
    )
    # An integer from a run configuration asks for the same split as its float.
    assert_same_split(
        load_dataset("digits", 10, partitioning="dirichlet", dirichlet_alpha=1),
        load_dataset("digits", 10, partitioning="dirichlet", dirichlet_alpha=1.0),
    )


def test_generated_data_sets_ignore_the_partitioning() -> None:
    assert_same_split(
        load_dataset("isfedavg-logistic", 8, partitioning="pathological"),
        load_dataset("isfedavg-logistic", 8, partitioning="iid"),
    )


def test_hub_data_set_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline mode in the environment and in the already imported libraries, so
    # that nothing can reach the network.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RuntimeError, match="needs a network"):
        load_hub_dataset("mnist", 10)

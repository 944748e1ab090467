"""Generated federated data sets.

FedProx Synthetic(alpha, beta), ISFedAvg's two, and a Gaussian mixture over
clients of log-normal sizes (FedSampling's scale).

Each client (device, agent) has its own generating model, so the split over
clients is part of the generator. All draws come from one
``numpy.random.Generator`` seeded by ``seed``: the same arguments give the same
data on every machine.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from flwr_importance.tasks.splits import ClientData, FederatedSplit
from flwr_importance.tasks.training import TaskKind

# Share of every client's generated samples held out for the pooled test set.
TEST_FRACTION = 0.2

SYNTHETIC_DIMENSION = 60
SYNTHETIC_CLASSES = 10

# ISFedAvg regression: how agents differ (the paper does not say; importance
# sampling needs agents that differ in gradient size, docs/methods.md §1). The
# feature scale multiplies both the curvature (by its square) and the gradient;
# its spread is kept moderate so the
# paper's step size 0.01 stays stable on one sample of the steepest agent
# (2 * 0.01 * dimension * scale^2 < 2 for every scale below ~3). The noise level
# sets the gradient noise at the optimum and spreads over two orders of magnitude.
REGRESSION_FEATURE_LOG_STD = 0.3
REGRESSION_NOISE_MEDIAN = 0.5
REGRESSION_NOISE_LOG_STD = 1.0

# ISFedAvg logistic: per-agent feature means ~ N(0, LOGISTIC_MEAN_STD^2 I) (wide
# enough that about 40% of the agents see over 90% of one class), feature
# standard deviations ~ U[LOGISTIC_STD_RANGE], agent models within
# LOGISTIC_MODEL_DRIFT_STD of the shared one ("do not drift too far apart").
LOGISTIC_DIMENSION = 2
LOGISTIC_MEAN_STD = 1.5
LOGISTIC_STD_RANGE = (0.5, 1.5)
LOGISTIC_MODEL_DRIFT_STD = 0.1

# Gaussian mixture: class means ~ N(0, MIXTURE_SEPARATION^2 I) in MIXTURE_DIMENSION
# dimensions, unit-variance features around them (about 70% accuracy for the
# best linear classifier at 10 classes: room to see a method fall short).
MIXTURE_DIMENSION = 20
MIXTURE_SEPARATION = 0.6


def synthetic_fedprox(
    num_devices: int, *, alpha: float, beta: float, iid: bool, seed: int
) -> FederatedSplit:
    """FedProx's Synthetic(alpha, beta) and Synthetic-IID (Li et al., MLSys 2020).

    Device ``k`` holds ``n_k = floor(lognormal(4, 2)) + 50`` samples (the power
    law of the FedProx generator) ``x ~ N(v_k, Sigma)`` in dimension 60 with
    ``Sigma = diag(j^-1.2)``, labelled ``y = argmax(W_k^T x + b_k)`` over 10
    classes. Non-IID: ``u_k ~ N(0, alpha^2)``, ``W_k, b_k ~ N(u_k, 1)``
    entrywise (model heterogeneity), ``B_k ~ N(0, beta^2)``, ``v_k ~ N(B_k, 1)``
    entrywise (feature heterogeneity); alpha and beta are standard deviations,
    as in the reference generator. Note that ``u_k`` shifts every logit of a
    sample by the same amount, so alpha does not change the labels (for one
    seed, Synthetic(0, beta) and Synthetic(1, beta) label alike); the devices'
    labelling functions differ because each draws its own ``W_k``. This is the
    reference generator's behaviour, kept for comparability. IID: one ``W, b ~
    N(0, 1)`` and one feature mean ``v ~ N(0, 1)`` shared by all devices, so
    every device samples the same distribution (alpha and beta are unused). A
    random 20% of every device is held out; the pooled hold-outs are the test
    set.

    Parameters
    ----------
    num_devices : int
        Number of devices (clients); FedProx uses 30.
    alpha, beta : float
        Model and feature heterogeneity (>= 0).
    iid : bool
        Generate Synthetic-IID instead.
    seed : int
        Generator seed.

    Returns
    -------
    FederatedSplit
        Classification, input shape ``(60,)``, 10 outputs.
    """
    if alpha < 0 or beta < 0:
        raise ValueError(f"need alpha, beta >= 0, got {alpha}, {beta}")
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, num_devices).astype(np.int64) + 50
    feature_std = np.arange(1, SYNTHETIC_DIMENSION + 1) ** -0.6  # sqrt of j^-1.2
    model_means = rng.normal(0, alpha, num_devices)
    feature_mean_means = rng.normal(0, beta, num_devices)
    shared_weights = rng.normal(0, 1, (SYNTHETIC_DIMENSION, SYNTHETIC_CLASSES))
    shared_bias = rng.normal(0, 1, SYNTHETIC_CLASSES)
    shared_feature_mean = rng.normal(0, 1, SYNTHETIC_DIMENSION)
    devices = []
    for size, model_mean, feature_mean_mean in zip(
        sizes, model_means, feature_mean_means, strict=True
    ):
        if iid:
            weights, bias, feature_mean = (
                shared_weights,
                shared_bias,
                shared_feature_mean,
            )
        else:
            weights = rng.normal(
                model_mean, 1, (SYNTHETIC_DIMENSION, SYNTHETIC_CLASSES)
            )
            bias = rng.normal(model_mean, 1, SYNTHETIC_CLASSES)
            feature_mean = rng.normal(feature_mean_mean, 1, SYNTHETIC_DIMENSION)
        features = feature_mean + feature_std * rng.standard_normal(
            (size, SYNTHETIC_DIMENSION)
        )
        labels = np.argmax(features @ weights + bias, axis=1)
        num_train = size - _num_test(size)
        devices.append(
            (
                (features[:num_train], labels[:num_train]),
                (features[num_train:], labels[num_train:]),
            )
        )
    return _assemble(devices, "classification", SYNTHETIC_CLASSES)


def isfedavg_regression(
    num_agents: int,
    *,
    samples_per_agent: int,
    dimension: int,
    rho: float,
    seed: int,
) -> FederatedSplit:
    """The ISFedAvg regression (Rizk et al., eq. 30-35), with heterogeneous agents.

    Agent ``k`` has ``d = u w* + v`` with ``w* ~ N(0, I)`` shared, row vectors
    ``u ~ N(0, s_k^2 I)`` and noise ``v ~ N(0, sigma_k^2)``. The agents differ in
    gradient size through log-normal feature scales ``s_k = exp(0.3 z)`` and noise
    levels ``sigma_k = 0.5 exp(z')`` (``z, z' ~ N(0, 1)``); the paper leaves this
    unspecified. The test set pools ``ceil(0.2 N_k)`` fresh samples per agent.

    ``optimum`` is the minimizer ``w^o`` of the global risk
    ``(1/K) sum_k [(1/N_k) sum_n (d_n - u_n w)^2 + rho ||w||^2]`` over the
    training data (eq. 33): ``(R_u + rho I) w^o = (1/K) sum_k (1/N_k) sum_n u_n^T
    d_n`` with ``R_u = (1/K) sum_k (1/N_k) sum_n u_n^T u_n`` (eq. 34), which
    equals eq. 33's ``R_u w* + r_uv`` since ``d = u w* + v``. It is computed in
    float64 from the float32 data the clients hold, as the ``(1, dimension)``
    weight of the ``"linear"`` model. Use ``Objective("regression", l2=rho)``.

    Parameters
    ----------
    num_agents : int
        ``K`` (300 in the paper).
    samples_per_agent : int
        ``N_k`` (100 in the paper).
    dimension : int
        Dimension of ``w`` (not given in the paper).
    rho : float
        Regularization weight of the risk (0.001 in the paper).
    seed : int
        Generator seed.

    Returns
    -------
    FederatedSplit
        Regression, input shape ``(dimension,)``, 1 output, with ``optimum``.
    """
    if samples_per_agent < 1 or dimension < 1 or rho < 0:
        raise ValueError(
            f"need samples_per_agent, dimension >= 1 and rho >= 0; got "
            f"{samples_per_agent}, {dimension}, {rho}"
        )
    rng = np.random.default_rng(seed)
    true_weights = rng.standard_normal(dimension)
    feature_scales = np.exp(
        REGRESSION_FEATURE_LOG_STD * rng.standard_normal(num_agents)
    )
    noise_stds = REGRESSION_NOISE_MEDIAN * np.exp(
        REGRESSION_NOISE_LOG_STD * rng.standard_normal(num_agents)
    )
    num_test = _num_test(samples_per_agent)
    devices = []
    for feature_scale, noise_std in zip(feature_scales, noise_stds, strict=True):
        total = samples_per_agent + num_test
        features = feature_scale * rng.standard_normal((total, dimension))
        targets = features @ true_weights + noise_std * rng.standard_normal(total)
        # The optimum must be that of the data the clients hold, so round first.
        features = features.astype(np.float32)
        targets = targets.astype(np.float32)
        devices.append(
            (
                (features[:samples_per_agent], targets[:samples_per_agent]),
                (features[samples_per_agent:], targets[samples_per_agent:]),
            )
        )
    covariance = np.zeros((dimension, dimension))
    cross_correlation = np.zeros(dimension)
    for (features, targets), _ in devices:
        agent_features = features.astype(np.float64)
        covariance += agent_features.T @ agent_features / len(agent_features)
        cross_correlation += (
            agent_features.T @ targets.astype(np.float64) / len(agent_features)
        )
    optimum = np.linalg.solve(
        covariance / num_agents + rho * np.eye(dimension),
        cross_correlation / num_agents,
    )
    return _assemble(devices, "regression", 1, optimum=(optimum.reshape(1, dimension),))


def isfedavg_logistic(
    num_agents: int, *, max_samples_per_agent: int, seed: int
) -> FederatedSplit:
    """The ISFedAvg logistic-regression data (Rizk et al., eq. 36).

    Agent ``k`` holds ``N_k ~ U{ceil(max/5), ..., max}`` samples (``[20, 100]``
    for the paper's 100) with 2-D features ``h ~ N(mu_k, sigma_k^2 I)``,
    ``mu_k ~ N(0, 1.5^2 I)``, ``sigma_k ~ U[0.5, 1.5]``, and labels ``sign(h^T w*_k)``
    mapped to classes ``{-1 -> 0, +1 -> 1}``, where the agent models ``w*_k =
    w* + N(0, 0.1^2 I)`` stay close to a shared ``w* ~ N(0, I)``. The features of
    the non-IID agents sit in different regions, so most agents see mostly one
    class. The test set pools ``ceil(0.2 N_k)`` fresh samples per agent,
    labelled by the shared ``w*``: it measures how well the federation recovers
    the common model, on which a linear classifier can reach 0% error.

    Parameters
    ----------
    num_agents : int
        ``K`` (100 in the paper).
    max_samples_per_agent : int
        Largest ``N_k`` (100 in the paper).
    seed : int
        Generator seed.

    Returns
    -------
    FederatedSplit
        Classification, input shape ``(2,)``, 2 outputs.
    """
    if max_samples_per_agent < 1:
        raise ValueError(
            f"need max_samples_per_agent >= 1, got {max_samples_per_agent}"
        )
    rng = np.random.default_rng(seed)
    shared_model = rng.standard_normal(LOGISTIC_DIMENSION)
    sizes = rng.integers(
        math.ceil(max_samples_per_agent / 5),
        max_samples_per_agent,
        size=num_agents,
        endpoint=True,
    )
    devices = []
    for size in sizes:
        agent_model = shared_model + LOGISTIC_MODEL_DRIFT_STD * rng.standard_normal(
            LOGISTIC_DIMENSION
        )
        feature_mean = rng.normal(0, LOGISTIC_MEAN_STD, LOGISTIC_DIMENSION)
        feature_std = rng.uniform(*LOGISTIC_STD_RANGE)
        num_test = _num_test(size)
        features = feature_mean + feature_std * rng.standard_normal(
            (size + num_test, LOGISTIC_DIMENSION)
        )
        train_features, test_features = features[:size], features[size:]
        devices.append(
            (
                (train_features, (train_features @ agent_model > 0).astype(np.int64)),
                (test_features, (test_features @ shared_model > 0).astype(np.int64)),
            )
        )
    return _assemble(devices, "classification", 2)


def lognormal_mixture(
    num_clients: int,
    *,
    mean_size: float,
    sigma: float,
    num_classes: int = 10,
    label_concentration: float = 0.5,
    seed: int,
) -> FederatedSplit:
    """A Gaussian-mixture classification over clients of log-normal sizes.

    The setting of FedSampling (Qi et al., "FedSampling: a better sampling
    strategy for federated learning", IJCAI 2023, Section 4.1), generated:
    client ``k`` holds ``n_k = max(1, round(exp(m + sigma z)))`` training
    samples, ``z ~ N(0, 1)``, with ``m = ln(mean_size) - sigma^2 / 2`` so that
    ``E[n_k] = mean_size`` before rounding. Its labels follow its own class
    proportions ``~ Dirichlet(label_concentration)`` (non-IID: a few large
    clients hold a large share of some classes), and a sample of class ``c``
    is ``x ~ N(mu_c, I)`` in dimension 20 with shared class means
    ``mu_c ~ N(0, 0.6^2 I)``. Each client also draws ``ceil(0.2 n_k)`` test
    samples the same way; the pooled test set therefore follows the pooled
    training distribution, the one centralized training fits.

    Parameters
    ----------
    num_clients : int
        Number of clients ``|C| >= 1``.
    mean_size : float
        Mean client size (> 0); the pooled training set holds about
        ``num_clients * mean_size`` samples.
    sigma : float
        Standard deviation of the log sizes (>= 0; the paper's imbalance knob,
        4 in its main setting).
    num_classes : int (default: 10)
        Number of classes (>= 2).
    label_concentration : float (default: 0.5)
        Dirichlet concentration of each client's class proportions (> 0);
        smaller is more skewed.
    seed : int
        Generator seed.

    Returns
    -------
    FederatedSplit
        Classification, input shape ``(20,)``, ``num_classes`` outputs.

    Raises
    ------
    ValueError
        For a parameter out of range.
    """
    if num_clients < 1 or not mean_size > 0 or not sigma >= 0:
        raise ValueError(
            f"need num_clients >= 1, mean_size > 0, sigma >= 0; got {num_clients}, "
            f"{mean_size}, {sigma}"
        )
    if num_classes < 2 or not label_concentration > 0:
        raise ValueError(
            f"need num_classes >= 2 and label_concentration > 0; got {num_classes}, "
            f"{label_concentration}"
        )
    rng = np.random.default_rng(seed)
    log_mean = math.log(mean_size) - sigma**2 / 2
    sizes = np.maximum(1, np.rint(rng.lognormal(log_mean, sigma, num_clients)))
    class_means = rng.normal(
        0, MIXTURE_SEPARATION, (num_classes, MIXTURE_DIMENSION)
    ).astype(np.float32)
    proportions = rng.dirichlet(np.full(num_classes, label_concentration), num_clients)
    devices = []
    for size, client_proportions in zip(
        sizes.astype(np.int64), proportions, strict=True
    ):
        total = size + _num_test(size)
        labels = rng.choice(num_classes, size=total, p=client_proportions)
        features = class_means[labels] + rng.standard_normal(
            (total, MIXTURE_DIMENSION), dtype=np.float32
        )
        devices.append(
            (
                (features[:size], labels[:size]),
                (features[size:], labels[size:]),
            )
        )
    return _assemble(devices, "classification", num_classes)


DeviceArrays = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _num_test(num_samples: int) -> int:
    """``TEST_FRACTION`` of ``num_samples``, rounded up: a client's test share."""
    return math.ceil(TEST_FRACTION * num_samples)


def _assemble(
    devices: list[DeviceArrays],
    task: TaskKind,
    num_outputs: int,
    optimum: tuple[np.ndarray, ...] | None = None,
) -> FederatedSplit:
    """A :class:`FederatedSplit` from per-client ``((x, y), (x_test, y_test))``."""
    target_dtype = torch.int64 if task == "classification" else torch.float32

    def to_client_data(features: np.ndarray, targets: np.ndarray) -> ClientData:
        return ClientData(
            torch.as_tensor(features, dtype=torch.float32),
            torch.as_tensor(targets, dtype=target_dtype),
        )

    partitions = tuple(to_client_data(*train) for train, _ in devices)
    test = to_client_data(
        np.concatenate([test[0] for _, test in devices]),
        np.concatenate([test[1] for _, test in devices]),
    )
    return FederatedSplit(
        partitions=partitions,
        test=test,
        task=task,
        input_shape=tuple(partitions[0].x.shape[1:]),
        num_outputs=num_outputs,
        optimum=optimum,
    )

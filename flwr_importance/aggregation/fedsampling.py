"""FedSampling's server update (Qi et al., IJCAI 2023, Algorithm 1, line 18).

The rest of Algorithm 1 is sampling, in :mod:`flwr_importance.sampling`: the
private size estimate (:mod:`~flwr_importance.sampling.privacy`) and the
clients' Bernoulli data sampling (:mod:`~flwr_importance.sampling.fedsampling`).
The paper's size-weighted client sampling baseline (Section 4.3) is MD
sampling: :func:`flwr_importance.sampling.md_sample`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_importance.aggregation import weighted_sum


def server_update(
    model: NDArray[np.floating],
    client_updates: Sequence[NDArray[np.floating]],
    server_lr: float,
) -> NDArray[np.float64]:
    """``Theta - eta * sum_c G_c`` (Algorithm 1, line 18).

    **Decision** (docs/methods.md): the sign is descent. The paper writes
    ``Theta + eta sum G`` with ``G`` meaning an update; here every client sends
    ``G_c = (1/K) sum_{s in S_c} g_s``, a gradient, so ``sum_c G_c`` estimates
    the mean gradient over ``K`` uniformly drawn samples and the step descends.

    Parameters
    ----------
    model : NDArray
        The flattened model ``Theta`` the clients' gradients were taken at.
    client_updates : Sequence[NDArray]
        The received ``G_c``, flattened like ``model``; none is fine (the model
        is returned unchanged).
    server_lr : float
        Learning rate ``eta > 0``.

    Returns
    -------
    NDArray[np.float64]
        The new flattened model.

    Examples
    --------
    >>> model = np.array([1.0, 1.0])
    >>> updates = [np.array([0.5, 0.0]), np.array([0.5, 1.0])]
    >>> server_update(model, updates, server_lr=0.1).tolist()
    [0.9, 0.9]
    """
    if not (np.isfinite(server_lr) and server_lr > 0):
        raise ValueError(f"server_lr must be positive and finite, got {server_lr}")
    current = np.array(model, dtype=np.float64)
    if not client_updates:
        return current
    step = weighted_sum(client_updates, np.full(len(client_updates), server_lr))
    if step.shape != current.shape:
        raise ValueError(f"updates of shape {step.shape}, model of {current.shape}")
    return current - step

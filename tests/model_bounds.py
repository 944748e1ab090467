"""How far a run under SecAgg+ may drift from the same run without it.

The documented tolerance (docs/privacy.md) for FedSampling: the server's
step ``eta sum_c G_c`` is off by less than ``eta n 2c/Q`` in every
coordinate (``n`` nodes, ``c = clipping-range``, ``Q = quantization-range``),
so after round 1 the two models differ by less than that in every
coordinate, and after round ``t``, while a server step is non-expansive, by
less than ``t eta n 2c/Q sqrt(d)`` in Euclidean norm (``d`` parameters).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from flwr_importance.aggregation.secure_sum import secure_sum_error_bound

#: A round's global model: its arrays in order.
Model = Sequence[np.ndarray]


def fedsampling_step_bound(run_config: Mapping[str, object], num_nodes: int) -> float:
    """``eta n 2c/Q``: the bound on each coordinate of one round's step error."""
    server_lr = float(str(run_config["fedsampling-server-lr"]))
    return server_lr * secure_sum_error_bound(
        num_nodes,
        float(str(run_config["clipping-range"])),
        int(str(run_config["quantization-range"])),
    )


def drift_beyond_bounds(
    secure: Sequence[Model], plain: Sequence[Model], step_bound: float
) -> list[str]:
    """Where the secure run's models leave the documented tolerance (empty: nowhere).

    Also flags a comparison that proves nothing: equal initial models are
    required, and the first round must move the model by far more than the
    bound.
    """

    def flat(model: Model) -> np.ndarray:
        return np.concatenate(
            [np.asarray(array, np.float64).ravel() for array in model]
        )

    if len(secure) != len(plain) or len(plain) < 2:
        return [f"{len(secure)} secure and {len(plain)} plain models"]
    differences = [flat(s) - flat(p) for s, p in zip(secure, plain, strict=True)]
    problems = []
    if differences[0].any():
        problems.append("the initial models differ")
    if not np.abs(flat(plain[1]) - flat(plain[0])).max() > 100 * step_bound:
        problems.append("round 1 barely moved the model: nothing is compared")
    if not np.abs(differences[1]).max() < step_bound:
        problems.append(
            f"round 1: {np.abs(differences[1]).max():.3g} >= {step_bound:.3g}"
        )
    sqrt_d = math.sqrt(differences[0].size)
    for server_round, difference in enumerate(differences[1:], start=1):
        norm, bound = np.linalg.norm(difference), server_round * step_bound * sqrt_d
        if not norm < bound:
            problems.append(f"round {server_round}: norm {norm:.3g} >= {bound:.3g}")
    return problems

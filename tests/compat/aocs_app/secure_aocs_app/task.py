"""A deterministic least-squares task: a NumPyClient with a few full-batch steps.

Each partition's data depends on its partition id only, and training has no
randomness, so a node's update depends only on the model it receives: the
secure and the plain runs differ only by SecAgg+'s quantization.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context
from flwr.client import Client, NumPyClient
from flwr.common import NDArrays, Scalar

#: Features of the linear model (plus a bias).
NUM_FEATURES = 4
#: Full-batch gradient steps a fit takes, and their step size.
LOCAL_STEPS = 3
LOCAL_LR = 0.1


def partition(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The partition's features and targets (sizes and scales vary by id)."""
    rng = np.random.default_rng(1000 + partition_id)
    size = 10 + 15 * partition_id
    x = rng.normal(0.0, 1.0 + 0.2 * partition_id, (size, NUM_FEATURES))
    truth = np.arange(1.0, NUM_FEATURES + 1.0) * (1 + partition_id % 3)
    return x, x @ truth + rng.normal(0.0, 0.1, size)


def initial_model() -> NDArrays:
    """Weights and bias at zero (float64)."""
    return [np.zeros(NUM_FEATURES), np.zeros(1)]


class LeastSquaresClient(NumPyClient):
    """Full-batch gradient descent on the mean squared error."""

    def __init__(self, partition_id: int) -> None:
        self.x, self.y = partition(partition_id)

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """``LOCAL_STEPS`` steps from ``parameters``; the train loss before them."""
        weights, bias = (np.array(array, dtype=np.float64) for array in parameters)
        loss = float(np.mean((self.x @ weights + bias - self.y) ** 2))
        for _ in range(LOCAL_STEPS):
            residual = self.x @ weights + bias - self.y
            weights = weights - LOCAL_LR * 2 * self.x.T @ residual / len(self.y)
            bias = bias - LOCAL_LR * 2 * residual.mean(keepdims=True)
        return [weights, bias], len(self.y), {"train_loss": loss}


def client_fn(context: Context) -> Client:
    """The node's client, on its partition."""
    return LeastSquaresClient(int(context.node_config["partition-id"])).to_client()

"""The ClientApp: Flower's NumPyClient quickstart client, kept as it is.

``FlowerClient`` and ``client_fn`` are the project's own. Every method of
flwr-importance that needs only sizes, update norms and losses from the
clients (MD, clustered sampling, OCS, AOCS, Power-of-Choice) runs on them
through one wrapped line at the end, which passes FedAvg's calls through
unchanged: one ClientApp serves every method of the run.
"""

from __future__ import annotations

from logging import INFO

import torch
from flwr.app import Context
from flwr.client import Client, ClientApp, NumPyClient
from flwr.common import NDArrays, Scalar
from flwr.common.logger import log
from torch import nn
from torch.utils.data import DataLoader

# isort: off
# --8<-- [start:md-client,clustered-client,ocs-client,aocs-client,power-of-choice-client]  # noqa: E501
from flwr_importance import compat

# --8<-- [end:md-client,clustered-client,ocs-client,aocs-client,power-of-choice-client]
# isort: on
from quickstart_legacy.task import Net, get_weights, load_data, set_weights, test, train


class FlowerClient(NumPyClient):
    """The project's client: local training and validation of the CNN."""

    def __init__(
        self,
        net: nn.Module,
        trainloader: DataLoader,
        valloader: DataLoader,
        local_epochs: int,
        learning_rate: float,
        partition_id: int,
    ) -> None:
        self.net = net
        self.trainloader = trainloader
        self.valloader = valloader
        self.local_epochs = local_epochs
        self.learning_rate = learning_rate
        self.partition_id = partition_id
        self.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Train the received model on the partition; the trained weights."""
        set_weights(self.net, parameters)
        train_loss = train(
            self.net,
            self.trainloader,
            self.local_epochs,
            self.learning_rate,
            self.device,
        )
        num_examples = len(self.trainloader.dataset)  # type: ignore[arg-type]
        log(
            INFO,
            "legacy-example fit: partition %d, %d examples",
            self.partition_id,
            num_examples,
        )
        return get_weights(self.net), num_examples, {"train_loss": train_loss}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Validate the received model on the partition's validation set."""
        set_weights(self.net, parameters)
        loss, accuracy = test(self.net, self.valloader, self.device)
        num_examples = len(self.valloader.dataset)  # type: ignore[arg-type]
        return loss, num_examples, {"accuracy": accuracy}


def client_fn(context: Context) -> Client:
    """The node's client on its partition."""
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config["num-partitions"])
    trainloader, valloader = load_data(partition_id, num_partitions)
    return FlowerClient(
        Net(),
        trainloader,
        valloader,
        int(context.run_config["local-epochs"]),
        float(context.run_config["learning-rate"]),
        partition_id,
    ).to_client()


# The size-sampling methods ask each node its sample count before any fit.
# --8<-- [start:md-client,clustered-client,power-of-choice-client]
def train_size(context: Context) -> int:
    """The partition's number of training images, asked before any ``fit``."""
    partition_id = int(context.node_config["partition-id"])
    trainloader, _ = load_data(partition_id, int(context.node_config["num-partitions"]))
    return len(trainloader.dataset)  # type: ignore[arg-type]


# --8<-- [end:md-client,clustered-client,power-of-choice-client]


# Every method's calls reach FlowerClient through this one line (FedAvg's
# pass through unchanged). Without num_examples the wrapper would learn a
# node's size by one more fit, from get_parameters, which this client lacks.
# --8<-- [start:md-client,clustered-client,ocs-client,aocs-client,power-of-choice-client]  # noqa: E501
app = ClientApp(
    client_fn=compat.importance_client_fn(client_fn, num_examples=train_size)
)
# --8<-- [end:md-client,clustered-client,ocs-client,aocs-client,power-of-choice-client]

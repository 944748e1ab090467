"""``strategy = "fedavg"``: FedAvg, the uniform-sampling baseline, on shared draws.

The simulation's FedAvg (and FedProx, :mod:`simulations.methods.fedprox`) is
the benchmark's common-random-numbers baseline, always: Flower's own
``FedAvg``, except that each round's clients come from
:func:`flwr_importance.sampling.uniform_client_set` (``K`` distinct nodes,
uniformly, from a generator derived from the run's ``seed`` and the round).
The distribution is Flower's; only the generator differs, and that makes a
method that does not choose its clients (FOLB without replacement) train the
*same* nodes each round as these baselines within a seed. Flower's draws come
from Python's global ``random``, which any other code in the process moves.

The ClientApp side draws each node's local work per round from its seed and the
round (:func:`round_local_work`), so every method sees the same work too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flwr_importance.aggregation.server_optimizers import (
    OptimizerState,
    ServerOptimizer,
    check_server_optimizer,
)
from flwr_importance.clientapps import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    server_round_of,
)
from flwr_importance.clientapps.local_task import (
    make_evaluate_handler,
    make_train_handler,
)
from flwr_importance.protocol import SERVER_ROUND
from flwr_importance.sampling.schedule import uniform_client_set
from flwr_importance.strategies.arrays import optimizer_step
from flwr_importance.strategies.messages import connected_nodes
from flwr_importance.tasks import random_local_steps
from simulations.config import ExperimentConfig
from simulations.methods import uniform_sampling

#: Stream of the per-round epoch draws in a node's ``(seed, round, stream)``
#: generator, apart from the one its mini-batches and step counts come from.
EPOCHS_STREAM = 1


class ScheduledFedAvg(FedAvg):
    """Flower's ``FedAvg`` choosing its nodes with ``uniform_client_set``.

    The benchmark's common-random-numbers baseline: only the node choice of
    ``configure_train`` differs from Flower's (same sample size, same wait for
    ``min_available_nodes``, same messages), so that strategies given the same
    ``seed`` train the same nodes each round.

    With a ``server_optimizer``, FedAvg's average goes through the same
    step as the library's strategies take (``FedAdam`` and the others with
    the shared draws), so a method and its baseline differ in sampling alone.

    Parameters
    ----------
    seed : int
        Seeds the node draws (>= 0), with the round.
    server_optimizer : ServerOptimizer or None
        The server optimizer; None: FedAvg's model replacement.
    **kwargs
        Flower's ``FedAvg`` arguments.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.seed = seed
        self.server_optimizer = check_server_optimizer(server_optimizer)
        self.optimizer_state = OptimizerState()
        self.round_start: ArrayRecord | None = None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's ``configure_train`` with the round's shared uniform draw."""
        if self.fraction_train == 0.0:
            return []
        sample_size = max(
            int(len(list(grid.get_node_ids())) * self.fraction_train),
            self.min_train_nodes,
        )
        node_ids = uniform_client_set(
            connected_nodes(grid, max(self.min_available_nodes, sample_size)),
            sample_size,
            seed=self.seed,
            server_round=server_round,
            replace=False,
        )
        config[SERVER_ROUND] = server_round
        record = RecordDict(
            {self.arrayrecord_key: arrays, self.configrecord_key: config}
        )
        self.round_start = arrays
        return self._construct_messages(record, node_ids, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's average, then the server optimizer's step where there is one."""
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None or self.server_optimizer is None or not self.round_start:
            return arrays, metrics
        arrays, self.optimizer_state = optimizer_step(
            self.server_optimizer,
            self.optimizer_state,
            self.round_start,
            arrays,
            server_round,
        )
        return arrays, metrics


def build_strategy(config: ExperimentConfig, num_clients: int) -> ScheduledFedAvg:
    """``FedAvg`` sampling ``clients-per-round`` nodes on the shared schedule."""
    return ScheduledFedAvg(
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        **uniform_sampling(config, num_clients),
    )


def round_local_work(task: LocalTask, server_round: int) -> LocalTask:
    """``task`` with this round's number of local epochs drawn, if it has any.

    With ``epochs`` and ``heterogeneous_steps`` (FedProx's straggler setting:
    each device runs a uniform number of epochs in ``1..E`` each round), the
    draw comes from the node's ``seed`` and the round alone, so every method
    sees the same epochs per node and round. A task with ``local_steps`` is
    returned as it is: the ClientApp draws its steps itself.
    """
    if task.epochs is None or not task.heterogeneous_steps:
        return task
    rng = np.random.default_rng([task.seed, server_round, EPOCHS_STREAM])
    return dataclasses.replace(
        task,
        epochs=random_local_steps(task.epochs, rng),
        heterogeneous_steps=False,  # drawn: nothing left for the ClientApp to draw
    )


def with_round_local_work(
    make_handlers: Callable[[TaskFactory], Mapping[str, ClientHandler]],
) -> Callable[[TaskFactory], dict[str, ClientHandler]]:
    """A handler set whose tasks run the message's round's local work.

    The task factory sees the node's ``Context``, not the message; here each
    handler builds its factory per message, from the message's round.
    """

    def client_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
        def serve(message_type: str) -> ClientHandler:
            def handler(message: Message, context: Context) -> Message:
                server_round = server_round_of(message)

                def round_task(node_context: Context) -> LocalTask:
                    return round_local_work(task_factory(node_context), server_round)

                return make_handlers(round_task)[message_type](message, context)

            return handler

        return {
            message_type: serve(message_type)
            for message_type in make_handlers(task_factory)
        }

    return client_handlers


def _plain_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """Plain local SGD (FedProx's when the config sends ``mu``) and evaluation."""
    return {
        "train": make_train_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }


#: Plain local SGD and local evaluation, local work drawn per node and round.
client_handlers = with_round_local_work(_plain_handlers)

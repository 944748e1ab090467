"""Real client updates of a benchmark's run, every client trained from one model.

What :mod:`benchmarks.mechanism` measures samplers on: at chosen rounds ``t``
of a claim benchmark's run (its run config and seed), the global model ``w^t``
the round trains from, and every client's update ``U_i = w_i - w^t`` trained
from it (full participation at that round), its sample count ``n_i``, its loss
at ``w^t`` and its update of the round before (from ``w^{t-1}``).

Both steps run the library's real code on the in-process grid:

1. the run itself: the app's strategy for the run config
   (:func:`simulations.methods.load_method`), its ClientApp, each message
   through :class:`~flwr_importance.tooling.testing.InProcessGrid`, up to round
   ``t - 1``, keeping the global models the rounds start from;
2. full participation: Flower's ``FedAvg`` configures a train (and an
   evaluate) message for every node with ``w^t`` and round ``t``, on a fresh
   grid of the same run config served by the app's FedAvg ClientApp. A node's
   local work depends on its seed and the round only
   (``clientapps.local_task.round_generators``), so each node computes the update
   it would compute in round ``t`` of the run; the evaluate reply's ``loss`` is
   the loss a ``query.loss`` would report (``loss_query_handler`` wraps the
   same evaluate handler). An ISFedAvg run's clients train with its own
   ClientApp instead, from the messages a copy of its strategy builds when it
   selects every node (each node's ``E_k``, ``B_k``, ``p_k = 1/K``); its
   stored client probabilities at the round are kept too.

A run training several models (``strategy = "mmfl"``) gives one capture per
model, its task's run config serving the full-participation round (MMFL's
ClientApp trains model ``s`` with FedAvg's train handler on that task).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg, Strategy
from numpy.typing import NDArray

from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.isfedavg import ISFedAvg
from flwr_importance.strategies.mmfl import pack_models, unpack_models
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.methods import load_method
from simulations.methods.mmfl import model_run_configs
from simulations.task import federated_data, global_model

RunConfig = Mapping[str, bool | int | float | str]
#: The method whose ClientApp trains every client at the captured rounds.
FULL_PARTICIPATION_STRATEGY = "fedavg"


@dataclass(frozen=True, kw_only=True)
class CapturedRound:
    """Every client's update at one round, trained from the same global model.

    Attributes
    ----------
    seed : int
        The run's seed.
    server_round : int
        ``t``: the round the updates belong to (trained from ``w^t``, the
        model round ``t - 1`` produced).
    model_index : int
        Which model of a multi-model run (0 for one model).
    updates : NDArray[np.float64]
        ``U_i = w_i - w^t``, shape ``(N, d)``, rows by partition id.
    sizes : NDArray[np.int64]
        ``n_i``, shape ``(N,)``.
    losses : NDArray[np.float64]
        Each client's loss at ``w^t`` on its data, shape ``(N,)``.
    previous_updates : NDArray[np.float64] or None
        Each client's update of round ``t - 1`` (from ``w^{t-1}``), shape
        ``(N, d)``: the representative gradients clustered sampling's
        Algorithm 2 holds had every client last trained the round before;
        None where not captured.
    client_probs : NDArray[np.float64] or None
        ISFedAvg's stored client probabilities ``p_k`` at the round (sum 1),
        shape ``(N,)``; None for other runs.
    """

    seed: int
    server_round: int
    model_index: int
    updates: NDArray[np.float64]
    sizes: NDArray[np.int64]
    losses: NDArray[np.float64]
    previous_updates: NDArray[np.float64] | None = None
    client_probs: NDArray[np.float64] | None = None

    @property
    def num_clients(self) -> int:
        """``N``."""
        return int(self.sizes.size)

    @property
    def fractions(self) -> NDArray[np.float64]:
        """``d_i = n_i / sum_j n_j``, the full-participation weights."""
        return self.sizes / self.sizes.sum()

    @cached_property
    def gram(self) -> NDArray[np.float64]:
        """``G = U U^T``: ``||sum_i e_i U_i||^2 = e^T G e`` for any weights ``e``."""
        return self.updates @ self.updates.T

    @property
    def full_update(self) -> NDArray[np.float64]:
        """The full-participation update ``sum_i d_i U_i``."""
        return self.fractions @ self.updates

    @property
    def weighted_norms(self) -> NDArray[np.float64]:
        """``||d_i U_i||``, what OCS and MMFL clients' norms give the server."""
        return self.fractions * np.linalg.norm(self.updates, axis=1)


@dataclass(frozen=True)
class ClientRound:
    """One full-participation round's replies, rows by partition id."""

    updates: NDArray[np.float64]
    sizes: NDArray[np.int64]
    losses: NDArray[np.float64]


@dataclass(frozen=True)
class RunRound:
    """What the run holds when a round starts: its models and its strategy.

    Attributes
    ----------
    models : list[ArrayRecord]
        ``w^t``, one per model of the run.
    strategy : Strategy
        A copy of the run's strategy as the round finds it (its kept state,
        e.g. ISFedAvg's client probabilities).
    grid : InProcessGrid
        The run's grid (for its nodes' partitions).
    """

    models: list[ArrayRecord]
    strategy: Strategy
    grid: InProcessGrid


def run_rounds(run_config: RunConfig, rounds: Sequence[int]) -> dict[int, RunRound]:
    """The models and strategy state that rounds ``rounds`` of the run start from.

    Runs the app's strategy for ``run_config`` (seeded as the ServerApp seeds
    it) up to round ``max(rounds) - 1``; ``w^t`` is the model the run's
    evaluation sees after round ``t - 1`` (``w^1`` the initial one), and the
    strategy is copied there, its round ``t - 1`` done.

    Returns
    -------
    dict[int, RunRound]
        Per round in ``rounds``.
    """
    if not rounds or min(rounds) < 1:
        raise ValueError(f"rounds must be positive, got {list(rounds)}")
    config = ExperimentConfig.from_run_config(dict(run_config))
    num_clients = config.num_supernodes
    multi_model = config.strategy == "mmfl"
    model_configs = (
        [
            ExperimentConfig.from_run_config(each)
            for each in model_run_configs(config.run_config)
        ]
        if multi_model
        else [config]
    )
    initial = [
        ArrayRecord(global_model(each, federated_data(each, num_clients)).state_dict())
        for each in model_configs
    ]
    strategy = load_method(config.strategy).build_strategy(config, num_clients)
    grid = InProcessGrid(
        client_app, num_clients, dict(run_config), seed=config.seed, serialize=False
    )
    kept: dict[int, RunRound] = {}

    def keep(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round + 1 in rounds:
            kept[server_round + 1] = RunRound(
                unpack_models(arrays) if multi_model else [arrays],
                copy.deepcopy(strategy),
                grid,
            )
        return None

    # The ServerApp seeds Python's `random` (Flower's own sampling) so.
    random.seed(config.seed)
    strategy.start(
        grid=grid,
        initial_arrays=pack_models(initial) if multi_model else initial[0],
        num_rounds=max(rounds) - 1,
        evaluate_fn=keep,
    )
    return kept


def full_participation_round(
    run_config: RunConfig,
    arrays: ArrayRecord,
    server_round: int,
    strategy: Strategy | None = None,
) -> ClientRound:
    """Every node of ``run_config`` trains and evaluates ``arrays`` at ``server_round``.

    Flower's ``FedAvg`` (every node sampled) builds the messages, which the
    app's FedAvg ClientApp serves on a fresh in-process grid. An ISFedAvg run
    (``strategy``, its state at the round) has its own client side: a copy of
    its strategy selecting every node builds its train messages (each node's
    ``E_k`` and ``B_k``, ``p_k = 1/K``: a step not rescaled), which its
    ClientApp serves.
    """
    own_client = isinstance(strategy, ISFedAvg)
    config = {
        **run_config,
        "strategy": run_config["strategy"]
        if own_client
        else FULL_PARTICIPATION_STRATEGY,
    }
    num_clients = int(config["num-supernodes"])
    grid = InProcessGrid(
        client_app, num_clients, config, seed=int(config["seed"]), serialize=False
    )
    everyone = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=1.0,
        min_train_nodes=num_clients,
        min_evaluate_nodes=num_clients,
        min_available_nodes=num_clients,
    )
    trainer: Strategy = everyone
    if isinstance(strategy, ISFedAvg):
        trainer = copy.deepcopy(strategy)
        trainer.clients_per_round = num_clients
    trained = _by_partition(
        grid,
        grid.send_and_receive(
            trainer.configure_train(server_round, arrays, ConfigRecord(), grid)
        ),
    )
    evaluated = _by_partition(
        grid,
        grid.send_and_receive(
            everyone.configure_evaluate(server_round, arrays, ConfigRecord(), grid)
        ),
    )
    start = flatten(arrays).astype(np.float64)
    return ClientRound(
        updates=np.stack(
            [
                flatten(reply.content.array_records["arrays"]) - start
                for reply in trained
            ]
        ).astype(np.float64),
        sizes=np.array(
            [_metric(reply, "num-examples") for reply in trained], dtype=np.int64
        ),
        losses=np.array([_metric(reply, "loss") for reply in evaluated]),
    )


def client_probabilities(run_round: RunRound) -> NDArray[np.float64] | None:
    """ISFedAvg's stored ``p_k`` at the round, by partition id; None for others."""
    strategy = run_round.strategy
    if not isinstance(strategy, ISFedAvg):
        return None
    grid = run_round.grid
    by_partition = sorted(strategy.client_probs, key=grid.partition_of)
    return strategy.probability_vector(by_partition)


def _by_partition(grid: InProcessGrid, replies: Iterable[Message]) -> list[Message]:
    """The replies ordered by their node's partition id; every node must reply."""
    replies = list(replies)
    for reply in replies:
        if reply.has_error():
            raise RuntimeError(
                f"node {reply.metadata.src_node_id} failed: {reply.error.reason}"
            )
    partitions = sorted(
        grid.partition_of(reply.metadata.src_node_id) for reply in replies
    )
    if partitions != list(range(grid.num_nodes)):
        raise RuntimeError(f"{len(replies)} replies from {grid.num_nodes} nodes")
    return sorted(
        replies, key=lambda reply: grid.partition_of(reply.metadata.src_node_id)
    )


def _metric(reply: Message, key: str) -> float:
    """The reply's metric ``key`` (its one MetricRecord)."""
    value = next(iter(reply.content.metric_records.values()))[key]
    if not isinstance(value, int | float):
        raise TypeError(f"metric {key!r} is {value!r}, not a number")
    return float(value)


def capture_rounds(
    overrides: RunConfig, *, seed: int, rounds: Sequence[int], previous: bool = False
) -> list[CapturedRound]:
    """Every client's update at each of ``rounds`` of the run ``overrides``, ``seed``.

    Parameters
    ----------
    overrides : RunConfig
        The run config's overrides (a claim benchmark's setting and method).
    seed : int
        The run's seed.
    rounds : Sequence[int]
        Rounds to capture, each at least 2.
    previous : bool
        Capture round ``t - 1`` too, for :attr:`CapturedRound.previous_updates`
        (a full-participation round more per captured one).

    Returns
    -------
    list[CapturedRound]
        Per round in ``rounds`` (in order), one capture per model.
    """
    if min(rounds) < 2:
        raise ValueError(f"captured rounds must be at least 2, got {list(rounds)}")
    run_config = resolve_run_config({**overrides, "seed": seed})
    earlier = [server_round - 1 for server_round in rounds] if previous else []
    needed = sorted({*rounds, *earlier})
    run = run_rounds(run_config, needed)
    multi_model = run_config["strategy"] == "mmfl"
    model_configs = model_run_configs(run_config) if multi_model else [run_config]
    client_rounds = {
        (server_round, index): full_participation_round(
            model_config,
            run[server_round].models[index],
            server_round,
            run[server_round].strategy,
        )
        for server_round in needed
        for index, model_config in enumerate(model_configs)
    }
    return [
        CapturedRound(
            seed=seed,
            server_round=server_round,
            model_index=index,
            updates=client_rounds[server_round, index].updates,
            sizes=client_rounds[server_round, index].sizes,
            losses=client_rounds[server_round, index].losses,
            previous_updates=(
                client_rounds[server_round - 1, index].updates if previous else None
            ),
            client_probs=client_probabilities(run[server_round]),
        )
        for server_round in rounds
        for index in range(len(model_configs))
    ]

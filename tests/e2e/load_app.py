"""A load-test Flower App: every strategy in turn, on one simulation.

Starting Flower's simulation (Ray, 1,000 virtual SuperNodes) costs tens of
seconds; one run per strategy would not fit the CI budget. This ServerApp
runs, in one ``flwr run`` (or on an in-process grid: :func:`run_all`), each
strategy named in the run config's
``strategy`` key (comma-separated) for ``num-server-rounds`` rounds, through
:func:`simulations.server_app.start_single_model` (or a method's own
``start_strategy``), and writes ``<output-dir>/load.json``: per strategy and
round, the server-side seconds of ``configure_train`` and ``aggregate_train``
without the time spent waiting for clients (the query round trips some
strategies make inside ``configure_train``), and the round's wall time.

Every message the ServerApp sends carries its strategy's name as its
``group_id``; this app's ClientApp serves it with that method's handlers (the
simulation app's :func:`~simulations.client_app.dispatch`).

:func:`run_load_flwr` gives each ClientApp one CPU
(``client-resources-num-cpus=1``). With Flower's default of two, Ray runs one
ClientApp at a time on two cores with two torch threads (``OMP_NUM_THREADS``
follows the CPUs), and the tiny model's ops wait on each other's threads: a
logistic-regression step took 17-35 times longer than on one thread on the
busy two-core machine. Every method, two rounds on 1,000 nodes, then takes
about 3 minutes on two quiet cores (the methods that query every node each
round, FedSampling, OCS and MMFL, take most of it). Most of what
is left is Flower's engine: for each of the 1,000 nodes, its message pump scans
every message held in the in-memory state (2.5-4.5 us per node and message,
seconds per pass while a round's 1,000 queries are held), so a round that
reaches every node costs about 5 s (about 200 messages per second).

Used by ``tests/e2e/test_reliability_load.py`` and
``benchmarks/load.py`` through :func:`load_app_dir`.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO
from pathlib import Path
from typing import Any, cast

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from flwr_importance.tooling.launcher import ONE_CPU_PER_CLIENTAPP, flwr_run
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import dispatch
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.methods import LIBRARY_METHODS, QUERY_ACTIONS, load_method
from simulations.server_app import start_single_model, wait_for_nodes
from tests.app_variant import app_variant

NUM_NODES = 1_000
ROUNDS = 2
STRATEGIES = ("fedavg", *LIBRARY_METHODS)
#: The load run's settings: small model and data, so clients' work stays small.
LOAD_RUN_CONFIG: dict[str, bool | int | float | str] = {
    "strategy": ",".join(STRATEGIES),
    "dataset": "synthetic-iid",
    "model": "logreg",
    "partitioning": "iid",
    "samples-per-client": 20,
    "num-server-rounds": ROUNDS,
    "clients-per-round": 50,
    "local-steps": 1,
    "batch-size": 10,
    "clustered-method": "size",
    "mmfl-tasks": "synthetic-iid,synthetic-1-1",
    "num-supernodes": NUM_NODES,
}


LOAD_FILE = "load.json"

server_app = ServerApp()
client_app = ClientApp()


@dataclass
class ServerClock:
    """Per round: seconds in ``configure_train``/``aggregate_train`` and waits."""

    waiting: float = 0.0  # seconds inside the grid's send_and_receive, all told
    rounds: dict[int, dict[str, float]] = field(
        default_factory=lambda: defaultdict(dict)
    )

    def instrument(self, strategy: Strategy) -> Strategy:
        """Time ``strategy``'s ``configure_train`` and ``aggregate_train``."""
        for name in ("configure_train", "aggregate_train"):
            setattr(strategy, name, self._timed(name, getattr(strategy, name)))
        return strategy

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(server_round: int, *args: Any, **kwargs: Any) -> Any:
            start, waited = time.perf_counter(), self.waiting
            try:
                return method(server_round, *args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                # Query round trips inside configure_train are client time.
                self.rounds[server_round][name] = elapsed - (self.waiting - waited)
                self.rounds[server_round][f"{name}-wait"] = self.waiting - waited

        return timed


class TaggingGrid:
    """Forwards to ``grid``; tags messages with ``method``, times the waits."""

    def __init__(self, grid: Grid, method: str, clock: ServerClock) -> None:
        self._grid, self._method, self._clock = grid, method, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def _tagged(self, messages: Iterable[Message]) -> list[Message]:
        messages = list(messages)
        for message in messages:
            message.metadata.group_id = self._method
        return messages

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Tag, then push."""
        return self._grid.push_messages(self._tagged(messages))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Tag, send, wait (timed as client time)."""
        start = time.perf_counter()
        try:
            return list(
                self._grid.send_and_receive(self._tagged(messages), timeout=timeout)
            )
        finally:
            self._clock.waiting += time.perf_counter() - start


def run_method(
    grid: Grid, run_config: dict[str, Any], method_name: str, num_clients: int
) -> dict[str, Any]:
    """Run one method for the configured rounds; its per-round timings."""
    config = ExperimentConfig.from_run_config({**run_config, "strategy": method_name})
    method = load_method(method_name)
    clock = ServerClock()
    build = method.build_strategy
    # Instrument the strategy the method builds, wherever it builds it.
    method.build_strategy = lambda *args: clock.instrument(build(*args))  # type: ignore[method-assign]
    try:
        start_strategy = getattr(method, "start_strategy", start_single_model)
        started = time.perf_counter()
        # A stand-in for the Grid: it forwards everything else unchanged.
        tagging = cast(Grid, TaggingGrid(grid, method_name, clock))
        result = start_strategy(tagging, config, num_clients)
        wall = time.perf_counter() - started
    finally:
        method.build_strategy = build  # type: ignore[method-assign]
    rounds = {
        server_round: {
            "server_s": timing.get("configure_train", 0.0)
            + timing.get("aggregate_train", 0.0),
            **timing,
        }
        for server_round, timing in sorted(clock.rounds.items())
    }
    metrics = result.evaluate_metrics_serverapp
    final = metrics[max(metrics)] if metrics else {}
    return {
        "rounds": rounds,
        "wall_s": wall,
        "final_metrics": {key: float(value) for key, value in final.items()},  # type: ignore[arg-type]
    }


def run_all(grid: Grid, run_config: dict[str, Any], num_clients: int) -> dict[str, Any]:
    """Run every strategy the run config lists, in turn; their timings."""
    methods = [name.strip() for name in str(run_config["strategy"]).split(",")]
    results: dict[str, Any] = {"num_nodes": num_clients, "methods": {}}
    for method_name in methods:
        results["methods"][method_name] = run_method(
            grid, run_config, method_name, num_clients
        )
        log(INFO, "load: %s done", method_name)
    return results


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Run every listed strategy on the same nodes; write ``load.json``."""
    run_config = dict(context.run_config)
    results = run_all(grid, run_config, wait_for_nodes(grid))
    output_dir = Path(str(run_config["output-dir"]))
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / LOAD_FILE).write_text(json.dumps(results, indent=1))


def serve(message: Message, context: Context) -> Message:
    """Serve ``message`` with the handlers of the strategy in its ``group_id``."""
    view = Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=context.node_config,
        state=context.state,  # the node's persistent state, shared
        run_config={**context.run_config, "strategy": message.metadata.group_id},
    )
    return dispatch(message, view)


client_app.train()(serve)
client_app.evaluate()(serve)
for action in QUERY_ACTIONS:
    client_app.query(action)(serve)


def load_app_dir(destination: Path) -> Path:
    """A copy of the Flower App whose components are this module's apps."""
    return app_variant(
        destination,
        Path(__file__),
        {
            "serverapp": "tests.e2e.load_app:server_app",
            "clientapp": "tests.e2e.load_app:client_app",
        },
    )


def run_load_flwr(
    work: Path, strategies: tuple[str, ...], timeout: float, rounds: int = ROUNDS
) -> dict[str, Any]:
    """One ``flwr run`` of the load app on 1,000 virtual SuperNodes, ``rounds`` each."""
    output_dir = work / "out"
    flwr_home = work / "flwr-home"
    completed = flwr_run(
        load_app_dir(work / "app"),
        num_supernodes=NUM_NODES,
        run_config={
            **LOAD_RUN_CONFIG,
            "strategy": ",".join(strategies),
            "num-server-rounds": rounds,
            "output-dir": str(output_dir),
        },
        flwr_home=flwr_home,
        capture=True,
        timeout=timeout,
        federation_config=ONE_CPU_PER_CLIENTAPP,
    )
    if completed.returncode != 0:
        tail = completed.stdout[-4000:] + completed.stderr[-4000:]
        raise RuntimeError(f"flwr run failed ({completed.returncode}):\n{tail}")
    results: dict[str, Any] = json.loads((output_dir / LOAD_FILE).read_text())
    return results


def run_load_inprocess(strategies: tuple[str, ...], output_dir: Path) -> dict[str, Any]:
    """Every strategy in turn on an in-process grid of 1,000 nodes."""
    run_config = resolve_run_config(
        {
            **LOAD_RUN_CONFIG,
            "strategy": ",".join(strategies),
            "output-dir": str(output_dir),
        }
    )
    grid = InProcessGrid(client_app, NUM_NODES, run_config, seed=0)
    return run_all(grid, run_config, NUM_NODES)

"""End to end: every library strategy inside the examples, through a real ``flwr run``.

The quickstart-pytorch example is Flower's own app shape (its CNN, its
momentum-SGD ``train()``, its DataLoaders of ``{"img", "label"}`` batches),
one run serving every method in turn; the legacy example uses Flower's
``server_fn``/``NumPyClient`` API. Each strategy must run there to completion,
report central evaluation every round and leave nothing running.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy

from flwr_importance.clientapps.isfedavg import SAMPLE_STATE_KEY
from flwr_importance.protocol import LOSS_QUERY, SIZES_QUERY
from flwr_importance.registry import methods
from flwr_importance.tooling.launcher import processes_mentioning
from flwr_importance.tooling.testing import InProcessGrid
from tests.e2e.examples.example_runs import checked_run, run_methods

EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "examples"
QUICKSTART_DIR = EXAMPLES_DIR / "quickstart-pytorch"
LEGACY_DIR = EXAMPLES_DIR / "legacy"
ROUNDS = 2
#: The queries ``client_app.standard_queries_app`` answers.
STANDARD_QUERIES = {SIZES_QUERY, LOSS_QUERY}

#: ``(app_dir, run_config, num_supernodes) -> history.json``.
ExampleRun = Callable[[Path, dict[str, object], int], Any]

#: The quickstart's run: 10 nodes, half of them trained per round.
QUICKSTART_NODES = 10
QUICKSTART_CLIENTS_PER_ROUND = 5
#: Per method, the train metric (aggregated by the strategy, each round) that
#: only the example's own train reply gives: its ``train_loss``, or for the
#: methods whose mod turns the example's reply into an update (OCS, AOCS,
#: MMFL) the ``train-loss`` the mod copies from it. FedSampling's replies
#: carry no metric (the sizes stay private): its log line is its evidence.
EXAMPLE_TRAIN_METRIC = {
    "fedavg": "train_loss",
    "md": "train_loss",
    "clustered": "train_loss",
    "clustered-size": "train_loss",
    "power-of-choice": "train_loss",
    "ocs": "train-loss",
    "aocs": "train-loss",
    "mmfl": "train-loss",
    "isfedavg": "train_loss",
    "folb": "train_loss",
}
#: The methods whose nodes train with the example's ``task.train`` (FOLB with
#: its proximal term): together at least ``QUICKSTART_CLIENTS_PER_ROUND`` per
#: method and round. (MD, clustered sampling and Power-of-Choice draw with
#: replacement and may train fewer distinct nodes; OCS, AOCS and MMFL train
#: every node in their norm query, MMFL once per model.)
TRAIN_METHODS = [name for name in EXAMPLE_TRAIN_METRIC if name != "isfedavg"]
#: The log line of each of the example's training functions.
TRAIN_LOG = "quickstart-pytorch train:"
ISFEDAVG_TRAIN_LOG = "quickstart-pytorch train_isfedavg:"
FEDSAMPLING_TRAIN_LOG = "quickstart-pytorch train_fedsampling:"


def quickstart_module(name: str) -> ModuleType:
    """A module of the quickstart's package, imported from its folder."""
    sys.path.insert(0, str(QUICKSTART_DIR))
    try:
        return importlib.import_module(f"pytorchexample.{name}")
    finally:
        sys.path.remove(str(QUICKSTART_DIR))


def quickstart_strategies() -> list[str]:
    """The methods the quickstart's server knows (its ``METHODS``)."""
    return list(quickstart_module("server_app").METHODS)


@pytest.fixture
def run_example(tmp_path: Path) -> Iterator[ExampleRun]:
    """``(app_dir, run_config, num_supernodes) -> history``, nothing left running."""
    flwr_home = tmp_path / "flwr-home"

    def run(
        app_dir: Path, run_config: dict[str, object], num_supernodes: int
    ) -> object:
        output_dir = tmp_path / "out"
        completed = checked_run(
            app_dir,
            num_supernodes=num_supernodes,
            run_config={**run_config, "output-dir": str(output_dir)},
            flwr_home=flwr_home,
        )
        assert completed.returncode == 0
        return json.loads((output_dir / "history.json").read_text())

    yield run
    assert processes_mentioning(str(flwr_home.resolve())) == []


@pytest.mark.slow
# Every method in one run: minutes of Ray load, which beside a deployment
# starved the SuperLink (its database locked, the run failed): a heavy run.
@pytest.mark.usefixtures("heavy_run")
def test_quickstart_example_runs_every_method_in_one_run(tmp_path: Path) -> None:
    """One ``flwr run`` of every method: each round evaluated, the example's train ran.

    Checked per method: central evaluation of the initial model and after
    every round; each round's train metrics hold the example's own train
    loss (:data:`EXAMPLE_TRAIN_METRIC`); and, from the streamed ClientApp
    logs, the example's training functions ran on at least the sampled
    nodes: ``task.train`` for every method that trains with it,
    ``train_isfedavg`` for ISFedAvg and FedSampling's gradient function.
    """
    methods = quickstart_strategies()
    output, output_dir = run_methods(
        QUICKSTART_DIR,
        tmp_path,
        methods=methods,
        num_supernodes=QUICKSTART_NODES,
        run_config={
            "num-server-rounds": ROUNDS,
            "num-supernodes": QUICKSTART_NODES,
        },
    )

    rounds = [str(server_round) for server_round in range(ROUNDS + 1)]
    problems = []
    for method in methods:
        history = json.loads((output_dir / f"{method}.json").read_text())
        evaluated = history["evaluate_metrics_serverapp"]
        if sorted(evaluated, key=int) != rounds or not all(
            0.0 <= row["accuracy"] <= 1.0 for row in evaluated.values()
        ):
            problems.append(f"{method}: central evaluation {evaluated}")
        train_metric = EXAMPLE_TRAIN_METRIC.get(method)
        trained = history["train_metrics_clientapp"]
        if train_metric is not None and not (
            sorted(trained, key=int) == rounds[1:]
            and all(train_metric in row for row in trained.values())
        ):
            problems.append(f"{method}: no '{train_metric}' every round in {trained}")
    assert problems == []

    least = QUICKSTART_CLIENTS_PER_ROUND * ROUNDS
    assert output.count(TRAIN_LOG) >= least * len(TRAIN_METHODS), output[-4000:]
    assert output.count(ISFEDAVG_TRAIN_LOG) >= least, output[-4000:]
    assert output.count(FEDSAMPLING_TRAIN_LOG) >= ROUNDS, output[-4000:]


#: Under ``flwr run``: the example's own FedSampling settings. Every method on
#: the legacy API runs the example in process, through Flower's legacy server
#: loop (tests/examples/test_legacy.py), and those whose query carries
#: the model (``ClientProxy.fit``: OCS, AOCS, Power-of-Choice) run under ``flwr
#: run`` in the NumPyClient quickstart
#: (tests/e2e/examples/test_legacy_numpyclient_example.py): a Ray start per method
#: here would only repeat them.
LEGACY_STRATEGIES = ["fedsampling"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", LEGACY_STRATEGIES)
def test_legacy_example_runs_under_flwr_run(
    strategy: str, run_example: ExampleRun
) -> None:
    history = run_example(
        LEGACY_DIR,
        {"strategy": strategy, "num-server-rounds": ROUNDS, "num-supernodes": 10},
        10,
    )
    assert [row["round"] for row in history] == list(range(ROUNDS + 1))


#: The SecAgg+ example: its methods (its ``STRATEGIES``), each run with and
#: without SecAgg+ on the same seeds, and the bound on each coordinate of one
#: round's step error that the method documents (docs/privacy.md).
def test_quickstart_methods_in_one_run_do_not_share_node_state(
    tmp_path: Path,
) -> None:
    """Each method of a several-method run starts from a fresh node state.

    ISFedAvg keeps its sample probabilities and OCS its updates in
    ``context.state``; the switch to the next method drops them, so OCS never
    sees ISFedAvg's and the second ISFedAvg starts from uniform probabilities,
    as in a run of its own. In process, with the example's own apps.
    """
    server_app = quickstart_module("server_app")
    client_app = quickstart_module("client_app")
    seen: list[tuple[str, str, set[str]]] = []

    def recording(msg: Message, context: Context) -> Message:
        """The example's app, recording the node state each message finds."""
        if msg.metadata.message_type != "query." + client_app.METHOD_QUERY:
            method = client_app.current_method(context)
            seen.append((method, msg.metadata.message_type, set(context.state)))
        return client_app.app(msg, context)

    spy = ClientApp()
    spy.train()(recording)
    spy.evaluate()(recording)
    for action in ("sizes", "norm", "loss", client_app.METHOD_QUERY):
        spy.query(action)(recording)
    run_config = {
        **quickstart_defaults(),
        "strategy": "isfedavg,ocs,isfedavg",
        "num-server-rounds": 1,
        "num-supernodes": 6,
        "output-dir": str(tmp_path),
    }
    grid = InProcessGrid(spy, 6, run_config, seed=0)
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    server_app.main(grid, context)

    kept_by = {method for method, _, keys in seen if SAMPLE_STATE_KEY in keys}
    assert kept_by == {"isfedavg"}
    # ISFedAvg's first train message on each node finds no probabilities:
    # the one before the second ISFedAvg run left them, the switch dropped them.
    isfedavg_trains = [
        keys for method, kind, keys in seen if (method, kind) == ("isfedavg", "train")
    ]
    assert isfedavg_trains and not any(
        SAMPLE_STATE_KEY in keys for keys in isfedavg_trains
    )


def quickstart_defaults() -> dict[str, Any]:
    """The run config of the quickstart's ``pyproject.toml``."""
    with (QUICKSTART_DIR / "pyproject.toml").open("rb") as file:
        return dict(tomllib.load(file)["tool"]["flwr"]["app"]["config"])


def test_quickstart_example_knows_every_method() -> None:
    """Every registry method has a strategy and a ClientApp in the quickstart."""
    server_app = quickstart_module("server_app")
    client_app = quickstart_module("client_app")
    assert {spec.name for spec in methods()} <= set(server_app.METHODS)
    assert set(client_app.METHOD_APPS) <= set(server_app.METHODS)
    assert set(EXAMPLE_TRAIN_METRIC) | {"fedsampling"} == set(server_app.METHODS)
    run_config: dict[str, bool | float | int | str] = {
        "fraction-evaluate": 0.5,
        "batch-size": 32,
        "learning-rate": 0.1,
    }
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    for method in server_app.METHODS:
        assert isinstance(server_app.make_strategy(method, context), Strategy)
    # A method without a ClientApp of its own gets the standard queries' app:
    # its strategy must need nothing else of the nodes.
    specs = {spec.strategy: spec for spec in methods()}
    for method in set(server_app.METHODS) - set(client_app.METHOD_APPS):
        spec = specs[type(server_app.make_strategy(method, context))]
        assert not spec.client_handlers, method
        assert set(spec.client_queries) <= STANDARD_QUERIES, method
    with pytest.raises(ValueError, match="unknown strategy"):
        server_app.make_strategy("fedavgg", context)

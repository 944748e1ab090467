"""A plain FedAvg client under a method's strategy fails the run, naming the fix.

Every registry strategy, run in process against Flower's quickstart-shaped
ClientApp (``@app.train`` and ``@app.evaluate`` only), raises
:class:`~flwr_importance.strategies.ClientSideMissingError` naming the
method, the message type, what was missing, the client lines to add and the
section of ``docs/methods.md`` (whose heading must exist). The legacy API
does the same with a plain ``NumPyClient``. Failures of another kind, or of
only some nodes, keep the strategy dropping, logging and counting them (the
30% fault-injection runs of ``test_reliability_*.py`` stay as they were).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import NDArrays, Scalar

from flwr_importance import compat, protocol, registry
from flwr_importance.clientapps.loss import add_loss_query
from flwr_importance.clientapps.sizes import add_size_query
from flwr_importance.legacy_wire import parameters_of
from flwr_importance.registry import MethodSpec
from flwr_importance.strategies import (
    ClientSideMissingError,
    MDSampling,
    PowerOfChoice,
    pack_models,
)
from flwr_importance.strategies.replies import (
    NO_HANDLER,
    ClientSideFailedError,
    ReplyLedger,
    error_problem,
)
from flwr_importance.tooling.declarations import CannedSetup
from flwr_importance.tooling.testing import InProcessGrid
from simulations.tooling import declaration
from tests import plain_fedavg_app
from tests.compat.compat_harness import InProcessClientProxy, run_legacy
from tests.plain_fedavg_app import app as plain_app

NUM_NODES = 6
MODEL = ArrayRecord([np.ones((2, 3), np.float32), np.ones(3, np.float32)])
SETUP = CannedSetup(
    clients_per_round=3, total_size=NUM_NODES * 20, max_size=50, projection_dim=4
)
METHODS_DOC = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading's text."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def methods_doc_anchors() -> set[str]:
    """The anchors of the ``## `` sections of docs/methods.md."""
    return {
        github_anchor(line[3:])
        for line in METHODS_DOC.read_text().splitlines()
        if line.startswith("## ")
    }


def initial_model(spec: MethodSpec) -> ArrayRecord:
    return (
        pack_models([MODEL])
        if declaration(spec.name).canned[0].packed_models
        else MODEL
    )


@pytest.mark.parametrize("spec", registry.methods(), ids=lambda spec: spec.name)
def test_a_plain_fedavg_client_fails_the_run_naming_the_missing_lines(
    spec: MethodSpec, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = spec.build(**declaration(spec.name).canned[0].arguments(SETUP))
    grid = InProcessGrid(plain_app, NUM_NODES)
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(ClientSideMissingError) as raised,
    ):
        strategy.start(grid=grid, initial_arrays=initial_model(spec), num_rounds=3)
    error = raised.value
    client_side = type(strategy).client_side  # type: ignore[attr-defined]
    message = str(error)
    assert error.method == type(strategy).__name__
    assert message.startswith(f"{error.method}: ")
    assert f"'{error.message_type}'" in message
    assert error.missing in message and client_side.lines in message
    assert client_side.docs in message
    path, _, anchor = client_side.docs.partition("#")
    assert path == "docs/methods.md" and anchor in methods_doc_anchors()
    # Fails in its first round, before any model is aggregated.
    assert "[ROUND 2/3]" not in caplog.text
    # The summary of the dropped replies is logged on the way out.
    assert re.search(rf"{error.method}: \d+ replies dropped", caplog.text)
    assert f"{error.message_type}: " in caplog.text


def test_the_error_names_a_missing_handler_and_a_missing_key() -> None:
    # OCS: query.norm has no handler; ISFedAvg: train replies lack its metrics.
    for name, message_type, missing in [
        ("ocs", "query.norm", NO_HANDLER),
        ("isfedavg", "train", f"metric '{protocol.ISFEDAVG_SIGMA2}' missing"),
    ]:
        spec = registry.method(name)
        strategy = spec.build(**declaration(spec.name).canned[0].arguments(SETUP))
        with pytest.raises(ClientSideMissingError) as raised:
            strategy.start(
                grid=InProcessGrid(plain_app, NUM_NODES),
                initial_arrays=MODEL,
                num_rounds=1,
            )
        assert raised.value.message_type == message_type
        assert raised.value.missing.startswith(missing)


class PlainNumPyClient(NumPyClient):  # type: ignore[misc]
    """Flower's legacy quickstart client, without torch: fit shrinks the model."""

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        return [0.9 * values for values in parameters], 20, {"train_loss": 1.0}

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        return 1.0, 20, {}


def plain_client_fn(context: Context) -> object:
    return PlainNumPyClient().to_client()


def test_a_missing_handler_is_recognized_on_both_clientapp_kinds() -> None:
    """The error reply's reason, Message-API and legacy ``client_fn`` ClientApps."""
    legacy_app = ClientApp(client_fn=plain_client_fn)
    for app in (plain_app, legacy_app):
        grid = InProcessGrid(app, num_nodes=1)
        (node_id,) = grid.get_node_ids()
        query = Message(RecordDict(), node_id, "query.norm")
        (reply,) = grid.send_and_receive([query])
        assert reply.has_error()
        assert error_problem(reply).missing == NO_HANDLER, reply.error.reason


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        # The norm query carries the model: a fit, whose reply lacks the norm.
        ("ocs", "metric 'update-norm-0' missing"),
        # The size query is a get_properties call the client does not implement.
        ("md", NO_HANDLER),
    ],
)
def test_the_legacy_api_with_a_plain_numpy_client_fails_too(
    name: str, missing: str
) -> None:
    from flwr.server import SimpleClientManager

    grid = InProcessGrid(plain_app, NUM_NODES)
    manager = SimpleClientManager()
    for node_id in grid.get_node_ids():
        context = Context(
            run_id=grid.run.run_id,
            node_id=node_id,
            node_config={},
            state=RecordDict(),
            run_config={},
        )
        manager.register(InProcessClientProxy(context, plain_client_fn))
    strategy = compat.legacy_class(name)(
        clients_per_round=3,
        initial_parameters=parameters_of(MODEL),
    )
    with pytest.raises(ClientSideMissingError) as raised:
        run_legacy(strategy, manager, num_rounds=2)
    assert raised.value.missing.startswith(missing)
    # The fix in the legacy project's terms: its own client_fn, wrapped.
    assert "compat.importance_client_fn(client_fn)" in str(raised.value)


#: MD's size query: answered on even partitions, on odd ones the reply a
#: ClientApp without the handler sends (the same error, raised by hand).
partial_app = ClientApp()
partial_app.train()(plain_fedavg_app.train)
partial_app.evaluate()(plain_fedavg_app.evaluate)


@partial_app.query("sizes")
def half_sizes(msg: Message, context: Context) -> Message:
    if int(context.node_config["partition-id"]) % 2:
        raise ValueError("No query function registered with name 'sizes'")
    metrics = MetricRecord({protocol.NUM_EXAMPLES: plain_fedavg_app.NUM_EXAMPLES})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def test_a_partial_failure_is_dropped_logged_and_summarized(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = MDSampling(clients_per_round=3, fraction_evaluate=0.0)
    grid = InProcessGrid(partial_app, NUM_NODES)
    with caplog.at_level(logging.INFO):
        result = strategy.start(grid=grid, initial_arrays=MODEL, num_rounds=2)
    assert len(strategy.sizes) == NUM_NODES // 2
    assert not np.allclose(result.arrays.to_numpy_ndarrays()[0], 1.0)
    # Odd nodes are asked again every round: 3 dropped replies per round.
    assert "MDSampling: 6 replies dropped, by message type and reason:" in caplog.text
    assert f"query.sizes: 6 x {NO_HANDLER}" in caplog.text


def test_a_run_without_dropped_replies_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = MDSampling(clients_per_round=3, fraction_evaluate=0.0)
    grid = InProcessGrid(partial_app, 2, node_config=lambda _, n: {"partition-id": 0})
    with caplog.at_level(logging.INFO):
        strategy.start(grid=grid, initial_arrays=MODEL, num_rounds=1)
    assert "MDSampling: no reply was dropped" in caplog.text


#: Every size reply empty: what the fault-injection mod's "silent" fault sends.
empty_app = ClientApp()
empty_app.train()(plain_fedavg_app.train)


@empty_app.query("sizes")
def empty_sizes(msg: Message, context: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


def test_empty_replies_from_every_node_are_a_failure_not_a_missing_client_side(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = MDSampling(clients_per_round=3, fraction_evaluate=0.0)
    grid = InProcessGrid(empty_app, 2)
    # Nothing can train: the run stops in round 1, quoting what the nodes sent.
    with pytest.raises(ClientSideFailedError, match="first node's error: empty reply"):
        strategy.start(grid=grid, initial_arrays=MODEL, num_rounds=2)
    assert strategy.sizes == {}


#: The quickstart's app with Power-of-Choice's loss query, wired without
#: ``loss_key=``: its evaluate replies ``eval_loss``, the helper looks for ``loss``.
miswired_app = ClientApp()
miswired_app.train()(plain_fedavg_app.train)
miswired_app.evaluate()(plain_fedavg_app.evaluate)
add_size_query(miswired_app, num_examples=lambda context: plain_fedavg_app.NUM_EXAMPLES)
add_loss_query(miswired_app, plain_fedavg_app.evaluate)


def test_a_helper_wired_to_a_key_the_project_lacks_fails_the_run_naming_it() -> None:
    strategy = PowerOfChoice(clients_per_round=2, candidates=4)
    with pytest.raises(ClientSideMissingError) as raised:
        strategy.start(
            grid=InProcessGrid(miswired_app, NUM_NODES),
            initial_arrays=MODEL,
            num_rounds=2,
        )
    assert raised.value.message_type == "query.loss"
    assert "lacks ['loss']" in raised.value.missing
    assert "eval_loss" in raised.value.missing and "loss_key=" in str(raised.value)


def test_a_misconfigured_helper_on_some_nodes_only_is_dropped_not_fatal() -> None:
    problem = error_problem(
        Message(
            Error(
                2,
                f"<class 'ValueError'>:<'{protocol.CLIENT_SIDE_MISCONFIGURED}: "
                "the evaluate reply lacks ['loss']'>",
            ),
            reply_to=Message(RecordDict(), 1, "query.loss"),
        )
    )
    assert problem.missing == "the evaluate reply lacks ['loss']"
    ledger_problems = [problem, None]
    ledger = ReplyLedger("PowerOfChoice", PowerOfChoice.client_side)
    ledger.settle("query.loss", ledger_problems)  # one usable reply: no error

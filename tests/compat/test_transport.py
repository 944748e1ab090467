"""The legacy transport: lossless packing, clear errors, failing nodes left out."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.client import Client
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.strategy import FedAvg as LegacyFedAvg

from flwr_importance import compat
from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.clientapps.fedsampling import make_fedsampling_handlers
from flwr_importance.clientapps.isfedavg import make_isfedavg_handlers
from flwr_importance.clientapps.local_task import (
    make_evaluate_handler,
    make_train_handler,
)
from flwr_importance.compat.transport import reply_from_fit_res
from flwr_importance.legacy_wire import ARRAY_LAYOUT_KEY, pack_arrays, unpack_arrays
from tests.compat.compat_harness import (
    InProcessClientProxy,
    TwinFederation,
    run_legacy,
)


def test_pack_and_unpack_keep_names_order_and_values() -> None:
    update = ArrayRecord([np.arange(3.0), np.ones((2, 2), np.float32)])
    gradient = ArrayRecord([np.full(3, -1.0), np.zeros((2, 2), np.float32)])
    arrays, layout = pack_arrays({"update": update, "gradient": gradient})

    records = unpack_arrays(arrays, layout, keys=["w", "b"])

    assert json.loads(layout) == [["update", 2], ["gradient", 2]]
    assert list(records.array_records) == ["update", "gradient"]
    assert list(records.array_records["update"].keys()) == ["w", "b"]
    for name, expected in (("update", update), ("gradient", gradient)):
        for got, want in zip(
            records.array_records[name].to_numpy_ndarrays(),
            expected.to_numpy_ndarrays(),
            strict=True,
        ):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_arrays_without_layout_are_one_model_record() -> None:
    records = unpack_arrays([np.zeros(2), np.ones(1)], None)
    assert list(records.array_records) == ["arrays"]
    assert list(records.array_records["arrays"].keys()) == ["0", "1"]


@pytest.mark.parametrize(
    "layout",
    [
        '[["update", 3]]',
        '[["update", 1], ["gradient", 2]]',
        '{"update": 2}',
        "[[1, 2]]",
    ],
)
def test_a_layout_that_does_not_match_the_arrays_is_refused(layout: str) -> None:
    with pytest.raises(ValueError, match="compat-array-layout"):
        unpack_arrays([np.zeros(2), np.ones(1)], layout)


def test_a_fit_result_with_a_wrong_layout_becomes_an_error_reply() -> None:
    federation = TwinFederation({"strategy": "fedavg"}, 1)
    (node_id,) = federation.grid.get_node_ids()
    message = Message(RecordDict(), node_id, "train")
    fit_res = FitRes(
        Status(Code.OK, ""),
        ndarrays_to_parameters([np.zeros(2)]),
        0,
        {ARRAY_LAYOUT_KEY: '[["update", 2]]'},
    )

    reply = reply_from_fit_res(message, fit_res)

    assert reply.has_error()
    assert "does not cover 1" in str(reply.error.reason)
    assert reply.metadata.src_node_id == node_id


def failing_client(context: Context) -> Client:
    """A client that fails every call (a crashed or misbehaving node)."""
    raise RuntimeError(f"node {context.node_id} is broken")


@pytest.mark.parametrize(
    ("legacy_class", "arguments", "handlers"),
    [
        # The failing node's fit is lost: ISFedAvg averages the others.
        (compat.ISFedAvg, {"clients_per_round": 6, "seed": 0}, make_isfedavg_handlers),
        # Its size query (get_properties) is lost: it is not asked to train.
        (compat.FedSampling, {"samples_per_round": 64}, make_fedsampling_handlers),
    ],
    ids=["fit", "get_properties"],
)
def test_a_failing_node_is_logged_and_left_out(
    legacy_class: type[compat.LegacyStrategyAdapter],
    arguments: dict[str, int],
    handlers: Callable[[TaskFactory], Mapping[str, ClientHandler]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    federation = TwinFederation({"strategy": "fedavg", "local-steps": 2}, 6)
    manager = federation.legacy_client_manager(handlers)
    broken = sorted(manager.all())[0]
    proxy = manager.all()[broken]
    assert isinstance(proxy, InProcessClientProxy)
    proxy.client_fn = failing_client
    strategy = legacy_class(
        **arguments, min_available_nodes=1, legacy=federation.legacy_options()
    )

    with caplog.at_level(logging.WARNING, logger="flwr"):
        model = run_legacy(strategy, manager, 2)

    assert all(np.all(np.isfinite(array)) for array in model)
    assert any(f"node {broken}" in record.getMessage() for record in caplog.records)
    assert (
        max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(model, federation.initial, strict=True)
        )
        > 0
    )


def plain_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """FedAvg's handlers: what a plain legacy strategy needs."""
    return {
        "train": make_train_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }


def test_handler_client_serves_a_plain_legacy_fedavg() -> None:
    # No compat keys in the config: the model arrives as one "arrays" record,
    # and evaluation reports loss and num-examples.
    federation = TwinFederation({"strategy": "fedavg", "local-steps": 2}, 3)
    manager = federation.legacy_client_manager(plain_handlers)
    strategy = LegacyFedAvg(
        min_available_clients=3,
        min_fit_clients=3,
        min_evaluate_clients=3,
        initial_parameters=federation.legacy_options().initial_parameters,
    )
    model = run_legacy(strategy, manager, 1)
    assert (
        max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(model, federation.initial, strict=True)
        )
        > 0
    )

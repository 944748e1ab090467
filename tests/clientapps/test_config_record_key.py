"""The client helpers read the server's config under any ``configrecord_key``.

A strategy names its ConfigRecord by its ``configrecord_key``; the helpers
read the message's only ConfigRecord, whatever its name. Each check runs the
real strategy built with ``configrecord_key="cfg"`` against the ClientApp
through the in-process grid (protobuf round trips), and compares with the
default name where a silently lost setting would still give a plausible
result (FOLB's ``mu`` read as 0).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from flwr_importance.clientapps import config_number, message_config
from flwr_importance.clientapps.folb import ProximalTerm, make_folb_train_handler
from flwr_importance.protocol import (
    FOLB_GAMMA,
    FOLB_UPDATE,
    ISFEDAVG_SIGMA2,
    PROXIMAL_MU,
    SERVER_ROUND,
)
from flwr_importance.strategies import FOLB, ISFedAvg, OptimalClientSampling
from flwr_importance.strategies.arrays import flatten
from flwr_importance.tooling.testing import InProcessGrid
from tests.clientapps.quickstart_user import (
    LR,
    TRAIN_CALLS,
    assert_trained,
    initial_arrays,
    run_rounds,
)
from tests.clientapps.test_folb import client_app as folb_client_app
from tests.clientapps.test_folb import global_model
from tests.clientapps.test_isfedavg import app as isfedavg_app
from tests.clientapps.test_isfedavg import regression_task
from tests.clientapps.test_variance_reduced_user_app import NUM_NODES, make_grid

CONFIG_KEY = "cfg"
MU = 0.5


def sent_config_names(grid: InProcessGrid) -> set[str]:
    """The ConfigRecord names of every message the server sent."""
    return {
        name
        for record in grid.wire_log
        if record.direction == "to-node"
        for name in record.message().content.config_records
    }


def test_ocs_serves_kept_updates_and_the_users_train_under_another_key() -> None:
    TRAIN_CALLS.clear()
    grid = make_grid()
    strategy = OptimalClientSampling(
        clients_per_round=2, seed=0, configrecord_key=CONFIG_KEY
    )
    arrays = initial_arrays()
    result = run_rounds(strategy, grid, arrays)
    assert sent_config_names(grid) == {CONFIG_KEY}
    for server_round in (1, 2):
        metrics = result.train_metrics_clientapp[server_round]
        assert metrics["num-received"] == metrics["num-sampled"]
        assert metrics["num-sampled"] > 0  # type: ignore[operator]
    assert_trained(result, arrays)
    # KeptUpdateMod answered the train messages from the kept updates: the
    # user's function ran only in the norm queries, and read the server's lr
    # under "config", the FedAvg shape it is handed.
    assert len(TRAIN_CALLS) == 2 * NUM_NODES
    assert {call.lr for call in TRAIN_CALLS} == {LR}


def folb_replies(configrecord_key: str, proximal_mu: float) -> dict[int, Message]:
    """FOLB's train replies of one round, by partition, on the ready-made handlers."""
    grid = InProcessGrid(folb_client_app(make_folb_train_handler), 4, seed=0)
    strategy = FOLB(
        clients_per_round=4,
        proximal_mu=proximal_mu,
        seed=0,
        configrecord_key=configrecord_key,
    )
    arrays = ArrayRecord(global_model().state_dict())
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    assert {name for m in messages for name in m.content.config_records} == {
        configrecord_key
    }
    replies = grid.send_and_receive(messages)
    for reply in replies:
        assert not reply.has_error(), reply.error.reason
    return {grid.partition_of(reply.metadata.src_node_id): reply for reply in replies}


def test_folb_mu_reaches_the_loss_under_another_key() -> None:
    renamed = folb_replies(CONFIG_KEY, MU)
    default = folb_replies("config", MU)
    without_mu = folb_replies("config", 0.0)
    assert renamed.keys() == default.keys() == without_mu.keys()
    moved_by_mu = False
    for partition, reply in renamed.items():
        update = flatten(reply.content.array_records[FOLB_UPDATE])
        np.testing.assert_array_equal(
            update, flatten(default[partition].content.array_records[FOLB_UPDATE])
        )
        assert (
            reply.content.metric_records["metrics"][FOLB_GAMMA]
            == default[partition].content.metric_records["metrics"][FOLB_GAMMA]
        )
        plain = flatten(without_mu[partition].content.array_records[FOLB_UPDATE])
        moved_by_mu |= not np.allclose(update, plain)
    # The proximal term changed the local solve: mu was read, not taken as 0.
    assert moved_by_mu


def test_the_users_proximal_term_reads_mu_under_another_key() -> None:
    InProcessGrid(isfedavg_app, num_nodes=1)  # Flower's message identity
    model = global_model()
    content = RecordDict(
        {
            "model": ArrayRecord(model.state_dict()),
            CONFIG_KEY: ConfigRecord({SERVER_ROUND: 1, PROXIMAL_MU: MU}),
        }
    )
    assert ProximalTerm(model, Message(content, 7, "train")).mu == MU


def test_isfedavg_trains_under_another_key() -> None:
    grid = InProcessGrid(isfedavg_app, num_nodes=5)
    strategy = ISFedAvg(
        clients_per_round=3,
        local_steps_range=(1, 3),
        batch_size_range=(2, 4),
        fraction_evaluate=0.0,
        seed=2,
        configrecord_key=CONFIG_KEY,
    )
    initial = ArrayRecord(regression_task().model.state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=2)
    assert sent_config_names(grid) == {CONFIG_KEY}
    for server_round in (1, 2):
        assert result.train_metrics_clientapp[server_round][ISFEDAVG_SIGMA2] >= 0
    assert not np.allclose(flatten(result.arrays), flatten(initial))


def test_several_config_records_are_refused_naming_them() -> None:
    InProcessGrid(isfedavg_app, num_nodes=1)  # Flower's message identity
    content = RecordDict(
        {
            "config": ConfigRecord({SERVER_ROUND: 1}),
            CONFIG_KEY: ConfigRecord({SERVER_ROUND: 2}),
        }
    )
    message = Message(content, 7, "train")
    with pytest.raises(ValueError, match=r"2 ConfigRecords \(\['cfg', 'config'\]\)"):
        message_config(message)
    with pytest.raises(ValueError, match="ConfigRecords"):
        config_number(message, SERVER_ROUND)
    assert message_config(Message(RecordDict(), 7, "train")) == ConfigRecord()

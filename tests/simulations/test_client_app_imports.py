"""A ClientApp process imports what its message needs, and no more.

The deployment engine starts a new ClientApp process for every message, so each
import of the app's client side is paid on every message. A train message on a
generated data set, or on the digits once the node's first message has kept
its partition in the node state, needs torch and Flower, not the data-set,
partitioning and plotting libraries: this runs such messages through the
simulation app's ClientApp in fresh interpreters and checks ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

#: What a train message must not load (flwr_datasets loads matplotlib, seaborn,
#: pandas and scipy; datasets loads pyarrow; the digits come from sklearn; ray
#: is the simulation engine's).
FORBIDDEN = (
    "datasets",
    "flwr_datasets",
    "sklearn",
    "scipy",
    "matplotlib",
    "seaborn",
    "pandas",
    "pyarrow",
    "ray",
)

#: One train message to a node of 4, through the simulation app's ClientApp
#: as a SuperNode delivers it, then the loaded FORBIDDEN modules as JSON.
#: argv: dataset, file to read the node state from ("" for an empty state),
#: file to write the node state to after the message ("" for none), the module
#: names to report as a JSON list.
PROBE = """
import json, sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from flwr_importance.tooling.testing import InProcessGrid, partition_node_config
from simulations.client_app import app
from simulations.config import ExperimentConfig
from simulations.task import global_model, node_data

dataset, state_in, state_out, forbidden = sys.argv[1:5]
with open("pyproject.toml", "rb") as file:
    run_config = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
run_config.update({"dataset": dataset, "strategy": "fedavg", "local-steps": 2})
grid = InProcessGrid(app, num_nodes=4, run_config=run_config)
node_id = next(iter(grid.get_node_ids()))
state = grid.node_state(node_id)
if state_in:
    proto = ProtoRecordDict.FromString(Path(state_in).read_bytes())
    for key, record in recorddict_from_proto(proto).items():
        state[key] = record
# The node's own view, for the shapes of the model the server would send.
context = Context(
    run_id=0,
    node_id=node_id,
    node_config=partition_node_config(grid.partition_of(node_id), 4),
    state=state,
    run_config=run_config,
)
model = global_model(ExperimentConfig.from_run_config(run_config), node_data(context))
content = RecordDict(
    {
        "arrays": ArrayRecord(model.state_dict()),
        "config": ConfigRecord({"server-round": 1, "lr": 0.1}),
    }
)
message = grid.create_message(content, "train", node_id, group_id="1")
(reply,) = grid.send_and_receive([message])
assert not reply.has_error(), reply.error
assert reply.content["metrics"]["num-examples"] > 0
if state_out:
    Path(state_out).write_bytes(recorddict_to_proto(state).SerializeToString())
print(json.dumps([name for name in json.loads(forbidden) if name in sys.modules]))
"""


#: Resolves every strategy's client handlers as the ClientApp does for a message.
ALL_METHODS_PROBE = """
import json, sys
from simulations.client_app import app
from simulations.methods import available_methods, load_method
from simulations.task import local_task

for name in available_methods():
    load_method(name).client_handlers(local_task)
print(json.dumps([name for name in json.loads(sys.argv[1]) if name in sys.modules]))
"""


def forbidden_loaded_by(probe: str, *args: str) -> list[str]:
    """Run ``probe`` with ``args`` then FORBIDDEN in a new interpreter; its list."""
    completed = subprocess.run(
        [sys.executable, "-c", probe, *args, json.dumps(FORBIDDEN)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return list(json.loads(completed.stdout.splitlines()[-1]))


def loaded_by_train_message(
    dataset: str, state_in: str = "", state_out: str = ""
) -> list[str]:
    """Run one train message in a new interpreter; the FORBIDDEN modules it loaded."""
    return forbidden_loaded_by(PROBE, dataset, state_in, state_out)


def test_no_method_loads_a_data_or_plot_library_with_its_client_handlers() -> None:
    assert forbidden_loaded_by(ALL_METHODS_PROBE) == []


@pytest.mark.parametrize("dataset", ["synthetic-1-1", "isfedavg-logistic"])
def test_train_message_on_a_generated_dataset_loads_no_data_or_plot_library(
    dataset: str,
) -> None:
    assert loaded_by_train_message(dataset) == []


def test_digits_are_built_once_per_node_then_served_from_the_node_state(
    tmp_path: Path,
) -> None:
    state_file = tmp_path / "node-state.pb"
    # The node's first message builds the split (and the probe sees it do so).
    first = loaded_by_train_message("digits", state_out=str(state_file))
    assert {"sklearn", "datasets", "flwr_datasets"} <= set(first)
    # The next message, in a new process as a SuperNode starts it, does not.
    assert loaded_by_train_message("digits", state_in=str(state_file)) == []

"""The model-agnostic client helpers import no torch.

A scikit-learn, JAX or TensorFlow ClientApp uses the size, norm, loss and
private-size queries and :class:`KeptUpdateMod` on its own train and evaluate
functions; a torch-free install must be able to import them, and a torch
import would cost every ClientApp process over a second. Each module is
imported, with the names a user takes from it, in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: ``module -> names`` a model-agnostic ClientApp imports from it.
TORCH_FREE_NAMES = {
    # The package exports the helpers from their modules, loading each on
    # first use: the model-agnostic ones stay torch-free through it too.
    "flwr_importance.clientapps": [
        "ClientHandler",
        "KeptUpdateMod",
        "add_loss_query",
        "add_norm_query",
        "add_private_size_query",
        "add_size_query",
        "config_number",
        "message_config",
        "register_handlers",
        "server_round_of",
    ],
    "flwr_importance.clientapps.messages": [
        "ClientHandler",
        "arrays_reply",
        "config_flag",
        "config_number",
        "message_arrays",
        "message_config",
        "metrics_reply",
        "register_handlers",
        "server_round_of",
    ],
    "flwr_importance.clientapps.sizes": [
        "add_size_query",
        "checked_sample_count",
        "size_query_handler",
        "size_reply",
    ],
    "flwr_importance.clientapps.variance_reduced": [
        "KeptUpdateMod",
        "add_model_sizes_query",
        "add_norm_query",
        "model_update",
        "norm_query_handler",
        "update_norm",
    ],
    "flwr_importance.clientapps.loss": ["add_loss_query", "loss_query_handler"],
    "flwr_importance.clientapps.user_functions": [
        "message_for_user",
        "received_models",
        "user_reply_metrics",
    ],
    "flwr_importance.clientapps.private_sizes": [
        "add_private_size_query",
        "private_size_reply",
    ],
    # Power-of-Choice's and clustered/MD sampling's ready-made sets live here;
    # importing them must not load torch before a handler is built.
    "flwr_importance.clientapps.standard": ["method_handlers", "standard_handlers"],
    "flwr_importance.clientapps.clustered": ["make_clustered_handlers"],
    # The legacy API's wrapper of a user's own NumPyClient, on the calls'
    # conversions it shares with the ready-made (torch) handler client.
    "flwr_importance.clientapps.numpy_client": [
        "ImportanceClient",
        "importance_client_fn",
    ],
    "flwr_importance.clientapps.legacy_calls": [
        "fit_reply",
        "message_from_call",
        "reply_scalars",
    ],
}

#: Imports ``argv[1]``'s names ``argv[2:]``, registers every helper on a
#: ClientApp, prints whether torch was loaded.
PROBE = """
import importlib, json, sys
module = importlib.import_module(sys.argv[1])
for name in sys.argv[2:]:
    getattr(module, name)
print(json.dumps("torch" in sys.modules))
"""

#: Registers every model-agnostic helper around a user function, as the
#: scikit-learn example does (the three size queries each on their own app:
#: an app has one ``query.sizes``).
REGISTER_ALL = """
import json, sys
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr_importance.clientapps.loss import add_loss_query
from flwr_importance.clientapps.variance_reduced import (
    KeptUpdateMod, add_model_sizes_query, add_norm_query,
)
from flwr_importance.clientapps.private_sizes import add_private_size_query
from flwr_importance.clientapps.sizes import add_size_query

def user_function(msg, context):
    return Message(RecordDict({"metrics": MetricRecord({"loss": 1.0})}), reply_to=msg)

app = ClientApp()
app.train(mods=[KeptUpdateMod(train_loss_key="loss")])(user_function)
add_norm_query(app, user_function, train_loss_key="loss")
add_loss_query(app, user_function)
add_size_query(ClientApp(), num_examples=lambda context: 10)
add_model_sizes_query(ClientApp(), num_examples=lambda context, model_index: 10)
add_private_size_query(ClientApp(), num_examples=lambda context: 10)
print(json.dumps("torch" in sys.modules))
"""


def loads_torch(code: str, *args: str) -> bool:
    """Run ``code`` with ``args`` in a new interpreter; whether it loaded torch."""
    completed = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return bool(json.loads(completed.stdout.splitlines()[-1]))


@pytest.mark.parametrize("module", sorted(TORCH_FREE_NAMES))
def test_helper_module_imports_no_torch(module: str) -> None:
    assert not loads_torch(PROBE, module, *TORCH_FREE_NAMES[module])


def test_registering_every_helper_on_a_client_app_loads_no_torch() -> None:
    assert not loads_torch(REGISTER_ALL)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("flwr_importance.clientapps", "LocalTask"),
        ("flwr_importance.clientapps.fedsampling", "fedsampling_gradient"),
    ],
)
def test_probe_sees_torch_when_a_torch_name_is_used(module: str, name: str) -> None:
    """The probe works: the lazily loaded ``LocalTask`` and the gradients load it."""
    assert loads_torch(PROBE, module, name)

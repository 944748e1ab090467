"""Client side of every method: helpers around your own ClientApp, and ready handlers.

Each method's module has the mods, query registrations and helper functions
that meet its contract (its strategy class's ``Client contract``) from your own
``@app.train()`` function, keeping your model, DataLoader, optimizer, loss and
device; and ``make_<method>_handlers(task_factory)``, ready-made handlers built
on the same pieces for a ``TaskFactory`` (``Context -> LocalTask``):

- :mod:`.messages`: the handler type, config reading (the message's single
  ConfigRecord, whatever its name), the replies and handler registration
  every module shares (torch-free);
- :mod:`.local_task`: the ready-made handlers' plumbing: the
  :class:`LocalTask`, FedAvg/FedProx training and evaluation (torch);
- :mod:`.isfedavg`: importance-sampled mini-batches, eq. 8 steps, eq. 29, on
  the data-level sampler of :mod:`.isfedavg_sampler` (``ImportanceSampler``,
  its round settings and per-sample state; :mod:`.isfedavg` exports them);
- :mod:`.folb`: FedProx solve plus the local gradient and inexactness;
- :mod:`.fedsampling`: randomized-response sizes, the round's kept samples,
  ``G_c`` over your DataLoader and loss;
- :mod:`.private_sizes`: FedSampling's randomized-response size query alone;
- :mod:`.sizes`: the true-size query of clustered, MD and size-weighted
  sampling (:func:`~.sizes.add_size_query`);
- :mod:`.clustered`: clustered and MD sampling's handler set;
- :mod:`.variance_reduced`: OCS/AOCS/MMFL: :class:`~.variance_reduced.KeptUpdateMod`
  on your train function and the norm and size queries run on your functions;
- :mod:`.loss`: the local-loss query on your evaluate function (Power-of-Choice,
  MMFL's loss variant);
- :mod:`.user_functions`: your train or evaluate function run on one model of
  a library message (what :mod:`.variance_reduced` and :mod:`.loss` share);
- :mod:`.standard`: the ready-made client side of any registry method;
- :mod:`.legacy`: those handlers in a legacy-API ``NumPyClient``
  (``compat.handler_client_fn``);
- :mod:`.numpy_client`: your own legacy-API ``NumPyClient`` answering the
  methods' queries (``compat.importance_client_fn``);
- :mod:`.legacy_calls`: a legacy call as the message a handler expects, and
  the handler's reply as the call's result (what :mod:`.legacy` and
  :mod:`.numpy_client` share).

This package exports the helpers the docs teach, each from the module that
defines it (``from flwr_importance.clientapps import KeptUpdateMod,
add_norm_query``), with the ``LocalTask`` the ready-made handlers take.
Model-agnostic helpers import no torch, so a scikit-learn, JAX or TensorFlow
ClientApp can use them without it: :mod:`.messages`, :mod:`.sizes`,
:mod:`.private_sizes`, :mod:`.loss`, :mod:`.user_functions`,
:mod:`.variance_reduced` (its helpers; ``make_*_handlers`` load torch when
called), :mod:`.numpy_client`, :mod:`.legacy_calls` and this package itself,
which loads each exported name's module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flwr_importance.clientapps.messages import (
    ClientHandler,
    config_number,
    message_config,
    register_handlers,
    server_round_of,
)

if TYPE_CHECKING:
    from flwr_importance.clientapps.fedsampling import (
        fedsampling_gradient,
        fedsampling_reply,
        fedsampling_round,
    )
    from flwr_importance.clientapps.folb import (
        ProximalTerm,
        folb_reply,
        inexactness,
        local_gradient,
    )
    from flwr_importance.clientapps.isfedavg import (
        ImportanceSampler,
        SampleMixingLayerError,
        replace_batchnorm,
    )
    from flwr_importance.clientapps.local_task import LocalTask, TaskFactory
    from flwr_importance.clientapps.loss import add_loss_query
    from flwr_importance.clientapps.private_sizes import add_private_size_query
    from flwr_importance.clientapps.secure_aggregation import (
        importance_secaggplus_mod,
    )
    from flwr_importance.clientapps.secure_aocs import secure_aocs_mod
    from flwr_importance.clientapps.sizes import add_size_query
    from flwr_importance.clientapps.variance_reduced import (
        KeptUpdateMod,
        add_norm_query,
    )

#: The exported names loaded on first use, by the module that defines them
#: (several need torch, which this package must not import by itself).
_DEFINED_IN = {
    "KeptUpdateMod": "variance_reduced",
    "add_norm_query": "variance_reduced",
    "add_size_query": "sizes",
    "add_loss_query": "loss",
    "add_private_size_query": "private_sizes",
    "fedsampling_round": "fedsampling",
    "fedsampling_gradient": "fedsampling",
    "fedsampling_reply": "fedsampling",
    "ProximalTerm": "folb",
    "folb_reply": "folb",
    "inexactness": "folb",
    "local_gradient": "folb",
    "ImportanceSampler": "isfedavg",
    "SampleMixingLayerError": "isfedavg",
    "replace_batchnorm": "isfedavg",
    "importance_secaggplus_mod": "secure_aggregation",
    "secure_aocs_mod": "secure_aocs",
    "LocalTask": "local_task",
    "TaskFactory": "local_task",
}


def __getattr__(name: str) -> Any:
    """Load an exported name's module on first use (PEP 562)."""
    if name in _DEFINED_IN:
        module = importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ClientHandler",
    "ImportanceSampler",
    "KeptUpdateMod",
    "LocalTask",
    "ProximalTerm",
    "SampleMixingLayerError",
    "TaskFactory",
    "add_loss_query",
    "add_norm_query",
    "add_private_size_query",
    "add_size_query",
    "config_number",
    "fedsampling_gradient",
    "fedsampling_reply",
    "fedsampling_round",
    "folb_reply",
    "importance_secaggplus_mod",
    "inexactness",
    "local_gradient",
    "message_config",
    "register_handlers",
    "replace_batchnorm",
    "secure_aocs_mod",
    "server_round_of",
]

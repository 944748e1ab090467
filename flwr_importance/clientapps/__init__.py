"""Client side of every method: helpers around your own ClientApp, and ready handlers.

Each method's module has the mods, query registrations and helper functions
that meet its contract (:mod:`flwr_importance.protocol`) from your own
``@app.train()`` function, keeping your model, DataLoader, optimizer, loss and
device; and ``make_<method>_handlers(task_factory)``, ready-made handlers built
on the same pieces for a ``TaskFactory`` (``Context -> LocalTask``):

- :mod:`.messages`: the handler type, config reading (the message's single
  ConfigRecord, whatever its name), the replies and handler registration
  every module shares (torch-free);
- :mod:`.common`: the :class:`LocalTask`, FedAvg/FedProx training and
  evaluation (torch);
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
  (``compat.handler_client_fn``).

Model-agnostic helpers import no torch, so a scikit-learn, JAX or TensorFlow
ClientApp can use them without it: :mod:`.messages`, :mod:`.sizes`,
:mod:`.private_sizes`, :mod:`.loss`, :mod:`.user_functions`,
:mod:`.variance_reduced` (its helpers; ``make_*_handlers`` load torch when
called) and this package itself, whose torch-using names
(those of :mod:`.common`) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flwr_importance.clientapps.messages import (
    ClientHandler,
    config_number,
    message_config,
    register_handlers,
    server_round_of,
)

if TYPE_CHECKING:
    from flwr_importance.clientapps.common import (
        LocalTask,
        TaskFactory,
        load_global_model,
        make_evaluate_handler,
        make_train_handler,
        model_reply,
        round_generators,
        round_local_steps,
        train_round,
    )


def __getattr__(name: str) -> Any:
    """Load the torch-using names of :mod:`.common` on first use (PEP 562).

    Called only for names the package has not loaded: the exported names of
    :mod:`.messages` are imported above, the rest of ``__all__`` is
    :mod:`.common`'s.
    """
    if name in __all__:
        from flwr_importance.clientapps import common

        return getattr(common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ClientHandler",
    "LocalTask",
    "TaskFactory",
    "config_number",
    "load_global_model",
    "make_evaluate_handler",
    "make_train_handler",
    "message_config",
    "model_reply",
    "register_handlers",
    "round_generators",
    "round_local_steps",
    "server_round_of",
    "train_round",
]

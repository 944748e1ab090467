"""Client side of every method: helpers around your own ClientApp, and ready handlers.

Each method's module has the mods, query registrations and helper functions
that meet its contract (:mod:`flwr_importance.protocol`) from your own
``@app.train()`` function, keeping your model, DataLoader, optimizer, loss and
device; and ``make_<method>_handlers(task_factory)``, ready-made handlers built
on the same pieces for a ``TaskFactory`` (``Context -> LocalTask``):

- :mod:`.common`: FedAvg/FedProx training and evaluation, shared helpers;
- :mod:`.isfedavg`: importance-sampled mini-batches, eq. 8 steps, eq. 29;
- :mod:`.folb`: FedProx solve plus the local gradient and inexactness;
- :mod:`.fedsampling`: randomized-response sizes, the round's kept samples,
  ``G_c`` over your DataLoader and loss;
- :mod:`.sizes`: the true-size query of clustered, MD and size-weighted
  sampling (:func:`~.sizes.add_size_query`);
- :mod:`.clustered`: clustered and MD sampling's handler set;
- :mod:`.optimal`: OCS/AOCS/MMFL: :class:`~.optimal.KeptUpdateMod` on your
  train function and the norm, loss and size queries run on your functions.
"""

from flwr_importance.clientapps.common import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    config_number,
    load_global_model,
    make_evaluate_handler,
    make_train_handler,
    model_reply,
    register_handlers,
    round_generators,
    round_local_steps,
    server_round_of,
    train_round,
)

__all__ = [
    "ClientHandler",
    "LocalTask",
    "TaskFactory",
    "config_number",
    "load_global_model",
    "make_evaluate_handler",
    "make_train_handler",
    "model_reply",
    "register_handlers",
    "round_generators",
    "round_local_steps",
    "server_round_of",
    "train_round",
]

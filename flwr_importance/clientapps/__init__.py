"""Ready ClientApp handlers per method, and the pieces to write your own.

Handler factories take a ``TaskFactory`` (``Context -> LocalTask``) and return
``(Message, Context) -> Message`` callables to register on a ``ClientApp``:

- :mod:`.common`: FedAvg/FedProx training and evaluation, shared helpers;
- :mod:`.isfedavg`: importance-sampled mini-batches, eq. 8 steps, eq. 29;
- :mod:`.folb`: FedProx solve plus the local gradient and inexactness;
- :mod:`.fedsampling`: randomized-response sizes, Bernoulli data sampling;
- :mod:`.clustered`: the size query of clustered sampling;
- :mod:`.optimal`: OCS/MMFL norm and loss queries, kept updates.
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

"""Ready ClientApp handlers per method, and the pieces to write your own."""

from flwr_importance.clientapps.common import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    config_number,
    load_global_model,
    make_evaluate_handler,
    make_train_handler,
    model_reply,
    round_generators,
    round_local_steps,
    server_round_of,
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
    "round_generators",
    "round_local_steps",
    "server_round_of",
]

"""What every ClientApp helper shares to read and answer messages, torch-free.

The handler type, the checked reading of the server's ``config`` record and
the registration of a handler set on a ``ClientApp``. These need only Flower,
so the model-agnostic helpers built on them (:mod:`.sizes`, :mod:`.optimal`,
:mod:`.private_sizes`) serve a scikit-learn, JAX or TensorFlow ClientApp
without torch installed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

ClientHandler = Callable[[Message, Context], Message]


def config_number(message: Message, key: str, default: float | None = None) -> float:
    """A number from the message's ``config`` record, checked.

    Raises
    ------
    ValueError
        When the key is absent without a default, or its value is not a number.
    """
    config = message.content.config_records.get("config")
    value = config.get(key, default) if config is not None else default
    if value is None:
        raise ValueError(f"the server's config lacks '{key}'")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"config '{key}' must be a number, got {value!r}")
    return float(value)


def server_round_of(message: Message) -> int:
    """The ``server-round`` Flower's strategies put in the config (0 if absent)."""
    return int(config_number(message, "server-round", 0))


def register_handlers(
    app: ClientApp, handlers: Mapping[str, ClientHandler]
) -> ClientApp:
    """Register ``handlers``, keyed by message type, on ``app``.

    Keys are Flower message types: ``"train"``, ``"evaluate"``, ``"query"`` or
    ``"<category>.<action>"`` such as ``"query.norm"``.
    """
    registrars = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    for message_type, handler in handlers.items():
        category, _, action = message_type.partition(".")
        if category not in registrars:
            raise ValueError(f"unknown message category in '{message_type}'")
        register = registrars[category]
        (register(action) if action else register())(handler)
    return app

"""What every ClientApp helper shares to read and answer messages, torch-free.

The handler type, the checked reading of the server's config (the message's
single ConfigRecord, whatever the strategy's ``configrecord_key`` named it),
the replies shaped as Flower's quickstarts send them and the registration of
a handler set on a ``ClientApp``. These need only Flower, so the
model-agnostic helpers built on them (:mod:`.sizes`, :mod:`.loss`,
:mod:`.variance_reduced`, :mod:`.private_sizes`) serve a scikit-learn, JAX or
TensorFlow ClientApp without torch installed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from flwr_importance import protocol

ClientHandler = Callable[[Message, Context], Message]

#: A value a MetricRecord holds.
MetricValue = int | float | list[int] | list[float]


def message_config(message: Message) -> ConfigRecord:
    """The message's single ConfigRecord, whatever its name (empty if none).

    A strategy names its config record by its ``configrecord_key``
    (``config`` by default), so the client reads the only one there is.

    Raises
    ------
    ValueError
        When the message carries several ConfigRecords: which one holds the
        server's settings is then ambiguous.
    """
    configs = message.content.config_records
    if len(configs) > 1:
        raise ValueError(
            f"the message carries {len(configs)} ConfigRecords ({sorted(configs)}); "
            "the server's config must be the only one"
        )
    return next(iter(configs.values()), ConfigRecord())


def message_arrays(message: Message) -> ArrayRecord:
    """The model the message carries: its single ArrayRecord, whatever its name.

    Raises
    ------
    ValueError
        When the message carries no ArrayRecord or several.
    """
    arrays = message.content.array_records
    if len(arrays) != 1:
        raise ValueError(f"expected one ArrayRecord in the message, got {len(arrays)}")
    return next(iter(arrays.values()))


def config_number(message: Message, key: str, default: float | None = None) -> float:
    """A number from the message's config (:func:`message_config`), checked.

    Raises
    ------
    ValueError
        When the key is absent without a default, or its value is not a number.
    """
    value = message_config(message).get(key, default)
    if value is None:
        raise ValueError(f"the server's config lacks '{key}'")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"config '{key}' must be a number, got {value!r}")
    return float(value)


def config_flag(message: Message, key: str, default: bool | None = None) -> bool:
    """A boolean from the message's config; absent (no default) or not a bool raises."""
    value = message_config(message).get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"config '{key}' must be a boolean, got {value!r}")
    return value


def server_round_of(message: Message) -> int:
    """The ``server-round`` Flower's strategies put in the config (0 if absent)."""
    return int(config_number(message, protocol.SERVER_ROUND, 0))


def metrics_reply(message: Message, metrics: Mapping[str, MetricValue]) -> Message:
    """Reply with ``metrics`` as the one MetricRecord, named ``metrics``."""
    content = RecordDict({protocol.METRIC_RECORD: MetricRecord(dict(metrics))})
    return Message(content, reply_to=message)


def arrays_reply(
    message: Message, arrays: ArrayRecord, metrics: Mapping[str, MetricValue]
) -> Message:
    """Reply as Flower's ``FedAvg`` expects: ``arrays`` and ``metrics``.

    The model goes under ``arrays``, the metrics under ``metrics``, the
    names Flower's quickstarts use.
    """
    content = RecordDict(
        {
            protocol.ARRAY_RECORD: arrays,
            protocol.METRIC_RECORD: MetricRecord(dict(metrics)),
        }
    )
    return Message(content, reply_to=message)


def register_handlers(
    app: ClientApp, handlers: Mapping[str, ClientHandler]
) -> ClientApp:
    """Register ``handlers``, keyed by message type, on ``app``.

    Keys are Flower message types: ``"train"``, ``"evaluate"``, ``"query"`` or
    ``"<category>.<action>"`` such as ``"query.norm"``.
    """
    registrars = {
        "train": app.train,
        "evaluate": app.evaluate,
        protocol.QUERY_CATEGORY: app.query,
    }
    for message_type, handler in handlers.items():
        category, _, action = message_type.partition(".")
        if category not in registrars:
            raise ValueError(f"unknown message category in '{message_type}'")
        register = registrars[category]
        (register(action) if action else register())(handler)
    return app

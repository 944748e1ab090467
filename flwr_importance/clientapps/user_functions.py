"""The user's own train and evaluate functions, run on one model of a message.

The library's multi-model messages carry one ArrayRecord per model
(``model-<s>``, :func:`received_models`) under the strategy's record names; a
user's ``@app.train()`` or ``@app.evaluate()`` function expects Flower's
FedAvg message (the model under ``"arrays"``, the config under
``"config"``). :func:`message_for_user` reshapes the one into the other for
model ``s``, and :func:`user_reply_metrics` checks the user's reply. The query
helpers of :mod:`.variance_reduced` and :mod:`.loss` are built on these; they
need only Flower and NumPy (no torch).
"""

from __future__ import annotations

import copy

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.message import make_message

from flwr_importance import protocol
from flwr_importance.clientapps.messages import message_config

#: Where the user's handlers find the model and the config, as in the messages
#: of Flower's ``FedAvg`` (its default ``arrayrecord_key``/``configrecord_key``),
#: whatever names the strategy's own messages use.
USER_ARRAYS_KEY = protocol.ARRAY_RECORD
USER_CONFIG_KEY = protocol.CONFIG_RECORD


def received_models(message: Message) -> dict[int, ArrayRecord]:
    """The message's ArrayRecords by model index (names ``model-<s>``).

    Raises
    ------
    ValueError
        If the message carries no model or an ArrayRecord named otherwise.
    """
    models: dict[int, ArrayRecord] = {}
    for name, record in message.content.array_records.items():
        index = name.removeprefix(protocol.MODEL_RECORD_PREFIX)
        if not name.startswith(protocol.MODEL_RECORD_PREFIX) or not index.isdigit():
            raise ValueError(f"unexpected ArrayRecord '{name}' (expected model-<s>)")
        models[int(index)] = record
    if not models:
        raise ValueError("the message carries no model")
    return models


def message_for_user(
    message: Message, message_type: str, model: ArrayRecord, model_index: int
) -> Message:
    """``message`` reshaped as a FedAvg message of ``message_type`` for model ``s``.

    The model goes under ``"arrays"``, the server's config (``lr`` and the
    like, plus ``model-index``) under ``"config"``, whatever the server named
    its records. Built from the incoming message's metadata: a ClientApp
    cannot create a new message, only reply.
    """
    config = message_config(message)
    metadata = copy.copy(message.metadata)
    metadata.message_type = message_type
    content = RecordDict(
        {
            USER_ARRAYS_KEY: model,
            USER_CONFIG_KEY: ConfigRecord(
                {**config, protocol.MODEL_INDEX: model_index}
            ),
        }
    )
    return make_message(metadata=metadata, content=content)


def user_reply_metrics(reply: Message, keys: list[str], handler: str) -> MetricRecord:
    """The single MetricRecord of the user's ``reply``, checked to hold ``keys``.

    Raises
    ------
    RuntimeError
        If the user's handler replied with an error.
    ValueError
        If the reply does not carry one MetricRecord with every key.
    """
    if reply.has_error():
        raise RuntimeError(f"the {handler} function failed: {reply.error.reason}")
    records = list(reply.content.metric_records.values())
    if len(records) != 1:
        raise ValueError(
            f"{protocol.CLIENT_SIDE_MISCONFIGURED}: the {handler} reply has "
            f"{len(records)} MetricRecords, not 1"
        )
    (metrics,) = records
    missing = [key for key in keys if key not in metrics]
    if missing:
        raise ValueError(
            f"{protocol.CLIENT_SIDE_MISCONFIGURED}: the {handler} reply lacks "
            f"{missing} (it has {sorted(metrics)}); "
            "a reply needs 'num-examples', and an evaluate reply its loss under "
            "the key passed as loss_key= (Flower's quickstart-pytorch: "
            "loss_key='eval_loss')"
        )
    return metrics


def metric_number(metrics: MetricRecord, key: str) -> float:
    """The metric ``key`` as a number (a list-valued metric is refused)."""
    value = metrics[key]
    if not isinstance(value, (int, float)):
        raise ValueError(f"metric '{key}' must be a number, got {value!r}")
    return value

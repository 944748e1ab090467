"""The local-loss query, answered by the user's own evaluate function.

Power-of-Choice (pow-d) asks ``query.loss`` of its candidates, MMFL's loss
variant of every node; the ``Client contract`` of
:class:`flwr_importance.strategies.PowerOfChoice` and of
:class:`flwr_importance.strategies.MultiModelSampling` give the message and
the reply (``loss-<s>`` and ``num-examples-<s>``, without training).
:func:`add_loss_query` registers it on a ``ClientApp`` from the user's
``@app.evaluate()`` function; like every helper here it needs no torch.
"""

from __future__ import annotations

from flwr.app import Context, Message, MessageType
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable

from flwr_importance import protocol
from flwr_importance.clientapps.messages import ClientHandler, metrics_reply
from flwr_importance.clientapps.user_functions import (
    message_for_user,
    metric_number,
    received_models,
    user_reply_metrics,
)


def loss_query_handler(
    evaluate_fn: ClientAppCallable, *, loss_key: str = protocol.LOSS
) -> ClientHandler:
    """The ``query.loss`` handler: the user's evaluate function on each model.

    Parameters
    ----------
    evaluate_fn : callable
        The user's evaluate function; its reply's one MetricRecord holds the
        mean loss under ``loss_key`` and ``num-examples``.
    loss_key : str (default: ``"loss"``)
        The reply metric holding the loss (quickstart: ``"eval_loss"``).
    """

    def query_loss(message: Message, context: Context) -> Message:
        reply: dict[str, float] = {}
        for model_index, global_model in received_models(message).items():
            user_reply = evaluate_fn(
                message_for_user(
                    message, MessageType.EVALUATE, global_model, model_index
                ),
                context,
            )
            metrics = user_reply_metrics(
                user_reply, [protocol.NUM_EXAMPLES, loss_key], "evaluate"
            )
            reply[protocol.per_model_key(protocol.LOSS, model_index)] = metric_number(
                metrics, loss_key
            )
            reply[protocol.per_model_key(protocol.NUM_EXAMPLES, model_index)] = (
                metric_number(metrics, protocol.NUM_EXAMPLES)
            )
        return metrics_reply(message, reply)

    return query_loss


def add_loss_query(
    app: ClientApp, evaluate_fn: ClientAppCallable, *, loss_key: str = protocol.LOSS
) -> None:
    """Register ``@app.query("loss")`` (Power-of-Choice, MMFL's loss variant).

    ``evaluate_fn`` runs on each received model, which it finds under
    ``"arrays"`` (the node's data of that model's task: ``model-index`` in the
    config); no training.
    """
    app.query(protocol.LOSS_QUERY)(loss_query_handler(evaluate_fn, loss_key=loss_key))

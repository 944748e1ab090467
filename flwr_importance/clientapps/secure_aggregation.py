"""SecAgg+ on a client that also answers the library's queries (torch-free).

Flower's :func:`flwr.client.mod.secaggplus_mod` takes over every TRAIN
message and expects each to carry its ``secaggplus_configs`` record. On the
legacy API the library's own queries are TRAIN messages too (OCS's norm
query and FOLB's gradient query are ``ClientProxy.fit`` calls made from
inside ``configure_fit``, see :mod:`flwr_importance.compat`), and they carry
no such record, so ``secaggplus_mod`` alone refuses them.
:func:`importance_secaggplus_mod` is ``secaggplus_mod`` for the messages of
a secure sum and a plain pass-through for every other message.

What passes through is *not* masked: a query's reply reaches the server as
the client wrote it. Which replies a method sends in the clear under SecAgg+
is stated per method in ``docs/privacy.md``.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

__all__ = ["importance_secaggplus_mod", "is_secure_sum_message"]


def is_secure_sum_message(message: Message) -> bool:
    """Whether ``message`` is a stage of a SecAgg+ secure sum.

    A message is one exactly when it carries the ``secaggplus_configs``
    ConfigRecord that Flower's ``SecAggPlusWorkflow`` attaches to each of its
    four stages.
    """
    return RECORD_KEY_CONFIGS in message.content.config_records


def importance_secaggplus_mod(
    msg: Message, ctxt: Context, call_next: ClientAppCallable
) -> Message:
    """``secaggplus_mod`` for secure-sum stages, a pass-through for the rest.

    Use it where Flower's examples put ``secaggplus_mod``::

        app = ClientApp(client_fn=client_fn, mods=[importance_secaggplus_mod])

    Parameters
    ----------
    msg : Message
        The incoming message.
    ctxt : Context
        The node's context (SecAgg+ keeps its per-node state there).
    call_next : ClientAppCallable
        The rest of the ClientApp (the user's code, other mods).

    Returns
    -------
    Message
        ``secaggplus_mod``'s reply for a secure-sum stage, else the reply of
        ``call_next`` unchanged.
    """
    if is_secure_sum_message(msg):
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)

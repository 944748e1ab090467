"""A ClientApp mod that makes a chosen fraction of replies fail.

Reliability tests and the failure benchmark run the real strategies against
nodes that misbehave the three ways a Flower deployment sees: the ClientApp
raises (the SuperNode sends an error reply), the reply comes too late (the
server's time-out expires first), or the reply is empty. Which message fails
is a deterministic function of ``(seed, node id, round, message type)``, so a
run is reproducible and every strategy of a comparison meets the same faults.

Enable it through the run config of the simulation app (``fault-rate``,
``fault-kinds``, ``fault-seed``, ``fault-delay``) or with
``ClientApp(mods=[fault_injection_mod])`` in your own app.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.logger import log

from flwr_importance.clientapps.messages import server_round_of

#: The fault kinds: an exception, a reply after ``fault-delay``, an empty reply.
FAULT_KINDS = ("raise", "timeout", "silent")


class InjectedFaultError(RuntimeError):
    """The exception a ``raise`` fault throws inside the ClientApp."""


class LostReplyError(Exception):
    """A ``timeout`` fault with ``delay == 0``: the reply is lost at once.

    :class:`~flwr_importance.tooling.testing.grid.InProcessGrid` delivers no reply for
    it, exactly as for a node that never answers, so in-process tests meet
    time-outs without waiting for one.
    """


@dataclass(frozen=True)
class FaultPlan:
    """Which replies fail, and how.

    Parameters
    ----------
    rate : float
        Probability that a given message's reply fails, in ``[0, 1]``.
    kinds : tuple of str
        The fault kinds drawn from (uniformly), a subset of :data:`FAULT_KINDS`.
    seed : int
        Seeds the draws.
    delay : float
        Seconds a ``timeout`` fault holds its reply before sending it; set it
        above the server's time-out (the strategies' ``query_timeout``, the
        ``timeout`` of ``Strategy.start``). ``0`` raises
        :class:`LostReplyError` instead, which the in-process grid turns into
        a reply that never arrives.
    """

    rate: float = 0.0
    kinds: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    delay: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate must lie in [0, 1], got {self.rate}")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if not self.kinds or unknown:
            raise ValueError(
                f"fault kinds must be a non-empty subset of {FAULT_KINDS}, "
                f"got {self.kinds}"
            )
        if self.delay < 0:
            raise ValueError(f"fault delay must be >= 0, got {self.delay}")

    @classmethod
    def from_run_config(
        cls, run_config: dict[str, bool | int | float | str]
    ) -> FaultPlan:
        """The plan the ``fault-*`` run-config keys describe (none: no faults)."""
        kinds = str(run_config.get("fault-kinds", ",".join(FAULT_KINDS)))
        return cls(
            rate=float(run_config.get("fault-rate", 0.0)),
            kinds=tuple(kind.strip() for kind in kinds.split(",") if kind.strip()),
            seed=int(run_config.get("fault-seed", 0)),
            delay=float(run_config.get("fault-delay", 1.0)),
        )

    def fault_for(
        self, node_id: int, server_round: int, message_type: str
    ) -> str | None:
        """The fault of this node's reply to this message, or None."""
        if self.rate == 0.0:
            return None
        # crc32, not hash(): Python salts str hashes per process.
        entropy = [self.seed, node_id, server_round, zlib.crc32(message_type.encode())]
        rng = np.random.default_rng(entropy)
        if rng.random() >= self.rate:
            return None
        return str(self.kinds[int(rng.integers(len(self.kinds)))])


def fault_injection_mod(
    message: Message, context: Context, call_next: ClientAppCallable
) -> Message:
    """Flower ClientApp mod: fail this reply as the run config's plan says."""
    plan = FaultPlan.from_run_config(dict(context.run_config))
    message_type = message.metadata.message_type
    fault = plan.fault_for(context.node_id, server_round_of(message), message_type)
    if fault is None:
        return call_next(message, context)
    log(
        WARNING,
        "fault injection: node %d, %s: %s",
        context.node_id,
        message_type,
        fault,
    )
    if fault == "raise":
        raise InjectedFaultError(f"injected fault on node {context.node_id}")
    if fault == "silent":
        return Message(RecordDict(), reply_to=message)
    if plan.delay == 0:
        raise LostReplyError(f"reply of node {context.node_id} lost")
    time.sleep(plan.delay)
    return call_next(message, context)

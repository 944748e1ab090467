"""The part of Flower's ``Grid`` interface every grid of this library shares."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run


class LocalGrid(Grid):
    """A ``Grid`` that lives in the ServerApp's process and holds its own ``Run``.

    Subclasses (the in-process test grid, the legacy-API grid over
    ``ClientProxy`` objects) set ``self._run`` and add node ids and delivery.
    """

    _run: Run

    @property
    def run(self) -> Run:
        """The run this grid serves."""
        return self._run

    def set_run(self, run: Run) -> None:
        """Replace the run (part of the ``Grid`` interface)."""
        self._run = run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """An instruction message (deprecated ``Grid`` API, kept for legacy code)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)


class SynchronousGrid(LocalGrid):
    """A :class:`LocalGrid` whose replies exist only inside ``send_and_receive``.

    Its nodes answer while the call waits (legacy ``ClientProxy`` calls, canned
    replies), so there is nothing to push now and pull later; every strategy of
    this library sends through ``send_and_receive``. ``push_messages`` and
    ``pull_messages`` raise instead of losing messages.
    """

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Not available: replies are made in ``send_and_receive``."""
        raise NotImplementedError(f"{type(self).__name__} only serves send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Not available: replies are made in ``send_and_receive``."""
        raise NotImplementedError(f"{type(self).__name__} only serves send_and_receive")

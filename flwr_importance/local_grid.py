"""The part of Flower's ``Grid`` interface every grid of this library shares."""

from __future__ import annotations

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

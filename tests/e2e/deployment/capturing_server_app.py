"""The simulation's ServerApp, recording every reply it receives (test-only).

It runs :func:`simulations.server_app.run_experiment` unchanged on a grid that
passes everything to the deployment's grid and keeps, for each reply, what a
curious server could read outside the model arrays: its type, sender, metric
and config records, and the names of its ArrayRecords. They are written to
``<output-dir>/replies.json`` next to the run's history.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, cast

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from simulations.config import ExperimentConfig
from simulations.server_app import run_experiment

REPLIES_FILE = "replies.json"

app = ServerApp()


def reply_record(reply: Message) -> dict[str, Any]:
    """What the server received in ``reply``, besides the arrays' values."""
    return {
        "message-type": reply.metadata.message_type,
        "src-node-id": reply.metadata.src_node_id,
        "error": reply.has_error(),
        "metrics": {}
        if reply.has_error()
        else {
            name: dict(record) for name, record in reply.content.metric_records.items()
        },
        "configs": {}
        if reply.has_error()
        else {
            name: dict(record) for name, record in reply.content.config_records.items()
        },
        "arrays": [] if reply.has_error() else list(reply.content.array_records),
    }


class RecordingGrid:
    """A grid that forwards to ``grid`` and records the replies it returns."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self.replies: list[dict[str, Any]] = []

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Forward, record, return the replies."""
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        self.replies.extend(reply_record(reply) for reply in replies)
        return replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the experiment as ``simulations.server_app`` does; save the replies."""
    config = ExperimentConfig.from_run_config(context.run_config)
    recording = RecordingGrid(grid)
    try:
        run_experiment(cast(Grid, recording), config)
    finally:
        config.output_path().mkdir(parents=True, exist_ok=True)
        (config.output_path() / REPLIES_FILE).write_text(json.dumps(recording.replies))

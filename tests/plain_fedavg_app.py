"""A plain Flower quickstart ClientApp: FedAvg's train and evaluate, nothing else.

What a user has before adding a method's client lines. It registers only
``@app.train()`` and ``@app.evaluate()`` and replies as Flower's quickstart
does (the model under ``arrays``, ``train_loss``/``eval_loss`` and
``num-examples`` in the metrics), without torch: train moves every array a
step towards zero, so the reply is a real, finite model of the same shapes.

Used in process by ``tests/strategies/test_replies_missing_client_side.py`` and, as
the ClientApp of a copy of the simulation app (``tests/app_variant.py``), by
``tests/e2e/test_missing_client_side_flwr_run.py``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

#: Samples every node claims to hold.
NUM_EXAMPLES = 20

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Shrink the received model by 10% and reply it with the train loss."""
    arrays = msg.content["arrays"]
    assert isinstance(arrays, ArrayRecord)
    trained = [0.9 * values for values in arrays.to_numpy_ndarrays()]
    loss = float(sum(np.sum(values**2) for values in trained))
    content = RecordDict(
        {
            "arrays": ArrayRecord(trained),
            "metrics": MetricRecord({"train_loss": loss, "num-examples": NUM_EXAMPLES}),
        }
    )
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Reply the squared norm of the received model as the loss."""
    arrays = msg.content["arrays"]
    assert isinstance(arrays, ArrayRecord)
    loss = float(sum(np.sum(values**2) for values in arrays.to_numpy_ndarrays()))
    metrics = MetricRecord({"eval_loss": loss, "num-examples": NUM_EXAMPLES})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)

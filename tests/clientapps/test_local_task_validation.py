"""``LocalTask``'s optional validation split, and the ready evaluate handler on it.

Federated evaluation scores the received model on the node's validation
split when the task has one (scoring the data it trained on overstates how
well the model generalizes), else on the training data.
"""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.clientapp import ClientApp

from flwr_importance.clientapps import LocalTask, register_handlers
from flwr_importance.clientapps.local_task import make_evaluate_handler
from flwr_importance.tasks import Objective, evaluate
from flwr_importance.tooling.testing import InProcessGrid

NUM_FEATURES = 5
NUM_CLASSES = 3


def labelled(num_samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_samples`` random features and class labels."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, NUM_FEATURES, generator=generator)
    y = torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator)
    return x, y


TRAIN = labelled(40, seed=1)
VALIDATION = labelled(15, seed=2)


def make_task(*, with_validation: bool) -> LocalTask:
    """A linear classifier on ``TRAIN``, with ``VALIDATION`` as its split or not."""
    x_val, y_val = VALIDATION if with_validation else (None, None)
    return LocalTask(
        model=torch.nn.Linear(NUM_FEATURES, NUM_CLASSES),
        objective=Objective("classification"),
        x=TRAIN[0],
        y=TRAIN[1],
        lr=0.1,
        batch_size=8,
        local_steps=1,
        x_val=x_val,
        y_val=y_val,
    )


def evaluated_metrics(*, with_validation: bool) -> tuple[dict[str, float], LocalTask]:
    """The ready evaluate handler's reply metrics, and a task holding the model sent."""

    def task_factory(context: Context) -> LocalTask:
        return make_task(with_validation=with_validation)

    app = register_handlers(
        ClientApp(), {"evaluate": make_evaluate_handler(task_factory)}
    )
    grid = InProcessGrid(app, num_nodes=1)
    sent = make_task(with_validation=with_validation)
    torch.manual_seed(3)
    sent.model = torch.nn.Linear(NUM_FEATURES, NUM_CLASSES)
    content = RecordDict(
        {
            "arrays": ArrayRecord(sent.model.state_dict()),
            "config": ConfigRecord({"server-round": 1}),
        }
    )
    (node_id,) = grid.get_node_ids()
    message = grid.create_message(content, "evaluate", node_id, group_id="1")
    (reply,) = grid.send_and_receive([message])
    assert not reply.has_error(), reply.error
    return dict(reply.content["metrics"]), sent  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("with_validation", "expected_data"), [(True, VALIDATION), (False, TRAIN)]
)
def test_evaluate_handler_scores_the_validation_split_when_given(
    with_validation: bool, expected_data: tuple[torch.Tensor, torch.Tensor]
) -> None:
    metrics, sent = evaluated_metrics(with_validation=with_validation)
    expected = evaluate(sent.model, *expected_data, sent.objective)
    assert metrics["num-examples"] == len(expected_data[0])
    assert metrics["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert metrics["accuracy"] == pytest.approx(expected["accuracy"])


def test_validation_split_needs_both_tensors_of_one_length() -> None:
    common = {
        "model": torch.nn.Linear(NUM_FEATURES, NUM_CLASSES),
        "objective": Objective("classification"),
        "x": TRAIN[0],
        "y": TRAIN[1],
        "lr": 0.1,
        "batch_size": 8,
        "local_steps": 1,
    }
    with pytest.raises(ValueError, match="both x_val and y_val"):
        LocalTask(**common, x_val=VALIDATION[0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rows"):
        LocalTask(
            **common,  # type: ignore[arg-type]
            x_val=VALIDATION[0],
            y_val=VALIDATION[1][:-1],
        )

"""ISFedAvg's ClientApp: importance-sampled batches, the eq. 8 step, eq. 29, reports.

Statistical checks use fixed seeds and tolerances of ``Z`` standard errors.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from flwr_importance.clientapps import LocalTask
from flwr_importance.clientapps.isfedavg import (
    SAMPLE_STATE_KEY,
    ImportanceSampler,
    RoundSettings,
    SampleState,
    importance_sampled_sgd,
    make_isfedavg_train_handler,
)
from flwr_importance.protocol import (
    ISFEDAVG_ADAPT_SAMPLE_PROBS,
    ISFEDAVG_BATCH_SIZE,
    ISFEDAVG_CLIENT_PROB,
    ISFEDAVG_DIVIDE_BY_LOCAL_STEPS,
    ISFEDAVG_GRADIENT_SQ_NORM,
    ISFEDAVG_LOCAL_STEPS,
    ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB,
    ISFEDAVG_NUM_CLIENTS,
    ISFEDAVG_SIGMA2,
)
from flwr_importance.tasks import Objective, full_gradient, train_local
from flwr_importance.tooling.testing import InProcessGrid

#: Standard errors allowed between an empirical frequency and its target.
Z = 4.5


def one_hot_task(num_samples: int) -> LocalTask:
    """``x_n = e_n``, ``y_n = 1``, a zero linear model: a step moves exactly the
    batch's coordinates, by ``2 lr c_n``, so the batch and its weights show."""
    model = nn.Linear(num_samples, 1, bias=False)
    nn.init.zeros_(model.weight)
    return LocalTask(
        model=model,
        objective=Objective("regression"),
        x=torch.eye(num_samples),
        y=torch.ones(num_samples, 1),
        lr=1e-3,
        batch_size=1,
    )


def settings(
    client_prob: float = 0.25,
    num_clients: int = 2,
    local_steps: int = 1,
    batch_size: int = 2,
    adapt: bool = False,
    divide_by_local_steps: bool = True,
) -> RoundSettings:
    return RoundSettings(
        client_prob=client_prob,
        num_clients=num_clients,
        local_steps=local_steps,
        batch_size=batch_size,
        adapt_sample_probs=adapt,
        min_relative_sample_prob=0.1,
        divide_by_local_steps=divide_by_local_steps,
    )


@pytest.mark.parametrize(
    ("sample_probs", "expected_inclusion"),
    [
        ([0.3, 0.25, 0.15, 0.1, 0.1, 0.1], [0.6, 0.5, 0.3, 0.2, 0.2, 0.2]),
        # B p_0 = 1.2 is capped at 1: the other unit of the batch goes to the
        # rest in proportion to p_n (0.4 of mass for 1 unit, so 2.5 p_n).
        ([0.6, 0.1, 0.1, 0.1, 0.05, 0.05], [1.0, 0.25, 0.25, 0.25, 0.125, 0.125]),
    ],
)
def test_batches_include_samples_with_b_p_n_and_weights_divide_by_it(
    sample_probs: list[float], expected_inclusion: list[float]
) -> None:
    batch_size, num_samples = 2, len(sample_probs)
    round_settings = settings(batch_size=batch_size)
    inclusion = np.array(expected_inclusion)
    # eq. 8 with the realized normalized probability pi_n / B:
    # 1/(K p_k E B) * 1/(N pi_n / B) = 1/(K p_k E N pi_n).
    expected_weights = 1.0 / (
        round_settings.num_clients
        * round_settings.client_prob
        * num_samples
        * inclusion
    )
    task = one_hot_task(num_samples)
    rng = np.random.default_rng(8)
    draws = 1500
    counts = np.zeros(num_samples)
    for _ in range(draws):
        nn.init.zeros_(task.model.weight)
        state = SampleState(np.array(sample_probs), np.full(num_samples, np.nan))
        importance_sampled_sgd(task, ImportanceSampler(round_settings, state, rng=rng))
        moved = task.model.weight.detach().double().numpy()[0]
        batch = np.flatnonzero(moved)
        assert batch.size == batch_size
        # Q_n = (w_n - 1)^2 has gradient -2 at w = 0: w_n moves by 2 lr c_n.
        np.testing.assert_allclose(
            moved[batch], 2 * task.lr * expected_weights[batch], rtol=1e-5
        )
        counts[batch] += 1
    frequencies = counts / draws
    tolerance = Z * np.sqrt(inclusion * (1 - inclusion) / draws) + 1e-12
    np.testing.assert_array_less(np.abs(frequencies - inclusion), tolerance)


def regression_task(seed: int = 0) -> LocalTask:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(12, 4, generator=generator)
    y = x @ torch.randn(4, 1, generator=generator) + 0.3 * torch.randn(
        12, 1, generator=generator
    )
    torch.manual_seed(seed)
    return LocalTask(
        model=nn.Linear(4, 1, bias=False),
        objective=Objective("regression", l2=0.01),
        x=x,
        y=y,
        lr=0.02,
        batch_size=12,
    )


def test_uniform_step_is_plain_sgd_scaled_by_one_over_e() -> None:
    task = regression_task()
    reference = copy.deepcopy(task.model)
    local_steps, num_samples = 3, len(task.x)
    # Uniform p_n = 1/N, K p_k = 1 and B = N (the batch is all the data in both).
    importance_sampled_sgd(
        task,
        ImportanceSampler(
            settings(
                client_prob=0.1,
                num_clients=10,
                local_steps=local_steps,
                batch_size=num_samples,
            ),
            SampleState.uniform(num_samples),
            rng=np.random.default_rng(0),
        ),
    )
    train_local(
        reference,
        task.x,
        task.y,
        task.objective,
        lr=task.lr / local_steps,
        batch_size=num_samples,
        local_steps=local_steps,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(task.model.weight, reference.weight)


def test_app_step_size_is_plain_sgd_at_the_app_learning_rate() -> None:
    """Without eq. 8's 1/E_k (the server's ``keep_app_step_size``), the uniform
    step is the app's: plain SGD at the learning rate it was given."""
    task = regression_task()
    reference = copy.deepcopy(task.model)
    local_steps, num_samples = 3, len(task.x)
    importance_sampled_sgd(
        task,
        ImportanceSampler(
            settings(
                client_prob=0.1,
                num_clients=10,
                local_steps=local_steps,
                batch_size=num_samples,
                divide_by_local_steps=False,
            ),
            SampleState.uniform(num_samples),
            rng=np.random.default_rng(0),
        ),
    )
    train_local(
        reference,
        task.x,
        task.y,
        task.objective,
        lr=task.lr,
        batch_size=num_samples,
        local_steps=local_steps,
        generator=torch.Generator().manual_seed(0),
    )
    torch.testing.assert_close(task.model.weight, reference.weight)


@pytest.mark.parametrize("divide_by_local_steps", [True, False])
def test_g2_is_the_mean_step_gradient_whatever_the_step_size(
    divide_by_local_steps: bool,
) -> None:
    """Eq. 14's report does not depend on the step size: with a model that does
    not move (lr 0) its E_k steps on all the data each see the full gradient."""
    task = regression_task(1)
    task.lr = 0.0
    num_samples = len(task.x)
    sampler = ImportanceSampler(
        settings(
            client_prob=0.25,
            num_clients=4,
            local_steps=3,
            batch_size=num_samples,
            divide_by_local_steps=divide_by_local_steps,
        ),
        SampleState.uniform(num_samples),
        rng=np.random.default_rng(0),
    )
    importance_sampled_sgd(task, sampler)
    gradient = full_gradient(task.model, task.x, task.y, task.objective)
    expected_g2 = float(sum(g.double().pow(2).sum() for g in gradient))
    g2 = sampler.metrics()[ISFEDAVG_GRADIENT_SQ_NORM]
    assert g2 == pytest.approx(expected_g2, rel=1e-5)


def test_reports_sigma2_and_g2_of_eq_22_and_eq_14() -> None:
    task = regression_task(1)
    num_samples = len(task.x)
    start = copy.deepcopy(task.model)
    state = SampleState.uniform(num_samples)
    sampler = ImportanceSampler(
        settings(client_prob=0.25, num_clients=4, batch_size=num_samples),
        state,
        rng=np.random.default_rng(0),
    )
    importance_sampled_sgd(task, sampler)
    metrics = sampler.metrics()
    # One step on all the data with K p_k = 1: grad P_hat is the full gradient.
    gradient = full_gradient(start, task.x, task.y, task.objective)
    expected_g2 = float(sum(g.double().pow(2).sum() for g in gradient))
    assert metrics[ISFEDAVG_GRADIENT_SQ_NORM] == pytest.approx(expected_g2, rel=1e-5)
    # sigma2 = 6/(E B N^2) sum_n (1/p_n) ||grad Q_n||^2 with p_n = 1/N, B = N.
    norms = task.objective.per_sample_grad_norms(start, task.x, task.y).double()
    expected_sigma2 = 6 / num_samples**2 * float(norms.pow(2).sum())
    assert metrics[ISFEDAVG_SIGMA2] == pytest.approx(expected_sigma2, rel=1e-5)
    np.testing.assert_allclose(state.grad_norms, norms.numpy(), rtol=1e-5)


def test_eq29_moves_the_batch_probabilities_to_the_gradient_norms() -> None:
    task = regression_task(2)
    num_samples = len(task.x)
    start = copy.deepcopy(task.model)
    state = SampleState.uniform(num_samples)
    importance_sampled_sgd(
        task,
        ImportanceSampler(
            settings(batch_size=num_samples, adapt=True),
            state,
            rng=np.random.default_rng(0),
        ),
    )
    norms = task.objective.per_sample_grad_norms(start, task.x, task.y).double()
    # The whole data set was the batch: p_n is proportional to the norms (the
    # 0.1/N floor does not bind here).
    expected = (norms / norms.sum()).numpy()
    assert expected.min() > 0.1 / num_samples
    np.testing.assert_allclose(state.probs, expected, rtol=1e-5)


def test_oversized_batch_uses_all_samples_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = regression_task()
    with caplog.at_level(logging.WARNING):
        importance_sampled_sgd(
            task,
            ImportanceSampler(
                settings(batch_size=50),
                SampleState.uniform(len(task.x)),
                rng=np.random.default_rng(0),
            ),
        )
    assert "exceeds the node's 12 samples" in caplog.text


# --- the handler on the in-process grid ----------------------------------------

app = ClientApp()


def grid_task(context: Context) -> LocalTask:
    return regression_task(int(context.node_config["partition-id"]))


app.train()(make_isfedavg_train_handler(grid_task))


def train_message(node_id: int, model: nn.Module, server_round: int) -> Message:
    config = ConfigRecord(
        {
            "server-round": server_round,
            ISFEDAVG_CLIENT_PROB: 0.5,
            ISFEDAVG_NUM_CLIENTS: 2,
            ISFEDAVG_LOCAL_STEPS: 2,
            ISFEDAVG_BATCH_SIZE: 3,
            ISFEDAVG_ADAPT_SAMPLE_PROBS: True,
            ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB: 0.1,
        }
    )
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config})
    return Message(content, node_id, "train")


def test_handler_keeps_sample_probabilities_in_the_node_state() -> None:
    grid = InProcessGrid(app, num_nodes=1)
    (node_id,) = grid.get_node_ids()
    model = regression_task().model
    history = []
    for server_round in (1, 2):
        (reply,) = grid.send_and_receive([train_message(node_id, model, server_round)])
        assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
        metrics = reply.content["metrics"]
        assert metrics[ISFEDAVG_SIGMA2] >= 0 and metrics[ISFEDAVG_GRADIENT_SQ_NORM] >= 0
        assert metrics["num-examples"] == 12
        stored = grid.node_state(node_id)[SAMPLE_STATE_KEY]
        history.append(stored["probs"].numpy().copy())
    assert history[0].sum() == pytest.approx(1.0)
    assert not np.allclose(history[0], 1 / 12)  # eq. 29 moved some of them
    assert not np.allclose(history[1], history[0])  # round 2 started from round 1


@pytest.mark.parametrize(("sent", "divides"), [(None, True), (False, False)])
def test_round_settings_divide_by_local_steps_unless_told_not_to(
    sent: bool | None, divides: bool
) -> None:
    """A server that sends no ``isfedavg-divide-by-local-steps`` gets eq. 8."""
    message = train_message(1, regression_task().model, 1)
    if sent is not None:
        message.content["config"][ISFEDAVG_DIVIDE_BY_LOCAL_STEPS] = sent
    round_settings = RoundSettings.from_message(message)
    assert round_settings.divide_by_local_steps is divides
    assert round_settings.step_divisor == (2 if divides else 1)


def test_handler_rejects_a_config_without_the_isfedavg_keys() -> None:
    grid = InProcessGrid(app, num_nodes=1)
    (node_id,) = grid.get_node_ids()
    model = regression_task().model
    message = Message(
        RecordDict(
            {"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord()}
        ),
        node_id,
        "train",
    )
    (reply,) = grid.send_and_receive([message])
    assert reply.has_error()
    assert ISFEDAVG_CLIENT_PROB in reply.error.reason

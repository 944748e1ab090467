"""Losses, per-sample gradients, local SGD with the FedProx term, evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from flwr_importance.per_sample import layerwise_gradient_and_norms
from flwr_importance.tasks import (
    MODEL_NAMES,
    Objective,
    build_model,
    evaluate,
    full_gradient,
    get_weights,
    random_local_steps,
    set_weights,
    train_local,
    training,
    weighted_sgd_step,
)

BATCH = 6
# float32 sums in different orders.
RTOL, ATOL = 1e-4, 1e-5

# A tiny instance of every model: (input shape, outputs, task).
TINY = {
    "linear": ((4,), 1, "regression"),
    "logreg": ((5,), 3, "classification"),
    "mlp": ((1, 4, 4), 3, "classification"),
    "cnn": ((2, 8, 8), 3, "classification"),
}


def batch_for(
    input_shape: tuple[int, ...], num_outputs: int, task: str, seed: int = 0
) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((BATCH, *input_shape), generator=generator)
    if task == "regression":
        return x, torch.randn(BATCH, generator=generator)
    return x, torch.randint(0, num_outputs, (BATCH,), generator=generator)


def tiny_case(name: str) -> tuple[nn.Module, Tensor, Tensor, str]:
    input_shape, num_outputs, task = TINY[name]
    model = build_model(name, input_shape, num_outputs, seed=1, hidden=(6, 5))
    return model, *batch_for(input_shape, num_outputs, task), task


def reference_grads(
    model: nn.Module, x: Tensor, y: Tensor, objective: Objective
) -> list[list[Tensor]]:
    """One backward pass per sample: the slow, obviously right way."""
    per_sample = []
    for index in range(len(x)):
        model.zero_grad()
        objective.loss(model, x[index : index + 1], y[index : index + 1]).backward()
        per_sample.append(
            [
                torch.zeros_like(p) if p.grad is None else p.grad.clone()
                for p in model.parameters()
            ]
        )
    model.zero_grad()
    return per_sample


def reference_norms(per_sample: list[list[Tensor]]) -> Tensor:
    return torch.stack(
        [torch.sqrt(sum((g**2).sum() for g in grads)) for grads in per_sample]  # type: ignore[arg-type]
    )


class SharedLayer(nn.Module):
    """Applies one linear layer twice: its calls are joined along the positions."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.layer = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.layer(torch.tanh(self.layer(self.flatten(x))))
        return self.head(torch.tanh(hidden))


class SequenceLinear(nn.Module):
    """A linear layer on (B, T, features) input, summed over T."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x.reshape(x.shape[0], 4, 4)).sum(dim=1)


class LooseParameter(nn.Module):
    """A parameter outside any layer: only torch.func can serve it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16))
        self.head = nn.Linear(16, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(x.flatten(start_dim=1) * self.scale)


def layerwise_models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "layernorm": nn.Sequential(
            nn.Flatten(), nn.Linear(16, 6), nn.LayerNorm(6), nn.Tanh(), nn.Linear(6, 3)
        ),
        "shared": SharedLayer(),
        "sequence": SequenceLinear(),
    }


def fallback_models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "prelu": nn.Sequential(
            nn.Flatten(), nn.Linear(16, 6), nn.PReLU(), nn.Linear(6, 3)
        ),
        "loose": LooseParameter(),
    }


@pytest.mark.parametrize("l2", [0.0, 0.05])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_per_sample_grads_and_norms_match_a_loop(name: str, l2: float) -> None:
    model, x, y, task = tiny_case(name)
    objective = Objective(task, l2=l2)  # type: ignore[arg-type]
    expected = reference_grads(model, x, y, objective)
    per_sample, norms = objective.per_sample_grads_and_norms(model, x, y)
    for index, grads in enumerate(expected):
        for got, want in zip(per_sample.values(), grads, strict=True):
            torch.testing.assert_close(got[index], want, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(norms, reference_norms(expected), rtol=RTOL, atol=ATOL)
    # The default norms take the layer-wise path for every library model.
    assert (
        layerwise_gradient_and_norms(model, x, y, objective.sample_losses, l2, None)
        is not None
    )
    torch.testing.assert_close(
        objective.per_sample_grad_norms(model, x, y),
        reference_norms(expected),
        rtol=RTOL,
        atol=ATOL,
    )


@pytest.mark.parametrize("l2", [0.0, 0.05])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_weighted_gradient_matches_a_loop(name: str, l2: float) -> None:
    model, x, y, task = tiny_case(name)
    objective = Objective(task, l2=l2)  # type: ignore[arg-type]
    weights = torch.linspace(0.1, 2.0, BATCH)
    expected = reference_grads(model, x, y, objective)
    gradient, norms = objective.weighted_gradient_and_norms(model, x, y, weights)
    for position, got in enumerate(gradient):
        want = sum(
            w * grads[position] for w, grads in zip(weights, expected, strict=True)
        )
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(norms, reference_norms(expected), rtol=RTOL, atol=ATOL)


def check_against_a_loop(model: nn.Module, x: Tensor, y: Tensor) -> None:
    objective = Objective("classification", l2=0.01)
    expected = reference_grads(model, x, y, objective)
    torch.testing.assert_close(
        objective.per_sample_grad_norms(model, x, y),
        reference_norms(expected),
        rtol=RTOL,
        atol=ATOL,
    )
    weights = torch.full((BATCH,), 0.5)
    gradient, _ = objective.weighted_gradient_and_norms(model, x, y, weights)
    for position, got in enumerate(gradient):
        want = 0.5 * sum(grads[position] for grads in expected)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["layernorm", "shared", "sequence"])
def test_norm_shared_and_sequence_layers_take_the_layerwise_path(name: str) -> None:
    model = layerwise_models()[name]
    x, y = batch_for((1, 4, 4), 3, "classification")
    assert (
        layerwise_gradient_and_norms(
            model, x, y, Objective("classification").sample_losses, 0.01, None
        )
        is not None
    )
    check_against_a_loop(model, x, y)


@pytest.mark.parametrize("name", ["prelu", "loose"])
def test_models_outside_the_layerwise_path_fall_back_to_torch_func(name: str) -> None:
    model = fallback_models()[name]
    x, y = batch_for((1, 4, 4), 3, "classification")
    objective = Objective("classification", l2=0.01)
    assert (
        layerwise_gradient_and_norms(model, x, y, objective.sample_losses, 0.01, None)
        is None
    )
    check_against_a_loop(model, x, y)


def test_weighted_sgd_step_applies_the_weighted_gradient() -> None:
    model, x, y, _ = tiny_case("mlp")
    objective = Objective("classification")
    before = [p.detach().clone() for p in model.parameters()]
    norms_before = objective.per_sample_grad_norms(model, x, y)
    weights = torch.rand(BATCH, generator=torch.Generator().manual_seed(3))
    step = weighted_sgd_step(model, x, y, objective, lr=0.1, sample_weights=weights)
    torch.testing.assert_close(step.sample_grad_norms, norms_before)
    for old, new, grad in zip(before, model.parameters(), step.gradient, strict=True):
        torch.testing.assert_close(new.detach(), old - 0.1 * grad)
    with pytest.raises(ValueError, match="one weight per sample"):
        weighted_sgd_step(model, x, y, objective, lr=0.1, sample_weights=weights[:2])


def test_full_gradient_matches_autograd_on_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, x, y, _ = tiny_case("mlp")
    objective = Objective("classification", l2=0.01)
    expected = torch.autograd.grad(
        objective.loss(model, x, y), list(model.parameters())
    )
    # Uneven chunks (4 + 2 rows) must weigh every sample, and the penalty, once.
    monkeypatch.setattr(training, "EVAL_CHUNK_SIZE", 4)
    for got, want in zip(full_gradient(model, x, y, objective), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_loss_definitions() -> None:
    model = build_model("linear", (3,), 1, seed=0)
    x = torch.randn(5, 3)
    y = torch.randn(5)
    (weight,) = (p.detach() for p in model.parameters())
    expected = ((y - x @ weight[0]) ** 2).mean() + 0.2 * (weight**2).sum()
    loss = Objective("regression", l2=0.2).loss(model, x, y)
    torch.testing.assert_close(loss, expected)
    logits = torch.randn(4, 3)
    labels = torch.tensor([0, 2, 1, 1])
    torch.testing.assert_close(
        Objective("classification").sample_losses(logits, labels),
        F.cross_entropy(logits, labels, reduction="none"),
    )


def test_objective_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="classification, regression"):
        Objective("ranking")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="l2"):
        Objective("regression", l2=-1.0)


def easy_problem() -> tuple[Tensor, Tensor]:
    """Two well separated Gaussian blobs."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(64) % 2
    x = torch.randn(64, 2, generator=generator) + 3.0 * (2 * labels[:, None] - 1)
    return x, labels


def test_train_local_decreases_the_loss() -> None:
    x, y = easy_problem()
    model = build_model("logreg", (2,), 2, seed=0)
    objective = Objective("classification")
    before = evaluate(model, x, y, objective)["loss"]
    result = train_local(
        model,
        x,
        y,
        objective,
        lr=0.1,
        batch_size=8,
        local_steps=40,
        generator=torch.Generator().manual_seed(0),
    )
    after = evaluate(model, x, y, objective)
    assert result["num-steps"] == 40
    assert after["loss"] < 0.2 * before
    assert after["accuracy"] == 1.0
    assert 0 < result["train-loss"] < before


def test_same_seed_same_weights() -> None:
    x, y = easy_problem()
    objective = Objective("classification", l2=0.01)

    def trained(seed: int) -> list[np.ndarray]:
        model = build_model("mlp", (2,), 2, seed=0, hidden=(8, 8))
        train_local(
            model,
            x,
            y,
            objective,
            lr=0.05,
            batch_size=5,
            local_steps=30,
            proximal_mu=0.1,
            generator=torch.Generator().manual_seed(seed),
        )
        return get_weights(model)

    for a, b in zip(trained(7), trained(7), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.array_equal(a, b) for a, b in zip(trained(7), trained(8), strict=True)
    )


def test_proximal_term_adds_mu_times_the_drift() -> None:
    """Two full-batch steps by hand: the second sees mu (w1 - w0)."""
    x, y = easy_problem()
    objective = Objective("classification")
    lr, mu = 0.1, 0.5
    model = build_model("logreg", (2,), 2, seed=3)
    w0 = [p.detach().clone() for p in model.parameters()]
    reference = build_model("logreg", (2,), 2, seed=3)
    g0 = full_gradient(reference, x, y, objective)
    with torch.no_grad():
        for p, g in zip(reference.parameters(), g0, strict=True):
            p.sub_(lr * g)
    w1 = [p.detach().clone() for p in reference.parameters()]
    g1 = full_gradient(reference, x, y, objective)
    expected = [
        a - lr * (g + mu * (a - anchor))
        for a, g, anchor in zip(w1, g1, w0, strict=True)
    ]
    train_local(
        model,
        x,
        y,
        objective,
        lr=lr,
        batch_size=len(x),
        local_steps=2,
        proximal_mu=mu,
        generator=torch.Generator().manual_seed(0),
    )
    for got, want in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=RTOL, atol=ATOL)


def test_large_proximal_mu_keeps_weights_near_the_global_model() -> None:
    x, y = easy_problem()
    objective = Objective("classification")

    def drift(mu: float) -> float:
        model = build_model("logreg", (2,), 2, seed=0)
        start = get_weights(model)
        train_local(
            model,
            x,
            y,
            objective,
            lr=0.05,
            batch_size=8,
            local_steps=50,
            proximal_mu=mu,
            generator=torch.Generator().manual_seed(0),
        )
        return sum(
            float(((a - b) ** 2).sum())
            for a, b in zip(get_weights(model), start, strict=True)
        )

    # lr * mu = 1.5 < 2: stable, and the drift settles near ||gradient|| / mu.
    assert drift(30.0) < 0.02 * drift(0.0)
    assert drift(30.0) < drift(3.0) < drift(0.0)


def test_epochs_and_oversized_batches() -> None:
    x, y = easy_problem()
    objective = Objective("classification")
    model = build_model("logreg", (2,), 2, seed=0)
    generator = torch.Generator().manual_seed(0)
    result = train_local(
        model, x, y, objective, lr=0.1, batch_size=10, epochs=2, generator=generator
    )
    assert result["num-steps"] == 2 * math.ceil(64 / 10)
    result = train_local(
        model, x, y, objective, lr=0.1, batch_size=1000, epochs=3, generator=generator
    )
    assert result["num-steps"] == 3
    result = train_local(
        model,
        x,
        y,
        objective,
        lr=0.1,
        batch_size=1000,
        local_steps=4,
        generator=generator,
    )
    assert result["num-steps"] == 4


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"local_steps": 2, "epochs": 1}, "exactly one"),
        ({}, "exactly one"),
        ({"local_steps": 0}, "at least one step"),
        ({"local_steps": 1, "lr": 0.0}, "lr > 0"),
    ],
)
def test_train_local_rejects_bad_settings(
    settings: dict[str, float], message: str
) -> None:
    x, y = easy_problem()
    model = build_model("logreg", (2,), 2, seed=0)
    arguments: dict[str, float] = {"lr": 0.1, **settings}
    with pytest.raises(ValueError, match=message):
        train_local(
            model,
            x,
            y,
            Objective("classification"),
            batch_size=4,
            generator=torch.Generator(),
            **arguments,  # type: ignore[arg-type]
        )


def test_empty_data_is_an_error() -> None:
    model = build_model("logreg", (2,), 2, seed=0)
    empty_x, empty_y = torch.zeros(0, 2), torch.zeros(0, dtype=torch.int64)
    objective = Objective("classification")
    with pytest.raises(ValueError, match="no data"):
        train_local(
            model,
            empty_x,
            empty_y,
            objective,
            lr=0.1,
            batch_size=4,
            local_steps=1,
            generator=torch.Generator(),
        )
    with pytest.raises(ValueError, match="no data"):
        evaluate(model, empty_x, empty_y, objective)
    with pytest.raises(ValueError, match="no data"):
        full_gradient(model, empty_x, empty_y, objective)


def test_evaluate_accuracy_on_a_crafted_case() -> None:
    model = build_model("logreg", (2,), 2, seed=0)
    set_weights(model, [np.eye(2, dtype=np.float32), np.zeros(2, np.float32)])
    # Predicted class = argmax of the input: three of four labels agree.
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [1.0, 0.0]])
    y = torch.tensor([0, 1, 0, 1])
    metrics = evaluate(model, x, y, Objective("classification"))
    assert metrics["accuracy"] == 0.75
    assert metrics["loss"] == pytest.approx(float(F.cross_entropy(x, y)), rel=1e-6)
    assert "msd" not in metrics


def test_evaluate_msd_and_regularized_loss() -> None:
    model = build_model("linear", (3,), 1, seed=0)
    set_weights(model, [np.array([[1.0, 2.0, 3.0]], np.float32)])
    optimum = (np.array([[1.0, 0.0, 1.0]]),)
    x = torch.eye(3)
    y = torch.tensor([1.0, 2.0, 0.0])
    metrics = evaluate(model, x, y, Objective("regression", l2=0.1), optimum)
    assert metrics["msd"] == pytest.approx(4.0 + 4.0)
    # Squared errors 0, 0, 9 over three samples, plus 0.1 * (1 + 4 + 9).
    assert metrics["loss"] == pytest.approx(3.0 + 1.4)
    assert "accuracy" not in metrics
    with pytest.raises(ValueError, match="shape"):
        evaluate(model, x, y, Objective("regression"), [np.zeros((3, 1))])


def test_evaluate_restores_training_mode() -> None:
    x, y = easy_problem()
    model = build_model("logreg", (2,), 2, seed=0)
    model.train()
    evaluate(model, x, y, Objective("classification"))
    assert model.training


def test_get_and_set_weights_round_trip_and_name_the_bad_layer() -> None:
    source = build_model("mlp", (1, 8, 8), 10, seed=0)
    target = build_model("mlp", (1, 8, 8), 10, seed=1)
    set_weights(target, get_weights(source))
    for a, b in zip(source.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)
    weights = get_weights(source)
    weights[2] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match=r"3\.weight"):
        set_weights(target, weights)
    with pytest.raises(ValueError, match="arrays"):
        set_weights(target, weights[:-1])


def test_random_local_steps_is_uniform_on_one_to_max() -> None:
    rng = np.random.default_rng(0)
    draws = [random_local_steps(5, rng) for _ in range(2000)]
    assert set(draws) == {1, 2, 3, 4, 5}
    assert np.bincount(draws)[1:].min() > 300
    assert random_local_steps(1, rng) == 1
    with pytest.raises(ValueError, match="max_steps"):
        random_local_steps(0, rng)


def test_mean_gradient_weighs_batches_of_any_size_and_keeps_buffers() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.BatchNorm1d(6))
    model.append(nn.Linear(6, 3))
    x, y = batch_for((1, 4, 4), 3, "classification")
    objective = Objective("classification")
    buffers = [b.clone() for b in model.buffers()]
    # eval(): BatchNorm normalizes with its running statistics, so the mean
    # gradient does not depend on how the samples are split into batches.
    model.eval()
    expected = torch.autograd.grad(
        objective.loss(model, x, y), list(model.parameters())
    )
    # Batches of 1, 3 and 2 samples, and an empty one that counts for nothing.
    cuts = [(0, 1), (1, 1), (1, 4), (4, 6)]
    batches = [(x[start:stop], y[start:stop]) for start, stop in cuts]
    got = training.mean_gradient(model, batches, objective.loss)
    for got_grad, want in zip(got, expected, strict=True):
        torch.testing.assert_close(got_grad, want, rtol=RTOL, atol=ATOL)
    # In train mode BatchNorm updates its running statistics on every forward
    # pass; a gradient is a measurement, so they come back unchanged.
    model.train()
    training.mean_gradient(model, batches[1:], objective.loss)
    for buffer, kept in zip(model.buffers(), buffers, strict=True):
        torch.testing.assert_close(buffer, kept, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no data"):
        training.mean_gradient(model, [], objective.loss)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@needs_cuda
def test_cuda_training_functions_match_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model on CUDA is served on CUDA from CPU data, with the CPU's results."""
    # Full float32 convolutions: cuDNN's default TF32 keeps 10 mantissa bits.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    cpu_model, x, y, task = tiny_case("cnn")
    cuda_model = build_model("cnn", TINY["cnn"][0], 3, seed=1, hidden=(6, 5)).cuda()
    objective = Objective(task, l2=0.01)  # type: ignore[arg-type]
    for cpu_grad, cuda_grad in zip(
        full_gradient(cpu_model, x, y, objective),
        full_gradient(cuda_model, x, y, objective),
        strict=True,
    ):
        assert cuda_grad.is_cuda
        torch.testing.assert_close(cuda_grad.cpu(), cpu_grad, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(
        objective.per_sample_grad_norms(cuda_model, x, y).cpu(),
        objective.per_sample_grad_norms(cpu_model, x, y),
        rtol=RTOL,
        atol=ATOL,
    )
    weights = torch.linspace(0.1, 1.0, BATCH, dtype=torch.float64)
    cpu_step = weighted_sgd_step(
        cpu_model, x, y, objective, lr=0.1, sample_weights=weights
    )
    cuda_step = weighted_sgd_step(
        cuda_model, x, y, objective, lr=0.1, sample_weights=weights
    )
    torch.testing.assert_close(
        cuda_step.sample_grad_norms.cpu(),
        cpu_step.sample_grad_norms,
        rtol=RTOL,
        atol=ATOL,
    )
    results = []
    for model in (cpu_model, cuda_model):
        metrics = train_local(
            model,
            x,
            y,
            objective,
            lr=0.05,
            batch_size=4,
            local_steps=3,
            proximal_mu=0.1,
            generator=torch.Generator().manual_seed(0),
        )
        results.append((metrics, evaluate(model, x, y, objective), get_weights(model)))
    (cpu_metrics, cpu_eval, cpu_weights), (cuda_metrics, cuda_eval, cuda_weights) = (
        results
    )
    assert cuda_metrics == pytest.approx(cpu_metrics, rel=RTOL)
    assert cuda_eval == pytest.approx(cpu_eval, rel=RTOL)
    for cpu_array, cuda_array in zip(cpu_weights, cuda_weights, strict=True):
        np.testing.assert_allclose(cuda_array, cpu_array, rtol=RTOL, atol=ATOL)
    assert next(cuda_model.parameters()).is_cuda

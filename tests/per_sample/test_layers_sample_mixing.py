"""BatchNorm is refused before the first step, by name, with the fix that works."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

from flwr_importance.clientapps.isfedavg import (
    ImportanceSampler,
    RoundSettings,
    SampleMixingLayerError,
    SampleState,
    replace_batchnorm,
)
from flwr_importance.per_sample import per_sample_grad_norms, sample_mixing_layers
from flwr_importance.tasks import Objective, weighted_sgd_step
from flwr_importance.tasks.architectures import resnet18

SETTINGS = RoundSettings(
    client_prob=1.0,
    num_clients=1,
    local_steps=2,
    batch_size=4,
    adapt_sample_probs=True,
    min_relative_sample_prob=0.1,
)


def sample_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def batchnorm_resnet() -> nn.Module:
    torch.manual_seed(0)
    return resnet18(num_classes=3, norm="batch", width=4)


def test_the_error_names_every_batchnorm_and_the_fix() -> None:
    model = batchnorm_resnet()
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    with pytest.raises(SampleMixingLayerError) as raised:
        per_sample_grad_norms(model, x, y, sample_loss, 0.0)
    message = str(raised.value)
    batchnorms = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(batchnorms) == 20  # stem, two per block, three shortcuts
    for name in batchnorms:
        assert f"{name} (BatchNorm2d)" in message
    assert "replace_batchnorm(model)" in message


def test_the_sampler_refuses_a_batchnorm_model_when_it_is_built() -> None:
    with pytest.raises(SampleMixingLayerError, match=r"layer1\.0\.bn1 \(BatchNorm2d\)"):
        ImportanceSampler(
            SETTINGS,
            SampleState.uniform(8),
            rng=np.random.default_rng(0),
            model=batchnorm_resnet(),
        )


def test_replace_batchnorm_makes_the_same_model_train_with_the_sampler() -> None:
    model = replace_batchnorm(batchnorm_resnet())
    assert sample_mixing_layers(model) == []
    images, labels = torch.randn(8, 3, 8, 8), torch.arange(8) % 3
    sampler = ImportanceSampler(
        SETTINGS, SampleState.uniform(8), rng=np.random.default_rng(0), model=model
    )
    before = [p.detach().clone() for p in model.parameters()]
    for batch in sampler:
        step = sampler.observe(model, images[batch], labels[batch], sample_loss)
        assert step.sample_grad_norms.shape == (4,)
        assert bool(torch.isfinite(step.sample_grad_norms).all())
        with torch.no_grad():
            for parameter, gradient in zip(
                model.parameters(), step.gradient, strict=True
            ):
                parameter.sub_(0.1 * gradient)
    assert set(sampler.metrics()) == {"isfedavg-sigma2", "isfedavg-g2"}
    assert any(
        not torch.equal(old, new.detach())
        for old, new in zip(before, model.parameters(), strict=True)
    )


def test_replace_batchnorm_keeps_the_parameter_names() -> None:
    model = batchnorm_resnet()
    names = [name for name, _ in model.named_parameters()]
    fixed = replace_batchnorm(model)
    assert [name for name, _ in fixed.named_parameters()] == names
    group_norm = dict(fixed.named_modules())["layer2.0.bn1"]
    assert isinstance(group_norm, nn.GroupNorm)
    assert group_norm.num_groups == 8  # gcd(32, 8 channels)


def test_batchnorm_in_eval_mode_is_served_and_keeps_its_running_statistics() -> None:
    model = batchnorm_resnet()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.eval()
    running = [b.clone() for b in model.buffers()]
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    step = weighted_sgd_step(
        model, x, y, Objective("classification"), lr=0.1, sample_weights=torch.ones(4)
    )
    assert bool(torch.isfinite(step.sample_grad_norms).all())
    for old, new in zip(running, model.buffers(), strict=True):
        assert torch.equal(old, new)

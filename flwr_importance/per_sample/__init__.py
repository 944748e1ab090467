"""Exact per-sample gradient norms and importance-weighted gradients of torch models.

What ISFedAvg's client needs at every local step (eqs. 8, 14, 29): each
sample's gradient norm and the weighted batch gradient, from one backward
pass, for the layers real models are made of (:mod:`.capture` lists them),
with torch.func as the fallback for any other layer (:mod:`.engine`).
Models whose layers mix a batch's samples are refused with the fix
(:mod:`.validation`).

Modules: :mod:`.layers` (the per-layer maths, pure functions), :mod:`.pieces`
(what a forward pass records of a layer call), :mod:`.capture` (which layers,
how they are recorded), :mod:`.recurrent` (LSTM, GRU and attention through
their linear pieces), :mod:`.engine` (the entry points), :mod:`.validation`.
"""

from flwr_importance.per_sample.engine import (
    NORM_CHUNK_SIZE,
    SampleLoss,
    layerwise_gradient_and_norms,
    model_device,
    norms_of,
    per_sample_grad_norms,
    vmap_gradient_and_norms,
    vmap_per_sample_grads,
    weighted_gradient_and_norms,
)
from flwr_importance.per_sample.validation import (
    SampleMixingLayerError,
    check_samples_independent,
    replace_batchnorm,
    sample_mixing_layers,
)

__all__ = [
    "NORM_CHUNK_SIZE",
    "SampleLoss",
    "SampleMixingLayerError",
    "check_samples_independent",
    "layerwise_gradient_and_norms",
    "model_device",
    "norms_of",
    "per_sample_grad_norms",
    "replace_batchnorm",
    "sample_mixing_layers",
    "vmap_gradient_and_norms",
    "vmap_per_sample_grads",
    "weighted_gradient_and_norms",
]

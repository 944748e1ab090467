"""ISFedAvg's ClientApp handler (Rizk, Vlaski, Sayed; METHODS.md §1).

The node keeps a probability ``p_n`` per local sample in its persistent
``context.state`` across rounds, draws each of its ``E_k`` mini-batches of
``B_k`` distinct samples with ``P(n in B) = B_k p_n``, steps with the
importance-weighted gradient of eq. 8, moves the batch's probabilities towards
the per-sample gradient norms (eq. 29), and reports the two statistics the
server needs for eq. 28. Reuse it with your own model and data through a
``TaskFactory``::

    from flwr.clientapp import ClientApp
    from flwr_importance.clientapps import make_evaluate_handler
    from flwr_importance.clientapps.isfedavg import make_isfedavg_train_handler

    app = ClientApp()
    app.train()(make_isfedavg_train_handler(my_task))
    app.evaluate()(make_evaluate_handler(my_task))

Only ``model``, ``objective``, ``x``, ``y``, ``lr`` and ``seed`` of the
:class:`~flwr_importance.clientapps.LocalTask` are used: ``E_k`` and ``B_k``
come from the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_importance.aggregation.isfedavg import (
    local_gradient_variance,
    realized_normalized_probs,
)
from flwr_importance.clientapps.common import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    config_number,
    load_global_model,
    make_evaluate_handler,
    model_reply,
    round_generators,
    server_round_of,
)
from flwr_importance.protocol import (
    ISFEDAVG_ADAPT_SAMPLE_PROBS,
    ISFEDAVG_BATCH_SIZE,
    ISFEDAVG_CLIENT_PROB,
    ISFEDAVG_GRADIENT_SQ_NORM,
    ISFEDAVG_LOCAL_STEPS,
    ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB,
    ISFEDAVG_NUM_CLIENTS,
    ISFEDAVG_SIGMA2,
)
from flwr_importance.sampling import systematic_sample, update_sample_probs
from flwr_importance.tasks import weighted_sgd_step

# --- The client contract: config keys the strategy sends ----------------------

# --- ... and metric keys it expects back ---------------------------------------

#: Where the node keeps its per-sample state in ``context.state``: an
#: ArrayRecord with ``probs`` (``p_n``) and ``grad-norms`` (the last
#: ``||grad Q_n||`` seen, NaN for samples never drawn).
SAMPLE_STATE_KEY = "isfedavg-sample-state"


@dataclass(frozen=True)
class RoundSettings:
    """What the server sent for this round (see the key constants above)."""

    client_prob: float
    num_clients: int
    local_steps: int
    batch_size: int
    adapt_sample_probs: bool
    min_relative_sample_prob: float

    @classmethod
    def from_message(cls, message: Message) -> RoundSettings:
        """Read and check the settings; a bad value raises ``ValueError``."""
        settings = cls(
            client_prob=config_number(message, ISFEDAVG_CLIENT_PROB),
            num_clients=int(config_number(message, ISFEDAVG_NUM_CLIENTS)),
            local_steps=int(config_number(message, ISFEDAVG_LOCAL_STEPS)),
            batch_size=int(config_number(message, ISFEDAVG_BATCH_SIZE)),
            adapt_sample_probs=_config_flag(message, ISFEDAVG_ADAPT_SAMPLE_PROBS),
            min_relative_sample_prob=config_number(
                message, ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB
            ),
        )
        if not 0 < settings.client_prob <= 1:
            raise ValueError(f"{ISFEDAVG_CLIENT_PROB} must lie in (0, 1]")
        if settings.num_clients < 1 or settings.local_steps < 1:
            raise ValueError(
                f"{ISFEDAVG_NUM_CLIENTS} and {ISFEDAVG_LOCAL_STEPS} must be >= 1"
            )
        if settings.batch_size < 1:
            raise ValueError(f"{ISFEDAVG_BATCH_SIZE} must be >= 1")
        if not 0 < settings.min_relative_sample_prob <= 1:
            raise ValueError(f"{ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB} must lie in (0, 1]")
        return settings


def _config_flag(message: Message, key: str) -> bool:
    """A boolean from the message's ``config`` record; absent or not a bool raises."""
    config = message.content.config_records.get("config")
    value = config.get(key) if config is not None else None
    if not isinstance(value, bool):
        raise ValueError(f"config '{key}' must be a boolean, got {value!r}")
    return value


@dataclass
class SampleState:
    """A node's per-sample probabilities and last gradient norms."""

    probs: NDArray[np.float64]
    grad_norms: NDArray[np.float64]

    @classmethod
    def uniform(cls, num_samples: int) -> SampleState:
        """``p_n = 1/N``, no norm seen yet."""
        return cls(
            np.full(num_samples, 1.0 / num_samples), np.full(num_samples, np.nan)
        )

    @classmethod
    def load(cls, state: RecordDict, num_samples: int) -> SampleState:
        """The stored state, or a uniform one on the first round.

        A stored state for another number of samples (the node's data changed)
        is discarded with a warning: its probabilities no longer mean anything.
        """
        if SAMPLE_STATE_KEY not in state.array_records:
            return cls.uniform(num_samples)
        record = state.array_records[SAMPLE_STATE_KEY]
        probs = record["probs"].numpy().astype(np.float64)
        if probs.shape != (num_samples,):
            log(
                WARNING,
                "ISFedAvg: stored sample probabilities are for %d samples, the node "
                "has %d; starting again from uniform",
                probs.size,
                num_samples,
            )
            return cls.uniform(num_samples)
        return cls(probs, record["grad-norms"].numpy().astype(np.float64))

    def save(self, state: RecordDict) -> None:
        """Store in ``state`` (the node's ``context.state``)."""
        state[SAMPLE_STATE_KEY] = ArrayRecord.from_array_dict(
            {"probs": Array(self.probs), "grad-norms": Array(self.grad_norms)}
        )


def importance_sampled_sgd(
    task: LocalTask,
    settings: RoundSettings,
    sample_state: SampleState,
    rng: np.random.Generator,
) -> dict[str, float]:
    """ISFedAvg's local steps (Algorithm 1, inner loop), in place on ``task.model``.

    Each step draws a batch of ``B`` distinct samples with inclusion
    probabilities ``pi_n = min(1, B p_n)`` capped and redistributed (Hartley–Rao
    systematic sampling) and steps with eq. 8,
    ``g = 1/(K p_k E B) sum_b 1/(N p_b) grad Q_b(w)``, where ``p_b = pi_b / B``
    is the *realized* normalized inclusion probability: it equals ``p_b``
    unless ``B p_b > 1``, and only it keeps the step unbiased under capping.
    The batch's ``p_n`` then follow eq. 29 (when adapting); the norms are those
    at the iterate where the step is made (**Decision**, METHODS.md §1).

    Parameters
    ----------
    task : LocalTask
        Model (updated in place), objective, data and ``lr`` (``mu``).
    settings : RoundSettings
        ``p_k``, ``K``, ``E``, ``B`` and the sample-probability options. A
        ``B`` above the number of local samples is lowered to it (logged).
    sample_state : SampleState
        Updated in place: probabilities (eq. 29) and last norms.
    rng : numpy.random.Generator
        Source of the mini-batch draws.

    Returns
    -------
    dict of str to float
        ``train-loss`` (mean over the steps of the unweighted batch loss before
        the step), ``num-steps``, ``isfedavg-sigma2`` (eq. 22, at the updated
        probabilities) and ``isfedavg-g2`` (``||grad P_k_hat||^2``, eq. 14).
    """
    num_samples = len(task.x)
    batch_size = settings.batch_size
    if batch_size > num_samples:
        log(
            WARNING,
            "ISFedAvg: batch size %d exceeds the node's %d samples; using %d",
            batch_size,
            num_samples,
            num_samples,
        )
        batch_size = num_samples
    client_scale = settings.num_clients * settings.client_prob
    parameters = list(task.model.parameters())
    # sum_e (1/(E B)) sum_b 1/(N p_b) grad Q_b, the eq. 14 gradient of the round.
    local_gradient = [torch.zeros_like(p) for p in parameters]
    loss_sum = 0.0
    for _ in range(settings.local_steps):
        # importance_batch would draw the same batch but not return the capped
        # inclusion probabilities the unbiased weights divide by.
        inclusion = batch_size * realized_normalized_probs(
            sample_state.probs, batch_size
        )
        batch = systematic_sample(inclusion, rng)
        x_batch, y_batch = task.x[batch], task.y[batch]
        with torch.no_grad():
            loss_sum += float(task.objective.loss(task.model, x_batch, y_batch))
        # 1/(K p_k E B) * 1/(N pi_b / B) = 1/(K p_k E N pi_b)
        weights = 1.0 / (
            client_scale * settings.local_steps * num_samples * inclusion[batch]
        )
        step = weighted_sgd_step(
            task.model,
            x_batch,
            y_batch,
            task.objective,
            lr=task.lr,
            sample_weights=torch.from_numpy(weights),
        )
        for accumulated, step_gradient in zip(
            local_gradient, step.gradient, strict=True
        ):
            accumulated += client_scale * step_gradient
        norms = step.sample_grad_norms.detach().double().numpy()
        sample_state.grad_norms[batch] = norms
        if settings.adapt_sample_probs:
            sample_state.probs = update_sample_probs(
                sample_state.probs, batch, norms, settings.min_relative_sample_prob
            )
    seen = ~np.isnan(sample_state.grad_norms)
    sigma2 = local_gradient_variance(
        realized_normalized_probs(sample_state.probs, batch_size),
        sample_state.grad_norms,
        seen,
        settings.local_steps,
        batch_size,
    )
    gradient_sq_norm = float(sum(g.double().pow(2).sum() for g in local_gradient))
    return {
        "train-loss": loss_sum / settings.local_steps,
        "num-steps": float(settings.local_steps),
        ISFEDAVG_SIGMA2: sigma2,
        ISFEDAVG_GRADIENT_SQ_NORM: gradient_sq_norm,
    }


def make_isfedavg_train_handler(task_factory: TaskFactory) -> ClientHandler:
    """ISFedAvg local training: importance-sampled batches, eq. 8 steps.

    Reads the round's settings from the ``config`` record (keys
    ``isfedavg-client-prob``, ``isfedavg-num-clients``,
    ``isfedavg-local-steps``, ``isfedavg-batch-size``,
    ``isfedavg-adapt-sample-probs``, ``isfedavg-min-relative-sample-prob``,
    and Flower's ``server-round``), trains with :func:`importance_sampled_sgd`
    from the node's stored sample probabilities (uniform on the first round),
    stores them back in ``context.state`` and replies with the model under
    ``arrays`` and the metrics ``isfedavg-sigma2``, ``isfedavg-g2``,
    ``train-loss``, ``num-steps`` and ``num-examples``. The mini-batch draws
    are seeded by the node and the round (:func:`round_generators`).
    """

    def train(message: Message, context: Context) -> Message:
        task = task_factory(context)
        load_global_model(task, message)
        settings = RoundSettings.from_message(message)
        numpy_rng, _ = round_generators(task, server_round_of(message))
        sample_state = SampleState.load(context.state, len(task.x))
        metrics = importance_sampled_sgd(task, settings, sample_state, numpy_rng)
        sample_state.save(context.state)
        return model_reply(
            message, task.model, {**metrics, "num-examples": len(task.x)}
        )

    return train


def make_isfedavg_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """ISFedAvg's handler set by message type: ``train`` and ``evaluate``."""
    return {
        "train": make_isfedavg_train_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }

"""ISFedAvg's data-level sampler: importance-sampled batches, eq. 8 weights, eq. 29.

Rizk, Vlaski, Sayed, "Optimal Importance Sampling for Federated Learning"
(ICASSP 2021). :class:`ImportanceSampler` is the DataLoader batch sampler of a
node's round: it draws the ``E_k`` batches of ``B_k`` samples the server
decided (:class:`RoundSettings`), by the per-sample probabilities ``p_n`` the
node keeps across rounds (:class:`SampleState`), weighs each sample's loss as
in eq. 8 (:func:`importance_loss_weights`), moves ``p_n`` towards the
per-sample gradient norms (eq. 29) and reports ``sigma2_k`` (eq. 22) and
``||grad P_k||^2`` (eq. 14). How to use it in your own train function:
:mod:`flwr_importance.clientapps.isfedavg`, which exports every name here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from logging import WARNING

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.common.logger import log
from numpy.typing import ArrayLike, NDArray
from torch import Tensor, nn
from torch.utils.data import Sampler

from flwr_importance import protocol
from flwr_importance.aggregation.isfedavg import (
    local_gradient_variance,
    realized_normalized_probs,
)
from flwr_importance.clientapps.messages import (
    config_flag,
    config_number,
    server_round_of,
)
from flwr_importance.per_sample import (
    SampleLoss,
    check_samples_independent,
    weighted_gradient_and_norms,
)
from flwr_importance.sampling.importance import update_sample_probs
from flwr_importance.sampling.pips import systematic_sample
from flwr_importance.tasks import WeightedStep

#: Where the node keeps its per-sample state in ``context.state``: an
#: ArrayRecord with ``probs`` (``p_n``) and ``grad-norms`` (the last
#: ``||grad Q_n||`` seen, NaN for samples never drawn).
SAMPLE_STATE_KEY = "isfedavg-sample-state"


@dataclass(frozen=True)
class RoundSettings:
    """What the server decided for this node and round (the train config).

    Attributes
    ----------
    client_prob : float
        ``p_k``, this node's realized normalized inclusion probability.
    num_clients : int
        ``K``, the number of connected nodes.
    local_steps : int
        ``E_k``: the number of local steps, in place of your epochs.
    batch_size : int
        ``B_k``: the mini-batch size, in place of yours.
    adapt_sample_probs : bool
        Whether ``p_n`` follow eq. 29 (False in the server's uniform mode).
    min_relative_sample_prob : float
        Floor on ``p_n`` as a fraction of ``1/N_k``.
    divide_by_local_steps : bool
        Whether each step divides eq. 8's loss by ``E_k`` (the server's
        ``keep_app_step_size=False``, the paper's step); False keeps your
        optimizer's own step size.
    """

    client_prob: float
    num_clients: int
    local_steps: int
    batch_size: int
    adapt_sample_probs: bool
    min_relative_sample_prob: float
    divide_by_local_steps: bool = True

    @property
    def step_divisor(self) -> int:
        """What each step's loss is divided by: ``E_k``, or 1 for your own step."""
        return self.local_steps if self.divide_by_local_steps else 1

    @classmethod
    def from_message(cls, message: Message) -> RoundSettings:
        """Read and check the settings; a bad value raises ``ValueError``."""
        settings = cls(
            client_prob=config_number(message, protocol.ISFEDAVG_CLIENT_PROB),
            num_clients=int(config_number(message, protocol.ISFEDAVG_NUM_CLIENTS)),
            local_steps=int(config_number(message, protocol.ISFEDAVG_LOCAL_STEPS)),
            batch_size=int(config_number(message, protocol.ISFEDAVG_BATCH_SIZE)),
            adapt_sample_probs=config_flag(
                message, protocol.ISFEDAVG_ADAPT_SAMPLE_PROBS
            ),
            min_relative_sample_prob=config_number(
                message, protocol.ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB
            ),
            divide_by_local_steps=config_flag(
                message, protocol.ISFEDAVG_DIVIDE_BY_LOCAL_STEPS, default=True
            ),
        )
        if not 0 < settings.client_prob <= 1:
            raise ValueError(f"{protocol.ISFEDAVG_CLIENT_PROB} must lie in (0, 1]")
        if settings.num_clients < 1 or settings.local_steps < 1:
            raise ValueError(
                f"{protocol.ISFEDAVG_NUM_CLIENTS} and "
                f"{protocol.ISFEDAVG_LOCAL_STEPS} must be >= 1"
            )
        if settings.batch_size < 1:
            raise ValueError(f"{protocol.ISFEDAVG_BATCH_SIZE} must be >= 1")
        if not 0 < settings.min_relative_sample_prob <= 1:
            raise ValueError(
                f"{protocol.ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB} must lie in (0, 1]"
            )
        return settings


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
        is discarded with a warning: its probabilities belong to other data.
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


def importance_loss_weights(
    batch_inclusion: ArrayLike,
    *,
    client_prob: float,
    num_clients: int,
    local_steps: int,
    num_samples: int,
) -> NDArray[np.float64]:
    """The eq. 8 weight of each batch sample's loss: ``1/(K p_k E N pi_b)``.

    Eq. 8 scales ``grad Q_b`` by ``1/(K p_k E B) * 1/(N p_b)``; with the
    realized normalized inclusion probability ``p_b = pi_b / B`` (``pi_b`` the
    probability that sample ``b`` is in the batch) this is ``1/(K p_k E N
    pi_b)``. Summing the weighted losses gives a step that, over the draws of
    clients and batches, is unbiased for ``1/E`` of the global gradient.

    Parameters
    ----------
    batch_inclusion : ArrayLike
        ``pi_b`` of the batch's samples, each in ``(0, 1]``.
    client_prob, num_clients, local_steps, num_samples : float, int, int, int
        ``p_k``, ``K``, ``E_k`` and the node's ``N_k``.

    Returns
    -------
    NDArray[np.float64]
        One weight per batch sample.

    Examples
    --------
    Uniform sampling (``pi_b = B/N``) by a node sampled surely (``K p_k = 1``)
    weighs each loss ``1/(E B)``, the mean over the round's samples:

    >>> importance_loss_weights(
    ...     [0.5, 0.5], client_prob=0.25, num_clients=4, local_steps=2, num_samples=4
    ... )
    array([0.25, 0.25])
    """
    inclusion = np.asarray(batch_inclusion, dtype=np.float64)
    return 1.0 / (client_prob * num_clients * local_steps * num_samples * inclusion)


class ImportanceSampler(Sampler[list[int]]):
    """A batch sampler drawing ``E_k`` batches of ``B_k`` samples by ``p_n``.

    Give it to your DataLoader as ``batch_sampler=``: iterating yields the
    round's ``local_steps`` (``E_k``) batches of ``batch_size`` (``B_k``)
    distinct sample indices, both decided by the server (they replace your
    epochs and batch size). Sample ``n`` is in a batch with probability
    ``pi_n = min(1, B p_n)``, capped and redistributed (Hartley–Rao
    systematic sampling). For every batch, call :meth:`observe` before the
    optimizer step (its per-sample gradient norms update ``p_n`` by eq. 29
    before the next batch is drawn), and weigh the per-sample losses with
    :meth:`weighted_loss` (eq. 8). :meth:`finish` stores ``p_n`` in
    ``context.state`` and returns the reply metrics.

    Batches are drawn one at a time, each after the previous one was
    observed, so use the DataLoader with ``num_workers=0`` (workers draw
    batches ahead; the sampler then raises).

    Parameters
    ----------
    settings : RoundSettings
        The round's settings. A ``B_k`` above the number of samples is
        lowered to it (logged).
    sample_state : SampleState
        ``p_n`` and the last norms; updated in place.
    rng : numpy.random.Generator
        Source of the batch draws.
    model : torch.nn.Module or None
        The model :meth:`observe` will see. When given, a model whose layers
        mix the samples of a batch (BatchNorm in training mode) is refused
        here, at the round's start, rather than at the first
        :meth:`observe`.

    Raises
    ------
    SampleMixingLayerError
        Naming each such layer and the fix
        (:func:`~flwr_importance.per_sample.replace_batchnorm`).

    Attributes
    ----------
    local_steps : int
        ``E_k``, the number of batches.
    batch_size : int
        ``B_k``, the size of each batch.
    settings : RoundSettings
        Everything the server sent for the round.
    sample_state : SampleState
        ``p_n`` and the last norms, as updated so far.
    """

    def __init__(
        self,
        settings: RoundSettings,
        sample_state: SampleState,
        *,
        rng: np.random.Generator,
        model: nn.Module | None = None,
    ) -> None:
        if model is not None:
            check_samples_independent(model)
        self.settings = settings
        self.sample_state = sample_state
        self._rng = rng
        num_samples = sample_state.probs.size
        self.local_steps = settings.local_steps
        self.batch_size = settings.batch_size
        if self.batch_size > num_samples:
            log(
                WARNING,
                "ISFedAvg: batch size %d exceeds the node's %d samples; using %d",
                self.batch_size,
                num_samples,
                num_samples,
            )
            self.batch_size = num_samples
        self._steps_drawn = 0
        self._batch: NDArray[np.intp] | None = None
        self._weights: NDArray[np.float64] | None = None
        self._observed = True
        # sum_e (1/(E B)) sum_b 1/(N p_b) grad Q_b: eq. 14's gradient estimate.
        self._round_gradient: list[Tensor] | None = None

    @classmethod
    def from_message(
        cls,
        message: Message,
        context: Context,
        *,
        num_samples: int,
        rng: np.random.Generator | None = None,
        model: nn.Module | None = None,
    ) -> ImportanceSampler:
        """The sampler for this train message, from the node's stored ``p_n``.

        Parameters
        ----------
        message : Message
            The server's train message (its config holds ``E_k``, ``B_k``...).
        context : Context
            The node's context; ``p_n`` live in ``context.state`` (uniform on
            the first round, and whenever ``num_samples`` changed).
        num_samples : int
            ``N_k``, the size of the dataset the indices point into.
        rng : numpy.random.Generator or None
            Source of the batch draws; by default seeded by the node id and
            the server round.
        model : torch.nn.Module or None
            Your model, checked now for layers that mix a batch's samples
            (see the class).
        """
        settings = RoundSettings.from_message(message)
        if rng is None:
            rng = np.random.default_rng([context.node_id, server_round_of(message)])
        return cls(
            settings,
            SampleState.load(context.state, num_samples),
            rng=rng,
            model=model,
        )

    def __len__(self) -> int:
        """``E_k``, the number of batches a DataLoader gets."""
        return self.local_steps

    def __iter__(self) -> Iterator[list[int]]:
        """The round's batches, each drawn by the probabilities of that moment."""
        while self._steps_drawn < self.local_steps:
            if not self._observed:
                raise RuntimeError(
                    "ISFedAvg: a batch was drawn before the previous one was "
                    "observed; call observe() for every batch before the next "
                    "(a DataLoader with num_workers > 0 draws ahead: use 0)"
                )
            # The realized inclusion probabilities, not p_n: only they keep
            # the eq. 8 weights unbiased when some B p_n > 1 is capped.
            inclusion = self.batch_size * realized_normalized_probs(
                self.sample_state.probs, self.batch_size
            )
            batch = systematic_sample(inclusion, self._rng)
            self._batch = batch
            self._weights = importance_loss_weights(
                inclusion[batch],
                client_prob=self.settings.client_prob,
                num_clients=self.settings.num_clients,
                local_steps=self.settings.step_divisor,
                num_samples=inclusion.size,
            )
            self._observed = False
            self._steps_drawn += 1
            yield batch.tolist()

    def loss_weights(self) -> Tensor:
        """The eq. 8 weights of the current batch's samples (float64, CPU)."""
        if self._weights is None:
            raise RuntimeError("ISFedAvg: no batch drawn yet")
        return torch.from_numpy(self._weights)

    def weighted_loss(self, sample_losses: Tensor) -> Tensor:
        """``sum_b c_b loss_b``: the eq. 8 loss of the current batch.

        Parameters
        ----------
        sample_losses : torch.Tensor
            Your loss of each batch sample, in batch order (``reduction="none"``),
            on any device.

        Raises
        ------
        ValueError
            If there is not one loss per batch sample.
        """
        weights = self.loss_weights()
        if sample_losses.shape != weights.shape:
            raise ValueError(
                f"need one loss per batch sample {tuple(weights.shape)}, got "
                f"{tuple(sample_losses.shape)} (use reduction='none')"
            )
        return (sample_losses * weights.to(sample_losses)).sum()

    def observe(
        self,
        model: nn.Module,
        inputs: Tensor,
        targets: Tensor,
        sample_loss: SampleLoss,
        *,
        l2: float = 0.0,
    ) -> WeightedStep:
        """Per-sample gradients of the current batch at the current weights.

        Call once per batch, before the optimizer step. The norms update the
        batch's ``p_n`` (eq. 29, when the server adapts them) and feed
        ``sigma2_k``; the weighted gradient adds to eq. 14's estimate.

        Parameters
        ----------
        model : torch.nn.Module
            Your model, on any device (the batch is moved to it).
        inputs, targets : torch.Tensor
            The batch, in the order the sampler gave its indices.
        sample_loss : SampleLoss
            Your loss with ``reduction="none"``.
        l2 : float
            Weight of ``||w||^2`` in each sample's loss, if your loss has one.

        Returns
        -------
        WeightedStep
            ``gradient``: ``sum_b c_b grad Q_b`` (what the backward pass of
            :meth:`weighted_loss` gives), in ``model.parameters()`` order;
            ``sample_grad_norms``: the ``(B,)`` norms.
        """
        if self._observed or self._batch is None:
            raise RuntimeError("ISFedAvg: observe() once per drawn batch")
        gradient, norms = weighted_gradient_and_norms(
            model, inputs, targets, sample_loss, l2, self.loss_weights()
        )
        # Eq. 14's estimate is the mean of the steps' unbiased gradients: the
        # weights divide by step_divisor, the mean by E_k.
        client_scale = (
            self.settings.num_clients
            * self.settings.client_prob
            * self.settings.step_divisor
            / self.local_steps
        )
        if self._round_gradient is None:
            self._round_gradient = [torch.zeros_like(g) for g in gradient]
        for accumulated, step_gradient in zip(
            self._round_gradient, gradient, strict=True
        ):
            accumulated += client_scale * step_gradient
        batch_norms = norms.detach().double().cpu().numpy()
        self.sample_state.grad_norms[self._batch] = batch_norms
        if self.settings.adapt_sample_probs:
            self.sample_state.probs = update_sample_probs(
                self.sample_state.probs,
                self._batch,
                batch_norms,
                self.settings.min_relative_sample_prob,
            )
        self._observed = True
        return WeightedStep(gradient=gradient, sample_grad_norms=norms)

    def metrics(self) -> dict[str, float]:
        """``isfedavg-sigma2`` (eq. 22) and ``isfedavg-g2`` (eq. 14) of the round.

        ``sigma2_k`` uses the updated probabilities and, per sample, the last
        norm seen (the paper's norms at ``w^o`` are unknown; samples never
        drawn take the mean squared norm of the others).

        Raises
        ------
        RuntimeError
            Before all ``E_k`` batches were drawn and observed.
        """
        if self._steps_drawn < self.local_steps or not self._observed:
            raise RuntimeError(
                f"ISFedAvg: {self._steps_drawn} of {self.local_steps} batches "
                "drawn; observe all of them before reporting"
            )
        assert self._round_gradient is not None  # at least one batch observed
        seen = ~np.isnan(self.sample_state.grad_norms)
        sigma2 = local_gradient_variance(
            realized_normalized_probs(self.sample_state.probs, self.batch_size),
            self.sample_state.grad_norms,
            seen,
            self.local_steps,
            self.batch_size,
        )
        gradient_sq_norm = float(
            sum(g.double().pow(2).sum() for g in self._round_gradient)
        )
        return {
            protocol.ISFEDAVG_SIGMA2: sigma2,
            protocol.ISFEDAVG_GRADIENT_SQ_NORM: gradient_sq_norm,
        }

    def finish(self, context: Context) -> dict[str, float]:
        """Store ``p_n`` in ``context.state``; return :meth:`metrics` for the reply."""
        self.sample_state.save(context.state)
        return self.metrics()

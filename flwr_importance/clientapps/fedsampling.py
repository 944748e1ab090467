"""FedSampling on the client.

Qi et al., "FedSampling: A Better Sampling Strategy for Federated Learning",
IJCAI 2023, Algorithm 1.

The messages and replies are the ``Client contract`` of
:class:`flwr_importance.strategies.FedSampling`. What it protects: the node's
true size ``|D_c|`` and the number of samples it kept ``|S_c|`` never leave
it (the size reply is a randomized response,
:func:`~flwr_importance.sampling.privatize_size`, and the train reply carries
no count).

From a quickstart-style ClientApp, the size query is one line (its torch-free
module :mod:`~flwr_importance.clientapps.private_sizes`, re-exported here) and
the train function keeps its model, data set, loss and device but, instead of
training with its optimizer, returns the gradient sum (the server takes the
SGD step, ``Theta <- Theta - eta sum_c G_c``)::

     app = ClientApp()
    +add_private_size_query(app, num_examples=lambda ctx: len(load_trainset(ctx)))

     @app.train()
     def train(msg, context):
         model = Net()
         model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
         model.to(device)
         trainset = load_trainset(context)
    +    plan = fedsampling_round(msg, num_examples=len(trainset))
    +    loader = DataLoader(Subset(trainset, plan.indices), batch_size=32)
    +    gradient = fedsampling_gradient(model, loader, torch.nn.CrossEntropyLoss(),
    +                                    plan=plan, lr=msg.content["config"]["lr"])
    +    return fedsampling_reply(msg, gradient)

No federated evaluation: Flower's evaluate replies are weighted by
``num-examples``, the size this method keeps private, so a FedSampling
ClientApp needs no ``@app.evaluate()`` (an existing one is never called) and
the strategy refuses ``fraction_evaluate > 0``; evaluate on the server instead
(``strategy.start(..., evaluate_fn=...)``, as the simulation app does).

The ready-made handlers (:func:`make_fedsampling_handlers`) are these same
functions over a :class:`~flwr_importance.clientapps.LocalTask`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from flwr_importance import protocol
from flwr_importance.clientapps._device import (
    Criterion,
    Unpack,
    criterion_batch_loss,
    inputs_and_targets,
    unpacked,
)
from flwr_importance.clientapps.local_task import (
    LocalTask,
    TaskFactory,
    received_task,
    task_batches,
)
from flwr_importance.clientapps.messages import (
    ClientHandler,
    config_number,
    message_config,
    server_round_of,
)
from flwr_importance.clientapps.private_sizes import (
    add_private_size_query,
    private_size_reply,
)
from flwr_importance.sampling.fedsampling import bernoulli_keep, keep_probability
from flwr_importance.tasks.training import BatchLoss, mean_gradient

__all__ = [
    "APP_EPSILON_KEY",
    "KEEP_STREAM",
    "REPLY_STREAM",
    "STREAM_BLOCK",
    "UNSAFE_REPRODUCIBLE_COINS_KEY",
    "FedSamplingRound",
    "add_private_size_query",
    "fedsampling_gradient",
    "fedsampling_reply",
    "fedsampling_round",
    "make_fedsampling_handlers",
    "make_fedsampling_train_handler",
    "make_size_query_handler",
    "node_bit_generator",
    "node_round_streams",
    "private_size_reply",
    "reproducible_coins",
    "round_coins",
    "seek_round_stream",
]


@dataclass(frozen=True, kw_only=True)
class FedSamplingRound:
    """The round's data sample, as the server's config decides it.

    Attributes
    ----------
    indices : tuple of int
        The local samples kept this round (``S_c``), increasing; feed them to
        ``torch.utils.data.Subset``. Each sample is kept independently with
        probability ``keep_probability``.
    keep_probability : float
        ``K / N_tilde``.
    samples_per_round : int
        ``K``, the number of samples the whole round aims for; ``G_c`` is
        normalized by it, never by ``len(indices)``.
    local_steps : int
        ``E``, the gradient steps on the kept samples that the server asks for
        (``local-steps``, 1 in the paper); :func:`fedsampling_gradient` takes
        them at your ``lr``, so your own number of epochs does not apply.
    """

    indices: tuple[int, ...]
    keep_probability: float
    samples_per_round: int
    local_steps: int


def fedsampling_round(
    message: Message, *, num_examples: int, rng: np.random.Generator | None = None
) -> FedSamplingRound:
    """Draw which of the node's samples this round keeps (Algorithm 1, l. 12).

    Reads ``samples-per-round`` (``K``), ``estimated-total-size``
    (``N_tilde >= K``) and ``local-steps`` (``E``, default 1) from the train
    message's config and keeps each of the ``num_examples`` samples with
    probability ``K / N_tilde``.

    Parameters
    ----------
    message : Message
        FedSampling's train message.
    num_examples : int
        The size of the local training set the indices refer to.
    rng : numpy.random.Generator, optional
        Source of the keep decisions (default: fresh OS entropy); the
        ready-made handler passes its seeded round generator.

    Returns
    -------
    FedSamplingRound
        The kept indices and the round's ``K`` and ``E``.

    Raises
    ------
    ValueError
        If the config lacks a key or ``local-steps`` is below 1.
    """
    samples_per_round = int(
        config_number(message, protocol.FEDSAMPLING_SAMPLES_PER_ROUND)
    )
    probability = keep_probability(
        samples_per_round,
        config_number(message, protocol.FEDSAMPLING_ESTIMATED_TOTAL_SIZE),
    )
    local_steps = int(config_number(message, protocol.LOCAL_STEPS, 1))
    if local_steps < 1:
        raise ValueError(f"{protocol.LOCAL_STEPS} must be >= 1, got {local_steps}")
    keep = bernoulli_keep(
        num_examples, probability, rng if rng is not None else np.random.default_rng()
    )
    return FedSamplingRound(
        indices=tuple(int(index) for index in np.flatnonzero(keep)),
        keep_probability=probability,
        samples_per_round=samples_per_round,
        local_steps=local_steps,
    )


def fedsampling_gradient(
    model: torch.nn.Module,
    batches: Iterable[Any],
    criterion: Criterion,
    *,
    plan: FedSamplingRound,
    lr: float | None = None,
    unpack: Unpack = inputs_and_targets,
) -> dict[str, torch.Tensor]:
    """``G_c = (1/K) sum_{s in S_c} g_s`` at the model, over the kept samples.

    The mean gradient of your loss over the samples the batches hold, times
    their number over ``K``: however the kept samples are cut into batches,
    the result is ``(1/K) sum_s grad Q_s``. Batches move to the model's
    device; the model's mode (train/eval) is left as you set it, its
    BatchNorm statistics and ``.grad`` fields are not touched.

    With ``plan.local_steps = E > 1`` (an extension, not in the paper) the
    node trains on its kept samples as FedAvg's local training would: ``E``
    full-batch steps ``w <- w - lr g(w)``, ``g`` the mean gradient over the
    kept samples (the first ``E - 1`` taken in place, the last one only
    counted). The result is then the sum of the ``E``
    normalized gradients, ``G_c = (|S_c| / K) (w_0 - w_E) / lr``: still
    normalized by the public ``K``, never by ``|S_c|``, and equal to the
    paper's ``G_c`` at ``E = 1``. With the server's ``server_lr`` equal to
    ``lr``, the server's step moves the model to the mean of the nodes'
    local models weighted by ``|S_c| / K``. Your optimizer is not used.

    Parameters
    ----------
    model : torch.nn.Module
        The received global model, on its device.
    batches : iterable
        The kept samples, each once, e.g. a ``DataLoader`` over
        ``Subset(trainset, plan.indices)``; iterated ``E`` times, so
        re-iterable when ``E > 1``.
    criterion : Criterion
        Your loss, the batch's mean (PyTorch's default ``reduction="mean"``),
        e.g. ``torch.nn.CrossEntropyLoss()``.
    plan : FedSamplingRound
        This round's sample (:func:`fedsampling_round`).
    lr : float, optional
        Step size of the local steps; needed only when ``E > 1``.
    unpack : Unpack
        Splits a batch into ``(inputs, targets)`` (e.g. for the dictionaries
        of Flower's quickstart, ``lambda batch: (batch["img"], batch["label"])``).

    Returns
    -------
    dict of str to torch.Tensor
        Keyed like ``model.state_dict()``: the mean normalized gradient of each
        parameter, zeros for buffers; zeros everywhere if nothing was kept.

    Raises
    ------
    ValueError
        If ``E > 1`` without a positive ``lr``, or samples were kept but the
        batches hold none.
    """
    return _fedsampling_gradient(
        model, _Counted(batches, unpack), criterion_batch_loss(criterion), plan, lr
    )


def _fedsampling_gradient(
    model: torch.nn.Module,
    kept: _Counted,
    batch_loss: BatchLoss,
    plan: FedSamplingRound,
    lr: float | None,
) -> dict[str, torch.Tensor]:
    """:func:`fedsampling_gradient` for a ``(model, inputs, targets) -> loss``."""
    if plan.local_steps > 1 and (lr is None or not lr > 0):
        raise ValueError(
            f"{protocol.LOCAL_STEPS}={plan.local_steps} needs a positive lr, got {lr!r}"
        )
    parameters = list(model.parameters())
    total = [torch.zeros_like(parameter) for parameter in parameters]
    if plan.indices:
        for step in range(plan.local_steps):
            mean = mean_gradient(model, kept, batch_loss)
            # |S_c| is known only once the batches have been read.
            scale = kept.num_samples / plan.samples_per_round
            with torch.no_grad():
                for parameter, accumulated, gradient in zip(
                    parameters, total, mean, strict=True
                ):
                    accumulated += gradient * scale
                    if step < plan.local_steps - 1:
                        assert lr is not None
                        parameter.sub_(lr * gradient)
    names = [name for name, _ in model.named_parameters()]
    by_name = dict(zip(names, total, strict=True))
    return {
        key: by_name.get(key, torch.zeros_like(value))
        for key, value in model.state_dict().items()
    }


class _Counted:
    """Batches as ``(inputs, targets)``, counting the samples of the last pass."""

    def __init__(self, batches: Iterable[Any], unpack: Unpack) -> None:
        self.batches = batches
        self.unpack = unpack
        self.num_samples = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.num_samples = 0
        for inputs, targets in unpacked(self.batches, self.unpack):
            self.num_samples += len(targets)
            yield inputs, targets


def fedsampling_reply(message: Message, gradient: dict[str, torch.Tensor]) -> Message:
    """The train reply: ``G_c`` alone, under the received model's record name.

    No MetricRecord: neither ``|D_c|`` nor ``|S_c|`` may be sent. Under
    SecAgg+ (the config holds ``secure-sum-weight``) the reply carries that
    public number as ``num-examples``, the same on every node: SecAgg+
    weights each masked ``G_c`` by it, so the server can unmask their sum
    (docs/privacy.md).

    Raises
    ------
    ValueError
        If the train message does not carry exactly one ArrayRecord.
    """
    names = list(message.content.array_records)
    if len(names) != 1:
        raise ValueError(f"expected one ArrayRecord in the train message, got {names}")
    content = RecordDict({names[0]: ArrayRecord(gradient)})
    if protocol.SECURE_SUM_WEIGHT in message_config(message):
        weight = int(config_number(message, protocol.SECURE_SUM_WEIGHT))
        content[protocol.METRIC_RECORD] = MetricRecord({protocol.NUM_EXAMPLES: weight})
    return Message(content, reply_to=message)


#: Draws in one block of a node's FedSampling stream (far more than a round
#: takes): round ``t``'s keep decisions start at block ``2 t``
#: (:data:`KEEP_STREAM`), its size reply at block ``2 t + 1``
#: (:data:`REPLY_STREAM`).
STREAM_BLOCK = 2**64
KEEP_STREAM = 0
REPLY_STREAM = 1


def node_bit_generator(node_seed: int) -> np.random.PCG64:
    """The start of a node's FedSampling stream: ``PCG64(SeedSequence(node_seed))``."""
    return np.random.PCG64(np.random.SeedSequence(node_seed))


def seek_round_stream(
    bit_generator: np.random.PCG64, server_round: int, stream: int
) -> None:
    """Advance a node's stream from its start to a round's block of draws.

    ``stream`` is :data:`KEEP_STREAM` or :data:`REPLY_STREAM`. Blocks never
    overlap, so the size reply's coin is independent of which samples stay,
    and every round's draws of every node are its own; positioning a stream
    costs a few microseconds, so the FedSampling benchmark's pooled path
    repositions one generator per node and round (thousands of nodes) to
    draw what the ClientApps draw.
    """
    if stream not in (KEEP_STREAM, REPLY_STREAM):
        raise ValueError(
            f"stream must be {KEEP_STREAM} or {REPLY_STREAM}, got {stream}"
        )
    bit_generator.advance((2 * server_round + stream) * STREAM_BLOCK)


def node_round_streams(
    node_seed: int, server_round: int
) -> tuple[np.random.Generator, np.random.Generator]:
    """A node's seeded draws in a round, keep then size reply: unsafe for privacy.

    Anyone who knows ``node_seed`` replays them; the ready-made handlers use
    them only when the run config sets :data:`UNSAFE_REPRODUCIBLE_COINS_KEY`.

    Both are blocks of the node's one stream (:func:`node_bit_generator`,
    :func:`seek_round_stream`); the FedSampling benchmark draws from the same
    blocks, so it keeps the samples the ClientApps keep
    (``tests/benchmarks/test_fedsampling.py``).

    Parameters
    ----------
    node_seed : int
        The node's seed (``LocalTask.seed``).
    server_round : int
        The round.

    Returns
    -------
    tuple of numpy.random.Generator
        The keep decisions' generator and the size reply's.

    Examples
    --------
    >>> keep, reply = node_round_streams(7, 1)
    >>> start = node_bit_generator(7)
    >>> seek_round_stream(start, 1, KEEP_STREAM)
    >>> bool(keep.random() == np.random.Generator(start).random())
    True
    """
    generators = []
    for stream in (KEEP_STREAM, REPLY_STREAM):
        bit_generator = node_bit_generator(node_seed)
        seek_round_stream(bit_generator, server_round, stream)
        generators.append(np.random.Generator(bit_generator))
    keep, reply = generators
    return keep, reply


#: Run config: ``true`` makes the ready-made handlers draw their coins from
#: the seeded streams of :func:`node_round_streams`, which anyone who knows
#: the run config and the partition ids (the server) can replay: unsafe for
#: privacy, for benchmarks and tests that need the same draws in every run.
UNSAFE_REPRODUCIBLE_COINS_KEY = "fedsampling-unsafe-reproducible-coins"
#: Run config: the app's epsilon, the ready-made size handler's default cap.
APP_EPSILON_KEY = "fedsampling-epsilon"


def reproducible_coins(context: Context) -> bool:
    """Whether the run config turns on :data:`UNSAFE_REPRODUCIBLE_COINS_KEY`."""
    return bool(context.run_config.get(UNSAFE_REPRODUCIBLE_COINS_KEY, False))


def round_coins(
    task: LocalTask, message: Message, context: Context
) -> tuple[np.random.Generator, np.random.Generator]:
    """The ready-made handlers' coins this round: keep decisions, then size reply.

    Fresh OS entropy for each, unless the run config turns on
    :data:`UNSAFE_REPRODUCIBLE_COINS_KEY` (then :func:`node_round_streams`).
    """
    if reproducible_coins(context):
        return node_round_streams(task.seed, server_round_of(message))
    return np.random.default_rng(), np.random.default_rng()


def make_size_query_handler(
    task_factory: TaskFactory, max_epsilon: float | None = None
) -> ClientHandler:
    """The ready-made ``query.sizes``: :func:`private_size_reply` of the task's size.

    The cap per reply: ``max_epsilon``, else the node config's
    ``fedsampling-max-epsilon``, else the app's epsilon (run config
    ``fedsampling-epsilon``). Coins: :func:`round_coins`.
    """

    def size_query(message: Message, context: Context) -> Message:
        task = task_factory(context)
        _, reply_rng = round_coins(task, message, context)
        cap = max_epsilon
        if cap is None and APP_EPSILON_KEY in context.run_config:
            node_cap = context.node_config.get(
                protocol.FEDSAMPLING_MAX_EPSILON_NODE_KEY,
                context.run_config[APP_EPSILON_KEY],
            )
            cap = float(node_cap)
        return private_size_reply(
            message,
            context,
            num_examples=len(task.x),
            max_epsilon=cap,
            rng=reply_rng,
            reproducible_coins=reproducible_coins(context),
        )

    return size_query


def make_fedsampling_train_handler(task_factory: TaskFactory) -> ClientHandler:
    """The ready-made train handler: :func:`fedsampling_round` and friends on the task.

    The keep decisions come from :func:`round_coins`; the loss is the task's
    objective (regularizer included) and the local steps (when ``E > 1``)
    use the task's ``lr``.
    """

    def train(message: Message, context: Context) -> Message:
        task = received_task(task_factory, message, context)
        keep_rng, _ = round_coins(task, message, context)
        plan = fedsampling_round(message, num_examples=len(task.x), rng=keep_rng)
        kept = _Counted(task_batches(task, plan.indices), inputs_and_targets)
        gradient = _fedsampling_gradient(
            task.model, kept, task.objective.loss, plan, task.lr
        )
        return fedsampling_reply(message, gradient)

    return train


def make_fedsampling_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """FedSampling's handler set: ``query.sizes`` and ``train``, no ``evaluate``."""
    return {
        protocol.query_message_type(protocol.SIZES_QUERY): make_size_query_handler(
            task_factory
        ),
        "train": make_fedsampling_train_handler(task_factory),
    }

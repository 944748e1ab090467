"""FedSampling's ClientApp handlers (Qi et al., IJCAI 2023), and the true-size reply
of the size-weighted client sampling baseline.

Privacy contract of the FedSampling handlers: the node's true size ``|D_c|`` and
the number of samples it kept ``|S_c|`` never leave it. The size query is
answered by randomized response (:func:`~flwr_importance.sampling.privatize_size`);
the train reply carries only ``G_c``, an ArrayRecord shaped like the model, and
no MetricRecord at all (in particular not Flower's usual ``num-examples``)::

    from flwr.clientapp import ClientApp
    from flwr_importance.clientapps.fedsampling import (
        make_fedsampling_train_handler, make_size_query_handler)

    app = ClientApp()
    app.query("sizes")(make_size_query_handler(my_task))
    app.train()(make_fedsampling_train_handler(my_task))
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from flwr_importance.aggregation.fedsampling import bernoulli_keep, keep_probability
from flwr_importance.clientapps.common import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    config_number,
    load_global_model,
    round_generators,
    server_round_of,
)
from flwr_importance.protocol import (
    FEDSAMPLING_SIZE_RESPONSE,
    NUM_EXAMPLES,
)
from flwr_importance.sampling import privatize_size
from flwr_importance.tasks import full_gradient


def make_size_query_handler(
    task_factory: TaskFactory, max_epsilon: float | None = None
) -> ClientHandler:
    """Answer ``query.sizes`` by randomized response (paper, eq. 1).

    Reads ``max-size`` (``M``) and ``epsilon`` from the config and replies
    ``MetricRecord({"size-response": r})`` with ``r`` in ``{1..M-1}``: the
    clipped true size with probability ``alpha``, else a uniform draw. Each
    round's reply is eps-LDP; replies of different rounds are independent, so
    over ``T`` rounds the privacy losses add up to ``T eps`` unless replies are
    de-linked from the node (the paper's client anonymity, Section 3.5.2).

    Parameters
    ----------
    task_factory : TaskFactory
        Builds the node's :class:`LocalTask` (only its data size is used).
    max_epsilon : float, optional
        The largest privacy budget this node accepts. The server chooses
        ``epsilon`` (every node must use the same one for the estimate), so a
        node that does not trust it to ask for a small one sets this cap: a
        query asking for more is refused with an error reply.
    """

    def size_query(message: Message, context: Context) -> Message:
        task = task_factory(context)
        max_size = int(config_number(message, "max-size"))
        epsilon = config_number(message, "epsilon")
        if max_epsilon is not None and epsilon > max_epsilon:
            raise ValueError(
                f"the server asks for epsilon={epsilon:g}, this node allows at "
                f"most {max_epsilon:g}"
            )
        numpy_rng, _ = round_generators(task, server_round_of(message))
        # A child stream: the train handler's Bernoulli draws use the parent, and
        # the truthful-answer coin must not be correlated with which samples stay.
        (reply_rng,) = numpy_rng.spawn(1)
        response = privatize_size(len(task.x), max_size, epsilon, reply_rng)
        content = RecordDict(
            {"metrics": MetricRecord({FEDSAMPLING_SIZE_RESPONSE: response})}
        )
        return Message(content, reply_to=message)

    return size_query


def make_fedsampling_train_handler(task_factory: TaskFactory) -> ClientHandler:
    """Sample local data with probability ``K / N_tilde``, reply ``G_c``.

    Reads ``samples-per-round`` (``K``), ``estimated-total-size``
    (``N_tilde >= K``) and optionally ``local-steps`` (``E``, default 1) from
    the config; keeps each local sample independently with probability
    ``K / N_tilde`` (the first draws of the round's NumPy generator, see
    :func:`~flwr_importance.clientapps.common.round_generators`) and replies
    with ``G_c = (1/K) sum_{s in S_c} g_s``, the gradients taken at the
    received model, as the ``arrays`` ArrayRecord with the model's keys
    (buffers, if any, get zeros). A node that kept nothing replies zeros, so
    its reply looks like any other.

    With ``E > 1`` (an extension, not in the paper) the node takes ``E`` local
    steps ``w <- w - lr (1/K) sum_{s in S_c} grad Q_s(w)`` on the same kept
    samples (``lr`` from the :class:`LocalTask`) and replies with the mean of
    the ``E`` normalized gradients, ``(w_0 - w_E) / (E lr)``: still normalized by
    the public ``K``, never by ``|S_c|``.

    The reply has no MetricRecord: neither ``|D_c|`` nor ``|S_c|`` is sent.
    """

    def train(message: Message, context: Context) -> Message:
        task = task_factory(context)
        load_global_model(task, message)
        samples_per_round = int(config_number(message, "samples-per-round"))
        probability = keep_probability(
            samples_per_round, config_number(message, "estimated-total-size")
        )
        local_steps = int(config_number(message, "local-steps", 1))
        if local_steps < 1:
            raise ValueError(f"local-steps must be >= 1, got {local_steps}")
        numpy_rng, _ = round_generators(task, server_round_of(message))
        kept = torch.from_numpy(bernoulli_keep(len(task.x), probability, numpy_rng))
        gradient = _mean_normalized_gradient(
            task, task.x[kept], task.y[kept], samples_per_round, local_steps
        )
        content = RecordDict({"arrays": ArrayRecord(gradient)})
        return Message(content, reply_to=message)

    return train


def _mean_normalized_gradient(
    task: LocalTask,
    x_kept: torch.Tensor,
    y_kept: torch.Tensor,
    samples_per_round: int,
    local_steps: int,
) -> dict[str, torch.Tensor]:
    """Mean over ``local_steps`` of ``(1/K) sum_s g_s``, keyed like the state dict."""
    parameters = dict(task.model.named_parameters())
    total = {name: torch.zeros_like(value) for name, value in parameters.items()}
    if len(x_kept) > 0:
        # full_gradient is the mean over the kept samples; times |S_c| / K it is
        # (1/K) sum_s g_s.
        scale = len(x_kept) / samples_per_round
        for step in range(local_steps):
            step_gradient = full_gradient(task.model, x_kept, y_kept, task.objective)
            with torch.no_grad():
                for (name, parameter), gradient in zip(
                    parameters.items(), step_gradient, strict=True
                ):
                    total[name] += scale * gradient
                    if step < local_steps - 1:
                        parameter.sub_(task.lr * scale * gradient)
    return {
        name: total[name] / local_steps if name in total else torch.zeros_like(value)
        for name, value in task.model.state_dict().items()
    }


def make_true_size_handler(task_factory: TaskFactory) -> ClientHandler:
    """Answer ``query.sizes`` with the TRUE size (``num-examples``), unprotected.

    For the size-weighted client sampling baseline
    (:class:`~flwr_importance.strategies.size_weighted.SizeWeightedSampling`),
    which needs every node's true size: exactly what FedSampling avoids.
    """

    def true_size(message: Message, context: Context) -> Message:
        task = task_factory(context)
        content = RecordDict({"metrics": MetricRecord({NUM_EXAMPLES: len(task.x)})})
        return Message(content, reply_to=message)

    return true_size


def make_fedsampling_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """FedSampling's handler set: ``query.sizes`` and ``train``.

    No ``evaluate``: the stock evaluate reply carries ``num-examples``, the size
    this method keeps private.
    """
    return {
        "query.sizes": make_size_query_handler(task_factory),
        "train": make_fedsampling_train_handler(task_factory),
    }

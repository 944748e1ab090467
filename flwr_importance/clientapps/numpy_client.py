"""Keep your own ``NumPyClient`` on the legacy API: the method's calls served around it.

The legacy strategies of :mod:`flwr_importance.compat` send more than FedAvg's
``fit`` and ``evaluate``: size, norm and loss queries, and train calls that
expect a few extra metrics (the message type in the config, see
:mod:`flwr_importance.legacy_wire`). :func:`importance_client_fn` wraps your
project's ``client_fn`` so that your own client answers them, with your
``train()``, optimizer, device and validation set::

    from flwr.client import ClientApp
    from flwr_importance import compat

    app = ClientApp(client_fn=compat.importance_client_fn(client_fn))

Which messages each method sends, and what their replies must hold, is the
section Client contract of its strategy class:
:class:`~flwr_importance.strategies.MDSampling`,
:class:`~flwr_importance.strategies.ClusteredSampling`,
:class:`~flwr_importance.strategies.OptimalClientSampling` (OCS and AOCS) and
:class:`~flwr_importance.strategies.PowerOfChoice`. Your client's ``fit`` and
``evaluate`` are the only code that touches the model; each message runs the
Message-API client helper of its type on them:

- a size query: the count your ``fit`` reported last in this run; before any
  ``fit``, ``num_examples(context)``; without it, your ``fit`` run once on
  your client's own initial parameters (``get_parameters``), logged: one
  extra local training per node per run;
- a norm query: your ``fit`` on the received model (the Message-API
  :func:`~flwr_importance.clientapps.variance_reduced.norm_query_handler`),
  the update ``fit(w) - w`` kept in ``context.state`` so that a sampled
  node's train call sends it without training again
  (:class:`~flwr_importance.clientapps.variance_reduced.KeptUpdateMod`);
- a loss query: your ``evaluate`` (the Message-API
  :func:`~flwr_importance.clientapps.loss.loss_query_handler`);
- a train call: your ``fit``, its example count as ``num-examples`` and the
  metric ``train_loss_key`` as ``train-loss``.

A call without the transport's message type (Flower's own ``FedAvg`` train,
every federated evaluation) goes to your client unchanged. ISFedAvg, FOLB and
FedSampling need more than a ``fit`` and an ``evaluate`` give (importance-
sampled steps, the local gradient, a private size and the kept samples'
gradient sum): their calls raise, naming the ready-made client that serves
them (:func:`~flwr_importance.compat.handler_client_fn`).

This module imports no ML framework: your client brings its own.
``compat.ImportanceClient`` and ``compat.importance_client_fn`` load it on
first use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from logging import INFO

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
)
from flwr.client import Client
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.compat.client.client import (
    maybe_call_evaluate,
    maybe_call_fit,
    maybe_call_get_parameters,
    maybe_call_get_properties,
)
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.clientapps.legacy_calls import (
    fit_reply,
    message_from_call,
    reply_scalars,
)
from flwr_importance.clientapps.loss import loss_query_handler
from flwr_importance.clientapps.messages import (
    arrays_reply,
    message_arrays,
    message_config,
    metrics_reply,
)
from flwr_importance.clientapps.sizes import (
    SampleCount,
    checked_sample_count,
    size_reply,
)
from flwr_importance.clientapps.variance_reduced import (
    KeptUpdateMod,
    norm_query_handler,
)
from flwr_importance.legacy_wire import (
    MESSAGE_TYPE_KEY,
    legacy_scalars,
    numeric_metrics,
    parameters_of,
)

#: The metric holding the train loss in Flower's ``NumPyClient`` quickstarts.
QUICKSTART_TRAIN_LOSS_KEY = "train_loss"

#: ``context.state`` key of the sample count the client's ``fit`` reported last.
SAMPLE_COUNT_STATE_KEY = "importance-client-sample-count"

#: Config keys of the methods whose client needs more than ``fit`` and
#: ``evaluate`` give, and why, for the error their calls raise.
UNSERVED_METHODS: Mapping[str, str] = {
    protocol.ISFEDAVG_CLIENT_PROB: (
        "ISFedAvg (its local steps sample the data by importance)"
    ),
    protocol.PROXIMAL_MU: "FOLB (its reply carries the local gradient too)",
    protocol.FEDSAMPLING_EPSILON: "FedSampling (its size reply is randomized)",
    protocol.FEDSAMPLING_SAMPLES_PER_ROUND: (
        "FedSampling (its reply is the kept samples' gradient sum)"
    ),
}

_OK = Status(code=Code.OK, message="Success")


class ImportanceClient(Client):
    """Your ``Client`` (or ``NumPyClient``) answering the legacy strategies' calls.

    A call whose config names a message type (``compat-message-type``) is
    served by the Message-API client helper of that type, run on your
    client's ``fit`` and ``evaluate`` (see the module's list); any other
    call goes to your client unchanged.

    Parameters
    ----------
    client : Client
        Your client, as your ``client_fn`` returns it
        (``FlowerClient(...).to_client()``).
    context : Context
        The node's context; its ``state`` keeps the kept update and the
        sample count across the node's calls.
    num_examples : callable, optional
        ``context -> n``, the node's number of training samples, for a size
        query that comes before any ``fit`` (see :func:`importance_client_fn`).
    train_loss_key : str (default: ``"train_loss"``)
        The metric of your ``fit`` holding its train loss (OCS and AOCS need
        it; Flower's quickstarts report ``"train_loss"``).
    """

    def __init__(
        self,
        client: Client,
        context: Context,
        *,
        num_examples: SampleCount | None = None,
        train_loss_key: str = QUICKSTART_TRAIN_LOSS_KEY,
    ) -> None:
        self.client = client
        self.node_context = context
        self.num_examples = num_examples
        self.train_loss_key = train_loss_key
        kept_update = KeptUpdateMod()
        self.handlers: dict[str, Callable[[Message, Context], Message]] = {
            protocol.query_message_type(protocol.SIZES_QUERY): self._size,
            protocol.query_message_type(protocol.NORM_QUERY): norm_query_handler(
                self._train
            ),
            protocol.query_message_type(protocol.LOSS_QUERY): loss_query_handler(
                self._evaluate
            ),
            MessageType.TRAIN: lambda message, context: kept_update(
                message, context, self._train
            ),
        }

    # -- the legacy calls ------------------------------------------------------
    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        """A query without arrays (sizes), or your ``get_properties``."""
        message_type = ins.config.get(MESSAGE_TYPE_KEY)
        if message_type is None:
            return maybe_call_get_properties(self.client, ins)
        reply = self._serve([], ins, str(message_type))
        return GetPropertiesRes(status=_OK, properties=reply_scalars(reply))

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        """Your client's ``get_parameters``."""
        return maybe_call_get_parameters(self.client, ins)

    def fit(self, ins: FitIns) -> FitRes:
        """A method's train call or query with a model, or your plain ``fit``."""
        message_type = ins.config.get(MESSAGE_TYPE_KEY)
        if message_type is None:
            return maybe_call_fit(self.client, ins)
        arrays, count, metrics = fit_reply(
            self._serve(parameters_to_ndarrays(ins.parameters), ins, str(message_type))
        )
        return FitRes(
            status=_OK,
            parameters=ndarrays_to_parameters(arrays),
            num_examples=count,
            metrics=metrics,
        )

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        """Your client's ``evaluate`` (federated evaluation is FedAvg's)."""
        return maybe_call_evaluate(self.client, ins)

    # -- serving a method's message -------------------------------------------
    def _serve(
        self,
        arrays: Sequence[NDArray[np.generic]],
        ins: FitIns | GetPropertiesIns,
        message_type: str,
    ) -> Message:
        """Run the handler of ``message_type`` on the message the call carries.

        Raises
        ------
        ValueError
            For a message type no handler serves, or a method whose client
            needs more than ``fit`` and ``evaluate`` (:data:`UNSERVED_METHODS`).
        """
        for key, method in UNSERVED_METHODS.items():
            if key in ins.config:
                raise ValueError(
                    f"ImportanceClient cannot serve {method}: the '{message_type}' "
                    f"call carries '{key}'; serve this method with "
                    "compat.handler_client_fn and its make_<method>_handlers"
                )
        handler = self.handlers.get(message_type)
        if handler is None:
            raise ValueError(
                f"ImportanceClient has no handler for message type "
                f"'{message_type}' (it serves {sorted(self.handlers)} and passes "
                f"calls without '{MESSAGE_TYPE_KEY}' to your client)"
            )
        message = message_from_call(
            arrays, ins.config, message_type=message_type, context=self.node_context
        )
        return handler(message, self.node_context)

    def _train(self, message: Message, context: Context) -> Message:
        """Your ``fit`` as a Message-API train function.

        The reply holds the trained model under ``"arrays"`` and your metrics
        plus ``num-examples`` (your ``fit``'s count, also kept as the node's
        size) and ``train-loss`` (copied from ``train_loss_key``, when your
        ``fit`` reports it).
        """
        fit_res = maybe_call_fit(
            self.client,
            FitIns(parameters_of(message_arrays(message)), _config(message)),
        )
        _check_status(fit_res.status, "fit")
        self._keep_sample_count(fit_res.num_examples)
        metrics = numeric_metrics(fit_res.metrics) or MetricRecord()
        metrics[protocol.NUM_EXAMPLES] = fit_res.num_examples
        if self.train_loss_key in metrics:
            metrics[protocol.TRAIN_LOSS] = metrics[self.train_loss_key]
        trained = ArrayRecord(parameters_to_ndarrays(fit_res.parameters))
        return arrays_reply(message, trained, metrics)

    def _evaluate(self, message: Message, context: Context) -> Message:
        """Your ``evaluate`` as a Message-API evaluate function.

        The reply's metrics are yours plus ``loss`` and ``num-examples`` (the
        loss and count your ``evaluate`` returns).
        """
        evaluate_res = maybe_call_evaluate(
            self.client,
            EvaluateIns(parameters_of(message_arrays(message)), _config(message)),
        )
        _check_status(evaluate_res.status, "evaluate")
        metrics = numeric_metrics(evaluate_res.metrics) or MetricRecord()
        metrics[protocol.LOSS] = evaluate_res.loss
        metrics[protocol.NUM_EXAMPLES] = evaluate_res.num_examples
        return metrics_reply(message, metrics)

    def _size(self, message: Message, context: Context) -> Message:
        """The size query's reply: the node's training sample count."""
        return size_reply(message, num_examples=self.sample_count())

    # -- the node's sample count ----------------------------------------------
    def sample_count(self) -> int:
        """The node's number of training samples.

        The count your ``fit`` reported last in this run; before any ``fit``,
        ``num_examples(context)``; without that, your ``fit`` run once on your
        client's own initial parameters, its count kept for the run (logged).

        Raises
        ------
        ValueError
            Without ``num_examples``, when your client has no
            ``get_parameters`` to start that one ``fit`` from.
        """
        kept = self.node_context.state.get(SAMPLE_COUNT_STATE_KEY)
        if isinstance(kept, ConfigRecord):
            return int(kept[protocol.NUM_EXAMPLES])  # type: ignore[arg-type]
        if self.num_examples is not None:
            return checked_sample_count(
                self.num_examples(self.node_context), source="num_examples"
            )
        initial = maybe_call_get_parameters(self.client, GetParametersIns(config={}))
        if initial.status.code != Code.OK or not initial.parameters.tensors:
            raise ValueError(
                "the size query came before any fit, and the client has no "
                "get_parameters to run one from: pass num_examples=(context -> "
                "number of training samples) to importance_client_fn"
            )
        log(
            INFO,
            "node %d: no num_examples given: running the client's fit once on its "
            "own initial parameters to learn its sample count",
            self.node_context.node_id,
        )
        fit_res = maybe_call_fit(self.client, FitIns(initial.parameters, {}))
        _check_status(fit_res.status, "fit")
        return self._keep_sample_count(fit_res.num_examples)

    def _keep_sample_count(self, count: int) -> int:
        """Keep the count a ``fit`` reported as the node's size (checked)."""
        count = checked_sample_count(count, source="the client's fit")
        self.node_context.state[SAMPLE_COUNT_STATE_KEY] = ConfigRecord(
            {protocol.NUM_EXAMPLES: count}
        )
        return count


def importance_client_fn(
    client_fn: Callable[[Context], Client],
    *,
    num_examples: SampleCount | None = None,
    train_loss_key: str = QUICKSTART_TRAIN_LOSS_KEY,
) -> Callable[[Context], Client]:
    """Your ``client_fn``, its client answering the legacy strategies' calls.

    ``ClientApp(client_fn=importance_client_fn(client_fn))`` runs every
    method whose client needs only sizes, update norms and losses (``md``,
    ``clustered``, ``ocs``, ``aocs``, ``power-of-choice``) on your own client, and plain
    FedAvg unchanged (:class:`ImportanceClient`).

    Parameters
    ----------
    client_fn : callable
        Your ``context -> Client`` (``FlowerClient(...).to_client()``).
    num_examples : callable, optional
        ``context -> n``, the node's number of training samples, for the size
        query of MD, clustered sampling and Power-of-Choice, which comes before
        any ``fit``. Without it, each node runs your ``fit`` once more, on its
        client's initial parameters (``get_parameters``), the first time it is
        asked: one extra local training per node per run.
    train_loss_key : str (default: ``"train_loss"``)
        The metric of your ``fit`` holding its train loss; OCS and AOCS need
        it, the other methods pass it on as ``train-loss`` when it is there.
    """

    def wrapped_client_fn(context: Context) -> Client:
        return ImportanceClient(
            client_fn(context),
            context,
            num_examples=num_examples,
            train_loss_key=train_loss_key,
        )

    return wrapped_client_fn


def _config(message: Message) -> dict[str, bool | bytes | float | int | str]:
    """The message's config (its single ConfigRecord) as your client's legacy one."""
    return legacy_scalars(message_config(message), "config")


def _check_status(status: Status, call: str) -> None:
    """Raise when the client's ``call`` did not succeed."""
    if status.code != Code.OK:
        raise RuntimeError(f"the client's {call} failed: {status.message}")

"""FedSampling on Flower's legacy Strategy API, with or without SecAgg+."""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO, WARNING
from typing import Any, ClassVar

from flwr.common import FitIns, FitRes, Parameters
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.workflow import SecAggPlusWorkflow

from flwr_importance import protocol
from flwr_importance.aggregation.secure_sum import (
    check_no_wraparound,
    max_secure_participants,
    quantization_step,
)
from flwr_importance.compat.adapter import LegacyOptions, LegacyStrategyAdapter
from flwr_importance.legacy_wire import ScalarDict
from flwr_importance.sampling.ledger import PrivacyLedger
from flwr_importance.strategies.fedsampling import FedSampling as MessageFedSampling

#: Results, as the legacy server hands them to ``aggregate_fit``.
FitResults = list[tuple[ClientProxy, FitRes]]


class FedSampling(LegacyStrategyAdapter):
    """FedSampling (Qi et al., IJCAI 2023) as a legacy ``FedAvg`` subclass.

    Implementation based on https://arxiv.org/abs/2306.14245

    Runs :class:`flwr_importance.strategies.FedSampling`, whose docstring
    gives the method, its parameters and its client contract.

    Under SecAgg+ (``secure_aggregation``) the server never sees a node's
    ``G_c``: the train replies go through Flower's ``SecAggPlusWorkflow``, which
    unmasks only their mean over the ``n`` replies, and the update
    ``Theta - eta sum_c G_c`` needs nothing else (``sum_c G_c`` is ``n``
    times that mean, ``n`` the public number of replies). Every node sends
    the same public weight (``num-examples = max_weight``), so no count
    leaves a node and the weights cancel exactly; the sum is off by SecAgg+'s
    quantization only, less than ``n 2 c / Q`` in every coordinate
    (``c = clipping_range``, ``Q = quantization_range``), with a standard
    deviation below ``sqrt(n) c / Q`` (docs/privacy.md).

    Parameters
    ----------
    secure_aggregation : SecAggPlusWorkflow or None (default: None)
        The fit workflow the ServerApp runs
        (``DefaultWorkflow(fit_workflow=...)``), when it is SecAgg+: its
        ``max_weight`` (a whole number) becomes the nodes' weight, and its
        ranges bound the error logged in the summary. A round with fewer
        than 2 replies is skipped (SecAgg+ would cancel it; 1 reply is that
        node's ``G_c`` in the clear), and one with more than
        ``(modulus_range - 1) // quantization_range`` raises (the masked sum
        would wrap around). Results that do not match the setting (one
        shared aggregate without it, separate replies with it) raise: the
        ServerApp's workflow and the strategy disagree.
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments this class honours, bundled; they
        may also be given directly (``initial_parameters=...``,
        ``evaluate_fn=...``), see :class:`~flwr_importance.compat.LegacyOptions`.
        Refused, with the reason: ``fraction_fit`` and ``min_fit_clients``
        (every node trains on the samples it keeps; ``samples_per_round`` sets
        the round's size), ``fraction_evaluate > 0`` (evaluate replies would
        reveal the sizes: use ``evaluate_fn``) and
        ``fit_metrics_aggregation_fn`` (the fit replies carry no metrics).

    Other Parameters
    ----------------
    **options
        The keyword arguments of :class:`flwr_importance.strategies.FedSampling`
        and the legacy ``FedAvg`` arguments that apply, given directly.

    Client contract
    ---------------
    The Message-API class's, over the legacy transport (docs/protocol.md,
    "Legacy API"). ``query.sizes`` carries no arrays, so it is a
    ``ClientProxy.get_properties`` call made from inside ``configure_fit``,
    answered with the property ``size-response``. The train reply carries no
    ``num-examples``, so its ``FitRes.num_examples`` is 0. Under SecAgg+ the
    train config also carries ``secure-sum-weight``, and the reply's
    ``num-examples``, and so its ``FitRes.num_examples``, equal it. Client:
    ``handler_client_fn(task, make_fedsampling_handlers)``, under SecAgg+ in
    ``ClientApp(client_fn=..., mods=[importance_secaggplus_mod])``.
    """

    message_strategy_class = MessageFedSampling
    clients_parameter = (
        "samples_per_round (K): every node trains, on the samples it keeps"
    )
    refused_options: ClassVar[Mapping[str, str]] = {
        "fit_metrics_aggregation_fn": "FedSampling's fit replies carry no metrics "
        "and num_examples = 0: a count would reveal the node's size",
    }

    def __init__(
        self,
        *,
        secure_aggregation: SecAggPlusWorkflow | None = None,
        legacy: LegacyOptions | None = None,
        **options: Any,
    ) -> None:
        if secure_aggregation is not None:
            _check_workflow(secure_aggregation)
        self.secure_aggregation = secure_aggregation
        super().__init__(legacy=legacy, **options)

    @property
    def privacy_ledger(self) -> PrivacyLedger:
        """The size queries each node answered, and their epsilon."""
        assert isinstance(self.strategy, MessageFedSampling)
        return self.strategy.privacy_ledger

    def summary(self) -> None:
        """The adapter's summary, then the secure sum's settings and error."""
        super().summary()
        workflow = self.secure_aggregation
        if workflow is None:
            return
        step = quantization_step(workflow.clipping_range, workflow.quantization_range)
        log(
            INFO,
            "\t└──> SecAgg+: G_c masked, weight %d each; clipping_range c=%g, "
            "quantization_range Q=%d: the sum of n replies is off by < n x %.3g "
            "(2c/Q) per coordinate, sd < sqrt(n) x %.3g; at most %d replies a round",
            _public_weight(workflow),
            workflow.clipping_range,
            workflow.quantization_range,
            step,
            step / 2,
            max_secure_participants(
                workflow.quantization_range, workflow.modulus_range
            ),
        )

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The adapter's fit instructions; under SecAgg+ with the public weight."""
        instructions = super().configure_fit(server_round, parameters, client_manager)
        workflow = self.secure_aggregation
        if workflow is None:
            return instructions
        if len(instructions) < 2:
            log(
                WARNING,
                "configure_fit: %d node(s) to train, SecAgg+ needs 2 or more (the "
                "sum of one reply is that reply): round %d skipped",
                len(instructions),
                server_round,
            )
            return []
        check_no_wraparound(
            len(instructions),
            workflow.quantization_range,
            workflow.modulus_range,
            what=f"{len(instructions)} nodes would train in round {server_round}",
        )
        for _, fit_ins in instructions:
            fit_ins.config[protocol.SECURE_SUM_WEIGHT] = _public_weight(workflow)
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: FitResults,
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, ScalarDict]:
        """The adapter's aggregation; under SecAgg+ of the unmasked mean.

        SecAgg+ hands every result the same unmasked mean of the ``n``
        replies' ``G_c`` (one ``Parameters`` object, see ``unmask_stage`` of
        Flower's ``SecAggPlusWorkflow``). Each result then stands for that
        mean alone, with no per-node metrics, so the strategy's
        ``Theta - eta sum`` over the ``n`` results is
        ``Theta - eta n mean = Theta - eta sum_c G_c``.
        """
        secure_sum = _is_secure_sum(results)
        if secure_sum and self.secure_aggregation is None:
            raise RuntimeError(
                "FedSampling received one SecAgg+ aggregate in every fit result, "
                "but was not told the fit replies go through SecAgg+: its nodes "
                "sent no weight, so the aggregate is meaningless. Pass the "
                "ServerApp's workflow: FedSampling(..., secure_aggregation="
                "SecAggPlusWorkflow(...))"
            )
        if not secure_sum and self.secure_aggregation is not None and len(results) > 1:
            raise RuntimeError(
                "FedSampling was told its fit replies go through SecAgg+, but "
                f"{len(results)} separate replies arrived: the ServerApp runs no "
                "SecAggPlusWorkflow, and each G_c reached the server in the clear. "
                "Run DefaultWorkflow(fit_workflow=<the same SecAggPlusWorkflow>)"
            )
        if secure_sum:
            results = [(proxy, _mean_only(fit_res)) for proxy, fit_res in results]
        return super().aggregate_fit(server_round, results, failures)


def _check_workflow(workflow: SecAggPlusWorkflow) -> None:
    """Refuse a workflow FedSampling's secure sum cannot use, saying why."""
    if not isinstance(workflow, SecAggPlusWorkflow):
        raise TypeError(
            "secure_aggregation must be the ServerApp's SecAggPlusWorkflow, got "
            f"{type(workflow).__name__}"
        )
    max_weight = workflow.max_weight
    if max_weight < 1 or max_weight != int(max_weight):
        raise ValueError(
            f"SecAggPlusWorkflow(max_weight={max_weight}): FedSampling's nodes send "
            "max_weight as their (integer) num_examples, so that every G_c "
            "enters the sum with weight exactly 1; use a whole max_weight >= 1"
        )


def _public_weight(workflow: SecAggPlusWorkflow) -> int:
    """The weight every node sends: ``max_weight``, so ``w / max_weight = 1``."""
    return int(workflow.max_weight)


def _is_secure_sum(results: FitResults) -> bool:
    """Whether the results hold one SecAgg+ aggregate (one shared object).

    ``SecAggPlusWorkflow`` sets the same ``Parameters`` object on every
    result; results of separate replies each have their own.
    """
    if len(results) < 2:
        return False
    shared = results[0][1].parameters
    return all(fit_res.parameters is shared for _, fit_res in results)


def _mean_only(fit_res: FitRes) -> FitRes:
    """A SecAgg+ result as one anonymous copy of the unmasked mean.

    The node's own metrics (its array layout, the public weight) are left
    out: the aggregate's layout is the model's (one record), and a node
    whose metrics were malformed must not drop its copy, since its ``G_c``
    is in the mean regardless.
    """
    return FitRes(
        status=fit_res.status,
        parameters=fit_res.parameters,
        num_examples=fit_res.num_examples,
        metrics={},
    )

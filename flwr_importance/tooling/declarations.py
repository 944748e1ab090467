"""How the tests and benchmarks exercise each method, keyed by its name.

The library's methods declare what they are in their strategy modules
(:class:`~flwr_importance.method_spec.MethodSpec`, collected by
:func:`flwr_importance.registry.methods`); what the tooling runs them with is
declared here, one :class:`MethodTooling` per method name in
:data:`DECLARATIONS`: the canned replies of the server-only tests and
benchmarks, the run-config overrides that give its clients FedAvg's local work,
its headline and smoke presets, and its fair-comparison benchmark.
``tests/test_registry.py`` fails when a registry method has no entry here, or
an entry names no method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flwr_importance.method_spec import MethodSpec, RunConfigValue
from flwr_importance.registry import methods


@dataclass(frozen=True)
class CannedSetup:
    """What a canned-reply run knows when it builds a strategy.

    Attributes
    ----------
    clients_per_round : int
        ``m``, the clients trained per round.
    total_size : int
        The fleet's number of samples (FedSampling's ``K`` is a share of it).
    max_size : int
        The bound of the randomized sizes the canned nodes report.
    projection_dim : int
        Clustered sampling's ``projection_dim`` (similarity variant).
    """

    clients_per_round: int
    total_size: int
    max_size: int
    projection_dim: int


@dataclass(frozen=True)
class LocalWork:
    """The local work every client of a timing comparison does.

    Attributes
    ----------
    local_steps : int
        SGD steps per round.
    batch_size : int
        Samples per step.
    clients_per_round : int
        Clients trained per round.
    """

    local_steps: int
    batch_size: int
    clients_per_round: int


def sampling_arguments(**options: Any) -> Callable[[CannedSetup], Mapping[str, Any]]:
    """A client-sampling strategy's arguments in a canned run, plus ``options``.

    ``clients_per_round`` from the setup and federated evaluation off; the
    other arguments keep the strategy's defaults.

    Examples
    --------
    >>> setup = CannedSetup(clients_per_round=3, total_size=0, max_size=0,
    ...                     projection_dim=0)
    >>> sampling_arguments(method="size")(setup)["method"]
    'size'
    """
    return lambda setup: {
        "clients_per_round": setup.clients_per_round,
        "fraction_evaluate": 0.0,
        **options,
    }


@dataclass(frozen=True, kw_only=True)
class CannedVariant:
    """One configuration of a method, answered by canned replies.

    The server-only runs (bad-input, overhead and load tests and benchmarks)
    build the strategy as ``spec.build(**variant.arguments(setup))`` and
    answer each message type with the canned reply of the kind named in
    ``replies`` (:func:`flwr_importance.tooling.testing.canned_responders`
    defines the kinds).

    Attributes
    ----------
    name : str
        Unique among all methods' variants, e.g. ``"clustered-size"``; empty:
        the method's name (:func:`canned` fills it in).
    label : str
        How tables and plots name it; empty: the strategy class's name.
    arguments : Callable[[CannedSetup], Mapping[str, Any]]
        The strategy's keyword arguments for a setup; by default
        :func:`sampling_arguments` without options.
    replies : Mapping[str, str]
        Per message type (``"train"``, ``"query.sizes"`` ...), the reply kind.
    baseline : str
        The Flower ``FedAvg`` that does the same client work: ``"fedavg"`` (m
        nodes), ``"fedavg-2m"`` or ``"fedavg-all"``.
    packed_models : bool
        The strategy trains models packed by
        :func:`~flwr_importance.strategies.pack_models` (one here).
    """

    name: str = ""
    label: str = ""
    arguments: Callable[[CannedSetup], Mapping[str, Any]] = field(
        default_factory=sampling_arguments
    )
    replies: Mapping[str, str]
    baseline: str = "fedavg"
    packed_models: bool = False


def _same_work(work: LocalWork) -> Mapping[str, RunConfigValue]:
    """No overrides: the method's clients already do a FedAvg client's work."""
    return {}


@dataclass(frozen=True, kw_only=True)
class MethodTooling:
    """How the tests and benchmarks run one method.

    Attributes
    ----------
    headline_preset : str
        The preset of the paper's headline experiment (``simulations/presets``),
        which the report's ``flwr run`` confirmations run.
    canned : tuple[CannedVariant, ...]
        Its configurations for the canned-reply runs.
    equal_work : Callable[[LocalWork], Mapping[str, RunConfigValue]]
        Run-config overrides giving its clients the same local work as a
        FedAvg client's (``benchmarks/client_overhead.py``).
    smoke_preset : str
        The preset of short end-to-end checks (deployment tests); empty: the
        headline preset.
    smoke : Mapping[str, RunConfigValue]
        Run-config overrides on top of ``smoke_preset`` that keep a two-round
        end-to-end check short and meaningful.
    benchmark : str or None
        Module under ``benchmarks/`` of its fair comparison.
    """

    headline_preset: str
    canned: tuple[CannedVariant, ...]
    equal_work: Callable[[LocalWork], Mapping[str, RunConfigValue]] = _same_work
    smoke_preset: str = ""
    smoke: Mapping[str, RunConfigValue] = field(default_factory=dict)
    benchmark: str | None = None

    @property
    def smoke_run(self) -> tuple[str, Mapping[str, RunConfigValue]]:
        """The preset and the overrides of a short end-to-end check."""
        return self.smoke_preset or self.headline_preset, self.smoke


#: Per registry method name, how the tests and benchmarks run it.
DECLARATIONS: Mapping[str, MethodTooling] = {
    "clustered": MethodTooling(
        headline_preset="clustered-digits",
        canned=(
            CannedVariant(
                name="clustered-size",
                label="ClusteredSampling (size, Alg. 1)",
                arguments=sampling_arguments(method="size"),
                replies={"query.sizes": "sizes", "train": "model"},
            ),
            CannedVariant(
                name="clustered-similarity",
                label="ClusteredSampling (similarity, Alg. 2)",
                arguments=lambda setup: {
                    **sampling_arguments(method="similarity")(setup),
                    "projection_dim": setup.projection_dim,
                },
                replies={"query.sizes": "sizes", "train": "model"},
            ),
        ),
        equal_work=lambda work: {"clustered-method": "similarity"},
        smoke={"partitioning": "iid"},
        benchmark="clustered",
    ),
    "fedsampling": MethodTooling(
        headline_preset="fedsampling-lognormal-sigma2",
        canned=(
            CannedVariant(
                arguments=lambda setup: {
                    "samples_per_round": setup.total_size // 10,
                    "max_size": setup.max_size,
                    "fraction_evaluate": 0.0,
                },
                replies={"query.sizes": "size-response", "train": "gradient-sum"},
                # Every node answers the size query and trains on its kept samples.
                baseline="fedavg-all",
            ),
        ),
        equal_work=lambda work: {
            "fedsampling-local-steps": work.local_steps,
            "fedsampling-samples-per-round": work.clients_per_round * work.batch_size,
        },
        smoke_preset="fedsampling-lognormal-sigma1",
        benchmark="fedsampling",
    ),
    "folb": MethodTooling(
        headline_preset="folb-synthetic-1-1",
        canned=(
            # Two-set FOLB's gradient set costs about m more nodes' work.
            CannedVariant(
                arguments=sampling_arguments(proximal_mu=0.01),
                replies={"train": "folb-train"},
                baseline="fedavg-2m",
            ),
        ),
        equal_work=lambda work: {"proximal-mu": 0.01},
        # The digits run is the short one; IID so that two rounds improve.
        smoke_preset="folb-digits",
        smoke={"partitioning": "iid", "local-lr": 0.2},
        benchmark="folb",
    ),
    "isfedavg": MethodTooling(
        headline_preset="isfedavg-logistic",
        canned=(CannedVariant(replies={"train": "isfedavg-train"}),),
        # Fixed E_k and B_k: the same steps and batch as a FedAvg client.
        equal_work=lambda work: {
            "isfedavg-min-local-steps": work.local_steps,
            "isfedavg-max-local-steps": work.local_steps,
            "isfedavg-min-batch-size": work.batch_size,
            "isfedavg-max-batch-size": work.batch_size,
        },
        benchmark="isfedavg",
    ),
    "md": MethodTooling(
        headline_preset="clustered-digits-md",
        canned=(CannedVariant(replies={"query.sizes": "sizes", "train": "model"}),),
        smoke={"partitioning": "iid"},
    ),
    "mmfl": MethodTooling(
        headline_preset="mmfl-digits",
        canned=(
            CannedVariant(
                label="MultiModelSampling (S=1, gradnorm)",
                arguments=sampling_arguments(num_models=1, variant="gradnorm"),
                replies={"query.norm": "norm", "train": "kept-update"},
                packed_models=True,
            ),
        ),
        equal_work=lambda work: {"mmfl-tasks": "digits", "mmfl-variant": "gradnorm"},
        smoke={"mmfl-tasks": "digits:iid,digits:iid", "clients-per-round": 4},
        benchmark="variance_reduced",
    ),
    "ocs": MethodTooling(
        headline_preset="ocs-digits-lognormal",
        canned=(CannedVariant(replies={"query.norm": "norm", "train": "kept-update"}),),
        benchmark="variance_reduced",
    ),
    "power-of-choice": MethodTooling(
        headline_preset="power-of-choice-digits-dirichlet",
        canned=(
            CannedVariant(
                label="PowerOfChoice (pow-d, d = 2m)",
                replies={
                    "query.sizes": "sizes",
                    "query.loss": "loss",
                    "train": "model",
                },
            ),
        ),
        # The deployment check's 4 nodes and m = 2: IID data (two rounds of the
        # preset's label skew may not improve the model), d = 2m (0) = 4.
        smoke={"partitioning": "iid", "power-of-choice-candidates": 0},
        benchmark="power_of_choice",
    ),
}


def declaration(name: str) -> MethodTooling:
    """How the tests and benchmarks run the registry method ``name``.

    Raises
    ------
    KeyError
        ``name`` has no entry in :data:`DECLARATIONS`; the message says where
        to add it.

    Examples
    --------
    >>> declaration("md").headline_preset
    'clustered-digits-md'
    """
    if name not in DECLARATIONS:
        raise KeyError(
            f"method {name!r} has no entry in DECLARATIONS of {__name__}: "
            "add its canned replies, presets and benchmark there"
        )
    return DECLARATIONS[name]


def canned(spec: MethodSpec) -> tuple[CannedVariant, ...]:
    """The method's canned variants, an unnamed one under the method's names.

    An unnamed variant is the method's one canned configuration: it goes by
    the method's name and its strategy class's name.

    Examples
    --------
    >>> from flwr_importance.registry import method
    >>> [variant.label for variant in canned(method("md"))]
    ['MDSampling']
    """
    return tuple(
        replace(
            variant,
            name=variant.name or spec.name,
            label=variant.label or spec.strategy.__name__,
        )
        for variant in declaration(spec.name).canned
    )


def canned_variants() -> dict[str, tuple[MethodSpec, CannedVariant]]:
    """Every canned variant of every registry method, by variant name.

    Raises
    ------
    RuntimeError
        Two variants share a name.
    """
    variants = [(spec, variant) for spec in methods() for variant in canned(spec)]
    names = [variant.name for _, variant in variants]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RuntimeError(f"canned variants declared twice: {', '.join(repeated)}")
    return {variant.name: (spec, variant) for spec, variant in variants}

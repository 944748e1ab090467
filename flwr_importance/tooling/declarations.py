"""What a method's tooling declaration says: how the tests and benchmarks run it.

The library's methods declare what they are in their strategy modules
(:class:`~flwr_importance.method_spec.MethodSpec`, collected by
:func:`flwr_importance.registry.methods`); what the tooling runs them with is
a :class:`MethodTooling`, declared as ``TOOLING`` in the method's app module
(``simulations/methods/<name>.py``, collected by ``simulations/tooling.py``):
the canned replies of the server-only tests and benchmarks, the run-config
overrides that give its clients FedAvg's local work, its headline and smoke
presets, and its fair-comparison benchmark. ``tests/test_registry.py`` fails
when a registry method has no ``TOOLING``, or a ``TOOLING`` names no method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flwr_importance.method_spec import MethodSpec, RunConfigValue


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
        the method's name (:meth:`MethodTooling.variants` fills it in).
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

    def variants(self, spec: MethodSpec) -> tuple[CannedVariant, ...]:
        """The canned variants of ``spec``'s method, an unnamed one under its names.

        An unnamed variant is the method's one canned configuration: it goes
        by the method's name and its strategy class's name.

        Examples
        --------
        >>> from flwr_importance.registry import method
        >>> tooling = MethodTooling(
        ...     headline_preset="clustered-digits-md",
        ...     canned=(CannedVariant(replies={"train": "model"}),),
        ... )
        >>> [(v.name, v.label) for v in tooling.variants(method("md"))]
        [('md', 'MDSampling')]
        """
        return tuple(
            replace(
                variant,
                name=variant.name or spec.name,
                label=variant.label or spec.strategy.__name__,
            )
            for variant in self.canned
        )

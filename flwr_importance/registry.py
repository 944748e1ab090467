"""The library's methods, each declared once, next to its strategy.

Every strategy module of :mod:`flwr_importance.strategies` that holds a
method ends with a module-level ``METHOD = MethodSpec(...)``: its strategy
class, its legacy-API class, its ready-made client side, its app strategy
name, its headline preset, its fair-comparison benchmark and the canned
replies the server-only tests and benchmarks answer it with. :func:`methods`
collects them; the simulation app, the tests (reliability, failures, load,
overhead, deployment, legacy API), the benchmarks, the report and the examples
iterate over it, so a new method takes part in all of them by declaring
itself. ``tests/test_registry.py`` fails when a strategy module, an app
method, a preset, a legacy class or a benchmark exists that no declaration
accounts for.

This module is torch-free: importing it loads the strategies (Flower, NumPy),
nothing of the client side. Client-side and legacy parts are named by
``"module:attribute"`` and loaded on use (:func:`load_attribute`).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flwr.serverapp.strategy import Strategy

#: A run-config value (``[tool.flwr.app.config]``).
RunConfigValue = bool | int | float | str


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
    build the strategy as ``spec.strategy(**variant.arguments(setup))`` and
    answer each message type with the canned reply of the kind named in
    ``replies`` (:func:`flwr_importance.tooling.testing.canned_responders` defines the
    kinds).

    Attributes
    ----------
    name : str
        Unique among all methods' variants, e.g. ``"clustered-size"``; empty:
        the method's name (its :class:`MethodSpec` fills it in).
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


@dataclass(frozen=True)
class MethodSpec:
    """A method of the library, as every layer needs to know it.

    Attributes
    ----------
    name : str
        Its ``strategy`` name in the simulation app (``simulations/methods/``)
        and its key everywhere else.
    strategy : type[Strategy]
        The Message-API strategy.
    client_handlers : str
        ``"module:function"``: the ready-made ClientApp handlers, built from a
        :class:`~flwr_importance.clientapps.LocalTask` factory; empty: FedAvg's
        train and evaluate plus the standard handlers of ``client_queries``
        (:func:`flwr_importance.clientapps.standard.standard_handlers`).
    headline_preset : str
        The preset of the paper's headline experiment (``simulations/presets``).
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
    legacy : str or None
        ``"module:class"`` of its hand-written legacy-API class; None: the
        generic adapter (:func:`flwr_importance.compat.legacy_class`).
    legacy_api : bool
        Whether the method runs on Flower's legacy Strategy API at all.
    benchmark : str or None
        Module under ``benchmarks/`` of its fair comparison.
    app_aliases : tuple[str, ...]
        Other app ``strategy`` names of the same method.
    clients_per_round : bool
        Whether the constructor takes ``clients_per_round`` (FedSampling
        samples data, not clients).
    client_queries : tuple[str, ...]
        The standard queries (``"sizes"``, ``"loss"``) the strategy sends,
        answered by the ready-made client side when ``client_handlers`` is
        empty.
    app_options : Mapping[str, str]
        For a method without its own module in ``simulations/methods/``: per
        run-config key (declared in ``pyproject.toml``), the constructor
        argument it sets; the app passes ``clients_per_round`` and ``seed``
        itself.
    """

    name: str
    strategy: type[Strategy]
    headline_preset: str
    canned: tuple[CannedVariant, ...]
    client_handlers: str = ""
    equal_work: Callable[[LocalWork], Mapping[str, RunConfigValue]] = lambda work: {}
    smoke_preset: str = ""
    smoke: Mapping[str, RunConfigValue] = field(default_factory=dict)
    legacy: str | None = None
    legacy_api: bool = True
    benchmark: str | None = None
    app_aliases: tuple[str, ...] = ()
    clients_per_round: bool = True
    client_queries: tuple[str, ...] = ()
    app_options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # An unnamed variant is the method's one canned configuration: it goes
        # by the method's name and its strategy class's name.
        named = tuple(
            replace(
                variant,
                name=variant.name or self.name,
                label=variant.label or self.strategy.__name__,
            )
            for variant in self.canned
        )
        object.__setattr__(self, "canned", named)

    def build(self, **arguments: Any) -> Strategy:
        """A new instance of the strategy with these keyword arguments."""
        factory: Callable[..., Strategy] = self.strategy
        return factory(**arguments)

    @property
    def smoke_run(self) -> tuple[str, Mapping[str, RunConfigValue]]:
        """The preset and the overrides of a short end-to-end check."""
        return self.smoke_preset or self.headline_preset, self.smoke

    @property
    def app_names(self) -> tuple[str, ...]:
        """Every app ``strategy`` name of the method, its own first."""
        return (self.name, *self.app_aliases)


#: The attribute a strategy module declares its method under.
DECLARATION = "METHOD"


@functools.cache
def methods() -> tuple[MethodSpec, ...]:
    """Every declared method, sorted by name.

    Examples
    --------
    >>> "md" in [spec.name for spec in methods()]
    True
    """
    from flwr_importance import strategies

    declared = []
    for module_info in pkgutil.iter_modules(strategies.__path__):
        module = importlib.import_module(f"{strategies.__name__}.{module_info.name}")
        spec = getattr(module, DECLARATION, None)
        if spec is not None:
            declared.append(spec)
    specs = tuple(sorted(declared, key=lambda spec: spec.name))
    _check_unique(specs)
    return specs


def _check_unique(specs: tuple[MethodSpec, ...]) -> None:
    """Raise if two declarations share an app name or a canned variant name."""
    for what, names in (
        ("app name", [name for spec in specs for name in spec.app_names]),
        ("canned variant", [v.name for spec in specs for v in spec.canned]),
    ):
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise RuntimeError(f"{what}s declared twice: {', '.join(repeated)}")


def method(name: str) -> MethodSpec:
    """The method whose app name (or alias) is ``name``.

    Raises
    ------
    KeyError
        No method has that name; the message lists the known ones.

    Examples
    --------
    >>> method("sizeweighted").name
    'md'
    """
    for spec in methods():
        if name in spec.app_names:
            return spec
    known = ", ".join(name for spec in methods() for name in spec.app_names)
    raise KeyError(f"unknown method {name!r}; known: {known}")


def canned_variants() -> dict[str, tuple[MethodSpec, CannedVariant]]:
    """Every canned variant of every method, by variant name."""
    return {
        variant.name: (spec, variant) for spec in methods() for variant in spec.canned
    }


def load_attribute(path: str) -> Any:
    """The object a ``"module:attribute"`` path names, importing its module.

    Examples
    --------
    >>> load_attribute("flwr_importance.protocol:NUM_EXAMPLES")
    'num-examples'
    """
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def app_method_names() -> tuple[str, ...]:
    """The app ``strategy`` names of every method and alias, sorted."""
    return tuple(sorted(name for spec in methods() for name in spec.app_names))

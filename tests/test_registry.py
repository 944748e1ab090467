"""The method registry accounts for every method module, and agrees with each layer.

A method that exists in one layer but not in the registry would silently drop
out of the reliability, failure, load, overhead, deployment and legacy-API
runs, which all iterate over the registry: each test here names the layer.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import numpy as np
import pytest
import tomllib
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import Strategy

from benchmarks.report import section_title
from flwr_importance import compat, strategies
from flwr_importance.compat import LegacyStrategyAdapter, legacy_class
from flwr_importance.registry import DECLARATION, method, methods
from flwr_importance.tooling.declarations import MethodTooling
from flwr_importance.tooling.testing import Fleet
from flwr_importance.tooling.testing.canned import reply_kinds
from simulations.methods import (
    ALIASES,
    LIBRARY_METHODS,
    app_names,
    available_methods,
    load_method,
    method_modules,
)
from simulations.tooling import TOOLING, canned_variants, declaration, declarations

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "simulations" / "presets"
#: Flower's own strategies the app runs as baselines.
FLOWER_BASELINES = {"fedavg", "fedprox"}
SPECS = {spec.name: spec for spec in methods()}


def test_every_strategy_module_with_a_strategy_declares_its_method() -> None:
    # Base classes (the strategy base, MD and clustered sampling's shared
    # base) are not methods: each declared strategy subclasses them.
    bases = {base for spec in methods() for base in spec.strategy.__mro__[1:]}
    undeclared = []
    for module_info in pkgutil.iter_modules(strategies.__path__):
        module = importlib.import_module(f"{strategies.__name__}.{module_info.name}")
        defined = [
            value
            for value in vars(module).values()
            if inspect.isclass(value)
            and issubclass(value, Strategy)
            and value.__module__ == module.__name__
            and value not in bases
        ]
        spec = getattr(module, DECLARATION, None)
        if defined and (spec is None or spec.strategy not in defined):
            undeclared.append(module.__name__)
    assert undeclared == [], f"strategy modules without {DECLARATION}: {undeclared}"


def test_every_exported_strategy_is_a_registry_method_or_the_dp_wrapper() -> None:
    exported = {
        getattr(strategies, name)
        for name in strategies.__all__
        if inspect.isclass(getattr(strategies, name))
        and issubclass(getattr(strategies, name), Strategy)
    }
    assert exported == {spec.strategy for spec in methods()} | {strategies.CentralDP}


def test_app_methods_are_the_registry_methods_and_flowers_baselines() -> None:
    """One app path: every registry method has its module, and no other does."""
    assert tuple(spec.name for spec in methods()) == LIBRARY_METHODS
    assert set(method_modules()) == set(LIBRARY_METHODS) | FLOWER_BASELINES
    assert set(available_methods()) == set(method_modules()) | set(ALIASES)
    assert set(ALIASES.values()) <= set(LIBRARY_METHODS)


def test_every_method_has_its_tooling_declaration_and_no_other() -> None:
    """The tests and benchmarks run each registry method, and only those.

    Each method module's ``TOOLING`` is read from the module itself: a
    registry method whose module lacks one, or a ``TOOLING`` in a module of
    no registry method (Flower's baselines), fails here.
    """
    declared = {
        name
        for name in method_modules()
        if isinstance(getattr(load_method(name), TOOLING, None), MethodTooling)
    }
    assert declared == set(SPECS)
    assert set(declarations()) == set(SPECS)
    with pytest.raises(KeyError, match="TOOLING in simulations/methods/"):
        declaration("no-such-method")


def test_aliases_load_their_methods_module() -> None:
    assert load_method("sizeweighted") is load_method("md")
    assert app_names("md") == ("md", "sizeweighted")
    with pytest.raises(KeyError, match="known: "):
        method("no-such-method")


def preset_strategy(name: str) -> str:
    """The ``strategy`` a preset runs."""
    path = PRESETS / f"{name}.toml"
    assert path.is_file(), path
    return str(tomllib.loads(path.read_text())["strategy"])


def test_every_preset_runs_a_known_method() -> None:
    for path in sorted(PRESETS.glob("*.toml")):
        assert preset_strategy(path.stem) in available_methods(), path.name


@pytest.mark.parametrize("name", sorted(SPECS))
def test_declared_presets_run_the_method(name: str) -> None:
    spec, tooling = SPECS[name], declaration(name)
    smoke_preset, _ = tooling.smoke_run
    for preset in (tooling.headline_preset, smoke_preset):
        assert preset_strategy(preset) in app_names(spec.name), preset


@pytest.mark.parametrize("name", sorted(SPECS))
def test_declared_benchmark_exists_and_has_a_title(name: str) -> None:
    benchmark = declaration(name).benchmark
    if benchmark is not None:
        assert (ROOT / "benchmarks" / f"{benchmark}.py").is_file()
        # The report titles its section by the module's TITLE, not its path.
        assert not section_title(benchmark).startswith("`benchmarks/")


def test_every_legacy_class_belongs_to_a_method() -> None:
    exported = {
        getattr(compat, name)
        for name in compat.__all__
        if inspect.isclass(getattr(compat, name))
        and issubclass(getattr(compat, name), LegacyStrategyAdapter)
        and getattr(compat, name) is not LegacyStrategyAdapter
    }
    assert exported == {
        legacy_class(spec.name) for spec in methods() if spec.legacy_api
    }


@pytest.mark.parametrize("name", sorted(SPECS))
def test_legacy_class_runs_the_method(name: str) -> None:
    spec = SPECS[name]
    if not spec.legacy_api:
        with pytest.raises(ValueError, match="no legacy-API class"):
            legacy_class(name)
        return
    cls = legacy_class(name)
    assert cls.message_strategy_class is spec.strategy
    assert getattr(compat, spec.strategy.__name__) is cls


def client_handlers(spec_name: str) -> dict[str, object]:
    """The app's ready-made client handlers of a method (never called here)."""
    from simulations.methods import load_method

    return dict(load_method(spec_name).client_handlers(lambda *args: None))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_canned_replies_are_what_the_real_client_side_serves(name: str) -> None:
    served = set(client_handlers(name))
    for variant in declaration(name).canned:
        assert set(variant.replies) <= served, (variant.name, served)


def test_canned_reply_kinds_exist_and_variant_names_are_unique() -> None:
    model = ArrayRecord({"weight": Array(np.zeros(3, np.float32))})
    fleet = Fleet.skewed(num_nodes=2, model=model, reply_models=[model])
    kinds = reply_kinds(fleet=fleet, node_index=lambda node: 0)
    for spec, variant in canned_variants().values():
        assert set(variant.replies.values()) <= set(kinds), (spec.name, variant.name)
        assert variant.baseline in {"fedavg", "fedavg-2m", "fedavg-all"}

"""What a method declares about itself: :class:`MethodSpec`.

Every strategy module of :mod:`flwr_importance.strategies` that holds a method
ends with a module-level ``METHOD = MethodSpec(...)``; :mod:`.registry`
collects them. This module imports nothing of the library, so the strategies
can declare themselves without importing the registry that imports them.

Only what the library and its app need is declared here; how the tests and
benchmarks exercise a method (canned replies, smoke runs, its benchmark) is
the ``TOOLING`` of its app module, ``simulations/methods/<name>.py`` (a
:class:`~flwr_importance.tooling.declarations.MethodTooling`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flwr.serverapp.strategy import Strategy

#: A run-config value (``[tool.flwr.app.config]``).
RunConfigValue = bool | int | float | str


@dataclass(frozen=True, kw_only=True)
class MethodSpec:
    """A method of the library, as the library and its app know it.

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
    legacy : str or None
        ``"module:class"`` of its hand-written legacy-API class; None: the
        generic adapter (:func:`flwr_importance.compat.legacy_class`).
    legacy_api : bool
        Whether the method runs on Flower's legacy Strategy API at all.
    clients_per_round : bool
        Whether the constructor takes ``clients_per_round`` (FedSampling
        samples data, not clients).
    client_queries : tuple[str, ...]
        The standard queries (``"sizes"``, ``"loss"``) the strategy sends,
        answered by the ready-made client side when ``client_handlers`` is
        empty.
    uniform_sampling_option : str or None
        The strategy's bool option (an attribute of the same name) under which
        every client is sampled independently with the same probability, whatever
        the clients report: the one case where central DP may claim amplification
        by (Poisson) sampling (``docs/privacy.md``). None: the method's
        probabilities always depend on what clients report (sizes, norms,
        losses, gradients), so it gets none.
    central_dp_refusal : str or None
        Why :class:`~flwr_importance.strategies.wrappers.central_dp.CentralDP` cannot
        wrap the method; None: it can.
    """

    name: str
    strategy: type[Strategy]
    client_handlers: str = ""
    legacy: str | None = None
    legacy_api: bool = True
    clients_per_round: bool = True
    client_queries: tuple[str, ...] = ()
    uniform_sampling_option: str | None = None
    central_dp_refusal: str | None = None

    def build(self, **arguments: Any) -> Strategy:
        """A new instance of the strategy with these keyword arguments."""
        factory: Callable[..., Strategy] = self.strategy
        return factory(**arguments)

"""The simulation app's run config, typed.

Flower hands both apps ``context.run_config``: the ``[tool.flwr.app.config]``
table of ``pyproject.toml`` with the ``--run-config`` overrides applied (a preset
TOML file or ``key=value`` pairs). Keys are hyphenated, Flower style. Method
options live in the same table, prefixed by the method's name (``isfedavg-…``);
each method module reads its own with :meth:`ExperimentConfig.option`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

from flwr_importance.aggregation.server_optimizers import (
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerYogi,
)
from flwr_importance.strategies.wrappers.central_dp import Amplification

RunConfig = Mapping[str, bool | int | float | str]


@dataclass(frozen=True)
class ExperimentConfig:
    """Settings shared by every strategy of the simulation app."""

    strategy: str
    dataset: str
    partitioning: str
    model: str
    num_server_rounds: int
    clients_per_round: int
    local_lr: float
    local_steps: int
    local_epochs: int
    heterogeneous_steps: bool
    batch_size: int
    proximal_mu: float
    l2: float
    seed: int
    output_dir: str
    classes_per_client: int
    dirichlet_alpha: float
    lognormal_sigma: float
    samples_per_client: int
    num_supernodes: int
    run_config: Mapping[str, bool | int | float | str] = field(default_factory=dict)

    @classmethod
    def from_run_config(cls, run_config: RunConfig) -> ExperimentConfig:
        """Read and check the hyphenated run-config keys."""

        def get(key: str) -> bool | int | float | str:
            if key not in run_config:
                raise ValueError(f"run config lacks '{key}' (see pyproject.toml)")
            return run_config[key]

        config = cls(
            strategy=str(get("strategy")),
            dataset=str(get("dataset")),
            partitioning=str(get("partitioning")),
            model=str(get("model")),
            num_server_rounds=int(get("num-server-rounds")),
            clients_per_round=int(get("clients-per-round")),
            local_lr=float(get("local-lr")),
            local_steps=int(get("local-steps")),
            local_epochs=int(get("local-epochs")),
            heterogeneous_steps=bool(get("heterogeneous-steps")),
            batch_size=int(get("batch-size")),
            proximal_mu=float(get("proximal-mu")),
            l2=float(get("l2")),
            seed=int(get("seed")),
            output_dir=str(get("output-dir")),
            classes_per_client=int(get("classes-per-client")),
            dirichlet_alpha=float(get("dirichlet-alpha")),
            lognormal_sigma=float(get("lognormal-sigma")),
            samples_per_client=int(get("samples-per-client")),
            num_supernodes=int(get("num-supernodes")),
            run_config=dict(run_config),
        )
        config.check()
        return config

    def check(self) -> None:
        """Reject settings no run could use, with the reason."""
        if self.num_server_rounds < 1:
            raise ValueError("num-server-rounds must be >= 1")
        if self.clients_per_round < 1:
            raise ValueError("clients-per-round must be >= 1")
        if self.local_lr <= 0:
            raise ValueError("local-lr must be > 0")
        if (self.local_steps > 0) == (self.local_epochs > 0):
            raise ValueError(
                "set exactly one of local-steps and local-epochs to a positive value"
            )
        if self.batch_size < 1:
            raise ValueError("batch-size must be >= 1")
        if self.proximal_mu < 0 or self.l2 < 0:
            raise ValueError("proximal-mu and l2 must be >= 0")

    def server_optimizer(self) -> ServerOptimizer | None:
        """The run config's server optimizer (:func:`server_optimizer_of`)."""
        return server_optimizer_of(self.run_config)

    def central_dp(self) -> CentralDPSettings | None:
        """The run config's central DP (:func:`central_dp_of`)."""
        return central_dp_of(self.run_config)

    def option(self, key: str) -> bool | int | float | str:
        """A method-specific run-config value (``isfedavg-uniform``, ...)."""
        if key not in self.run_config:
            raise ValueError(f"run config lacks '{key}' (see pyproject.toml)")
        return self.run_config[key]

    def output_path(self) -> Path:
        """``output-dir`` as an absolute path (relative ones to the current dir)."""
        return Path(self.output_dir).expanduser().resolve()


def server_optimizer_of(settings: RunConfig) -> ServerOptimizer | None:
    """The ``server-optimizer`` of ``settings`` with its ``server-optimizer-*`` keys.

    None for ``"none"`` (or no key), the method's own step; an unknown name is
    a ValueError naming the known ones. Only the keys the optimizer reads are
    needed (adagrad: no betas; momentum: eta and momentum).
    """
    name = str(settings.get("server-optimizer", "none"))
    if name == "none":
        return None

    def value(key: str) -> float:
        if f"server-optimizer-{key}" not in settings:
            raise ValueError(f"run config lacks 'server-optimizer-{key}'")
        return float(settings[f"server-optimizer-{key}"])

    optimizers: dict[str, Callable[[], ServerOptimizer]] = {
        "adam": lambda: ServerAdam(
            eta=value("eta"),
            beta_1=value("beta1"),
            beta_2=value("beta2"),
            tau=value("tau"),
        ),
        "yogi": lambda: ServerYogi(
            eta=value("eta"),
            beta_1=value("beta1"),
            beta_2=value("beta2"),
            tau=value("tau"),
        ),
        "adagrad": lambda: ServerAdagrad(eta=value("eta"), tau=value("tau")),
        "momentum": lambda: ServerMomentum(lr=value("eta"), momentum=value("momentum")),
    }
    if name not in optimizers:
        raise ValueError(
            f"unknown server-optimizer '{name}'; known: none, " + ", ".join(optimizers)
        )
    return optimizers[name]()


@dataclass(frozen=True)
class CentralDPSettings:
    """The ``central-dp-*`` keys: CentralDP's settings but the population."""

    noise_multiplier: float
    clipping_norm: float
    target_delta: float
    amplification: Amplification
    #: DP-AOCS's report sums (``central-dp-report-*``); None where 0 or absent.
    report_noise_multiplier: float | None = None
    report_clipping_norm: float | None = None


def central_dp_of(settings: RunConfig) -> CentralDPSettings | None:
    """Central DP as ``settings``' ``central-dp-*`` keys ask for it.

    None where ``central-dp-noise-multiplier`` is 0 (or absent): off, and the
    other keys unread. Above 0, each key must hold a value CentralDP accepts;
    what the method allows (``"poisson"``, FOLB) is CentralDP's to say.

    Raises
    ------
    ValueError
        A value out of range or a key missing, naming the key.
    """
    noise_multiplier = float(settings.get("central-dp-noise-multiplier", 0.0))
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(
            "central-dp-noise-multiplier must be >= 0 and finite (0: no central "
            f"DP), got {noise_multiplier}"
        )
    if noise_multiplier == 0:
        return None

    def value(key: str) -> bool | int | float | str:
        if f"central-dp-{key}" not in settings:
            raise ValueError(f"run config lacks 'central-dp-{key}'")
        return settings[f"central-dp-{key}"]

    clipping_norm = float(value("clipping-norm"))
    if not (math.isfinite(clipping_norm) and clipping_norm > 0):
        raise ValueError(
            "central-dp-clipping-norm must be > 0 and finite with central DP on "
            f"(each weighted contribution's largest L2 norm), got {clipping_norm}"
        )
    target_delta = float(value("delta"))
    if not 0 < target_delta < 1:
        raise ValueError(f"central-dp-delta must lie in (0, 1), got {target_delta}")
    amplification = str(value("amplification"))
    # CentralDP says which mode needs them (DP-AOCS) and refuses them elsewhere.
    reports = [
        float(settings.get(f"central-dp-report-{key}", 0.0)) or None
        for key in ("noise-multiplier", "clipping-norm")
    ]
    for choice in get_args(Amplification):
        if choice == amplification:
            return CentralDPSettings(
                noise_multiplier, clipping_norm, target_delta, choice, *reports
            )
    raise ValueError(
        f"central-dp-amplification must be one of {get_args(Amplification)}, "
        f"got {amplification!r}"
    )

"""The simulation app's run config, typed.

Flower hands both apps ``context.run_config``: the ``[tool.flwr.app.config]``
table of ``pyproject.toml`` with the ``--run-config`` overrides applied (a preset
TOML file or ``key=value`` pairs). Keys are hyphenated, Flower style. Method
options live in the same table, prefixed by the method's name (``isfedavg-…``);
each method module reads its own with :meth:`ExperimentConfig.option`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flwr_importance.aggregation.server_optimizers import (
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerYogi,
)

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

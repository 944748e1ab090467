r"""Run ``flwr run`` on a project-local, self-contained Flower simulation.

``flwr run`` starts a managed SuperLink that outlives the command, keeps its
configuration in ``~/.flwr`` and, by default, installs the app's dependencies into
a fresh runtime environment on every run (with ``torch`` in the dependencies
that is a multi-GB CUDA build). This package runs it the way this project needs:

- ``FLWR_HOME`` points at a project-local folder holding a minimal
  ``config.toml``, so the user's ``~/.flwr`` is never read or written;
- ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, so the run uses the
  current environment;
- the managed SuperLink listens on free ports chosen here, so a SuperLink that
  is already running (someone else's) is never reused, and it is stopped, with
  everything it started, when the run ends, fails or is interrupted (Ctrl-C,
  SIGTERM);
- that SuperLink is started here, with the command line ``flwr run`` would use,
  and given minutes to come up instead of ``flwr run``'s fixed 15 s.

Command line::

    python -m flwr_importance.tooling.launcher \
        --run-config simulations/presets/isfedavg-regression.toml

The number of virtual SuperNodes is the run config's ``num-supernodes`` (the
preset's, else the app's default) unless ``--num-supernodes`` overrides it; an
app that sets none (Flower's own examples) runs on Flower's default number, with
a warning saying how to choose it.

Comparing strategies, each through its own ``flwr run`` with the same run
config and seed, the first the baseline (:func:`compare_strategies`)::

    python -m flwr_importance.tooling.launcher --compare md,clustered \
        --run-config simulations/presets/main.toml

The deployment engine on loopback (:func:`deployment`): a real
``flower-superlink`` and N ``flower-supernode`` processes on free ports, each
node with its own ``partition-id``/``num-partitions`` node config, runs
submitted with ``flwr run <app> <superlink>`` and followed with ``flwr ls``;
every process started is stopped, with its descendants, on exit.
:func:`secure_deployment` is the same with TLS and SuperNode authentication,
from a CA, a server certificate and node keys it makes for the run.

Modules, by concern: :mod:`.processes` (ports, finding and stopping processes,
Flower's environment), :mod:`.superlink` (the managed SuperLink of a
simulation run), :mod:`.simulation` (:func:`flwr_run`), :mod:`.loopback`
(:func:`deployment`), :mod:`.secure` (:func:`secure_deployment`),
:mod:`.compare` (:func:`compare_strategies`) and :mod:`.cli` (the command
line); their public names are re-exported here.
"""

from flwr_importance.tooling.launcher.cli import main
from flwr_importance.tooling.launcher.compare import (
    COMPARISON_JSON,
    COMPARISON_PLOT,
    ComparisonRun,
    compare_strategies,
)
from flwr_importance.tooling.launcher.loopback import Deployment, deployment
from flwr_importance.tooling.launcher.processes import (
    RunFailedError,
    flower_environment,
    format_run_config,
    free_port,
    processes_mentioning,
    processes_with_environment,
)
from flwr_importance.tooling.launcher.secure import (
    SecureDeployment,
    secure_deployment,
)
from flwr_importance.tooling.launcher.simulation import (
    FAILED_RUN_RETURNCODE,
    ONE_CPU_PER_CLIENTAPP,
    RAY_STARTUP_TIMEOUT,
    RUN_MARKER,
    app_default_config,
    flwr_run,
    intended_supernodes,
    load_run_config,
    run_command,
    server_app_error,
    supernodes_for_run,
)
from flwr_importance.tooling.launcher.superlink import stop_local_superlink

__all__ = [
    "COMPARISON_JSON",
    "COMPARISON_PLOT",
    "FAILED_RUN_RETURNCODE",
    "ONE_CPU_PER_CLIENTAPP",
    "RAY_STARTUP_TIMEOUT",
    "RUN_MARKER",
    "ComparisonRun",
    "Deployment",
    "RunFailedError",
    "SecureDeployment",
    "app_default_config",
    "compare_strategies",
    "deployment",
    "flower_environment",
    "flwr_run",
    "format_run_config",
    "free_port",
    "intended_supernodes",
    "load_run_config",
    "main",
    "processes_mentioning",
    "processes_with_environment",
    "run_command",
    "secure_deployment",
    "server_app_error",
    "stop_local_superlink",
    "supernodes_for_run",
]

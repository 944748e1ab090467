"""``flower-superexec`` that forks each app process from a warm interpreter.

Test-only. Flower's SuperLink and SuperNodes in ``process`` isolation mode leave
the app processes to a SuperExec; the stock ``flower-superexec`` starts a fresh
``flwr-serverapp``/``flwr-clientapp`` interpreter per task, and with torch,
scikit-learn and ``flwr_datasets`` to import each one costs ~5 s of CPU. A
deployment running eight runs on two cores would spend minutes importing.

This is the stock ``flower-superexec`` (its command line, task polling and
plugin), with one change: its executor forks the app process from this
interpreter, where the app's third-party dependencies are already imported,
and the child runs the ``flwr-serverapp``/``flwr-clientapp`` entry point with
the very arguments the stock executor passes. The app's own modules are not
kept: each child loads the app from the installed FAB, as a fresh process would.

Usage: ``python -m tests.e2e.deployment.forking_superexec --insecure
--runtime-api-address 127.0.0.1:PORT [--parent-pid PID]``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from flwr.supercore.cli.flower_superexec import flower_superexec
from flwr.supercore.constant import (
    TASK_TYPE_TO_APPIO_API_ADDRESS_ARG,
    TASK_TYPE_TO_COMMAND,
    TaskType,
)
from flwr.supercore.superexec import run_superexec as superexec_module
from flwr.supercore.superexec.executor import (
    ExecutionSpec,
    LaunchResult,
    SubprocessExecutor,
)
from flwr.superlink.cli import flwr_serverapp
from flwr.supernode.cli import flwr_clientapp

ENTRY_POINTS: dict[TaskType, Callable[[], None]] = {
    TaskType.SERVER_APP: flwr_serverapp,
    TaskType.CLIENT_APP: flwr_clientapp,
}
APP_PACKAGES = ("simulations", "flwr_importance")


def warm_up() -> None:
    """Import the app once, then forget its own modules, keeping the rest."""
    import simulations.client_app
    import simulations.server_app  # noqa: F401

    for name in list(sys.modules):
        if name.split(".")[0] in APP_PACKAGES:
            del sys.modules[name]


class ForkingExecutor(SubprocessExecutor):
    """Run each task's app process as a fork of this (warm) process."""

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork; the child runs the task's Flower entry point and exits."""
        if spec.task_type not in ENTRY_POINTS:
            return LaunchResult.failed(f"no entry point for {spec.task_type}")
        pid = os.fork()
        if pid == 0:
            run_child(spec)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished children (called by SuperExec's loop every poll)."""
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass


def run_child(spec: ExecutionSpec) -> None:
    """Body of a forked app process; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # The arguments of SubprocessExecutor.launch, which execs the command.
        sys.argv = [
            TASK_TYPE_TO_COMMAND[spec.task_type],
            TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
            spec.runtime_api_address,
            "--token",
            spec.token,
        ]
        if spec.insecure:
            sys.argv.append("--insecure")
        elif spec.root_certificates_path is not None:
            sys.argv += ["--root-certificates", spec.root_certificates_path]
        if spec.parent_pid is not None:
            sys.argv += ["--parent-pid", str(spec.parent_pid)]
        ENTRY_POINTS[spec.task_type]()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    """``flower-superexec`` with the forking executor."""
    warm_up()
    # Flower's default is to look for tasks once a second.
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
    # The executor factory is the one thing replaced in Flower's SuperExec.
    superexec_module.get_executor = lambda *args, **kwargs: ForkingExecutor()
    flower_superexec()


if __name__ == "__main__":
    main()

"""``flower-superexec`` that forks each app process from a warm fork server.

Test-only. Flower's SuperLink and SuperNodes in ``process`` isolation mode leave
the app processes to a SuperExec; the stock ``flower-superexec`` starts a fresh
``flwr-serverapp``/``flwr-clientapp`` interpreter per task, and with torch,
scikit-learn and ``flwr_datasets`` to import each one costs ~5 s of CPU. A
deployment running eight runs on two cores would spend minutes importing.

This is the stock ``flower-superexec`` (its command line, task polling and
plugin), with one change: its executor starts each app process as a fork of a
``multiprocessing`` fork server that imported the app and its dependencies
once, and the child runs the ``flwr-serverapp``/``flwr-clientapp`` entry point
with the arguments the stock executor passes. The child's output stays in the
SuperExec's log, where the tests read it (the stock executor discards the
ServerApp's, which users read with ``flwr log``), and the child installs
its FAB while no other does (:func:`install_one_at_a_time`). The app's own modules are
not kept: each child loads the app from the installed FAB, as a fresh process
would.

Why a fork server: the children used to be forks of the SuperExec, which runs
a thread (its parent-process monitor) besides the main one, and after a fork
of a threaded process a child may only call async-signal-safe functions.
In about one deployment in five, one such child never got far enough to log
and its run never ended; the fork server runs one thread and only forks.

Usage: ``python -m tests.e2e.deployment.forking_superexec --insecure
--runtime-api-address 127.0.0.1:PORT [--parent-pid PID]``.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from filelock import FileLock
from flwr.cli.install import install_from_fab
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
from flwr.supercore.utils import get_flwr_home
from flwr.superlink.cli import flwr_serverapp
from flwr.supernode.cli import flwr_clientapp

ENTRY_POINTS: dict[TaskType, Callable[[], None]] = {
    TaskType.SERVER_APP: flwr_serverapp,
    TaskType.CLIENT_APP: flwr_clientapp,
}
APP_PACKAGES = ("simulations", "flwr_importance")
#: Imported once by the fork server: the app, and with it its dependencies.
WARM_MODULES = (
    "simulations.client_app",
    "simulations.server_app",
    "flwr.superlink.cli",
    "flwr.supernode.cli",
)
FORK_SERVER = multiprocessing.get_context("forkserver")
#: The modules whose ``install_from_fab`` the app processes call.
RUNTIME_MODULES = (
    "flwr.superlink.runtime.run_serverapp",
    "flwr.supernode.runtime.run_clientapp",
)


class ForkingExecutor(SubprocessExecutor):
    """Run each task's app process as a fork of the warm fork server."""

    def __init__(self) -> None:
        self.children: list[BaseProcess] = []

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork; the child runs the task's Flower entry point and exits."""
        if spec.task_type not in ENTRY_POINTS:
            return LaunchResult.failed(f"no entry point for {spec.task_type}")
        child = FORK_SERVER.Process(target=run_child, args=(spec,))
        child.start()
        self.children.append(child)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished children (called by SuperExec's loop every poll)."""
        self.children = [child for child in self.children if child.is_alive()]


def entry_point_arguments(spec: ExecutionSpec) -> list[str]:
    """The command line ``SubprocessExecutor.launch`` execs for ``spec``."""
    arguments = [
        TASK_TYPE_TO_COMMAND[spec.task_type],
        TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
        spec.runtime_api_address,
        "--token",
        spec.token,
    ]
    if spec.insecure:
        arguments.append("--insecure")
    elif spec.root_certificates_path is not None:
        arguments += ["--root-certificates", spec.root_certificates_path]
    if spec.parent_pid is not None:
        arguments += ["--parent-pid", str(spec.parent_pid)]
    if spec.runtime_dependency_install:
        arguments.append("--allow-runtime-dependency-installation")
    return arguments


def install_one_at_a_time(*args: Any, **kwargs: Any) -> Path:
    """Flower's ``install_from_fab``, one app process at a time per FLWR_HOME.

    Flower creates an app's folder, then copies the FAB into it; a run of the
    same FAB starting meanwhile takes the folder for an installed app and
    fails ("Cannot find pyproject.toml"). Every process of the deployment
    shares one FLWR_HOME, and the tests submit the same app several times.
    """
    with FileLock(get_flwr_home() / "install.lock"):
        return install_from_fab(*args, **kwargs)


def run_child(spec: ExecutionSpec) -> None:
    """Body of a forked app process; never returns."""
    code = 1
    try:
        # The app comes from the installed FAB, not the fork server's import.
        for name in list(sys.modules):
            if name.split(".")[0] in APP_PACKAGES:
                del sys.modules[name]
        for runtime in RUNTIME_MODULES:
            vars(importlib.import_module(runtime))["install_from_fab"] = (
                install_one_at_a_time
            )
        sys.argv = entry_point_arguments(spec)
        ENTRY_POINTS[spec.task_type]()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        # A fresh interpreter would print it; os._exit below would not.
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    """``flower-superexec`` with the forking executor."""
    FORK_SERVER.set_forkserver_preload(list(WARM_MODULES))
    # Flower's default is to look for tasks once a second.
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
    # The executor factory is the one thing replaced in Flower's SuperExec.
    superexec_module.get_executor = lambda *args, **kwargs: ForkingExecutor()
    flower_superexec()


if __name__ == "__main__":
    main()

"""``flower-superexec`` whose app processes are forked from a warm interpreter.

Test-only. Flower's SuperLink and SuperNodes in ``process`` isolation mode leave
the app processes to a SuperExec; the stock ``flower-superexec`` starts a fresh
``flwr-serverapp``/``flwr-clientapp`` interpreter per task, and with torch,
scikit-learn and ``flwr_datasets`` to import each one costs ~5 s of CPU. A
deployment running eight runs on two cores would spend minutes importing.

This is the stock ``flower-superexec`` (its command line, task polling and
plugin), with one change: its executor hands each task to a fork server
(``tests/deployment/fork_server.py``), started before the SuperExec's own
threads, client and exit handlers exist, which forks the app process from an
interpreter where the app's third-party dependencies are already imported.

Usage: ``python -m tests.deployment.forking_superexec --insecure
--runtime-api-address 127.0.0.1:PORT [--parent-pid PID]``.
"""

from __future__ import annotations

import os
import subprocess
import sys

from flwr.supercore.cli.flower_superexec import flower_superexec
from flwr.supercore.superexec import run_superexec as superexec_module
from flwr.supercore.superexec.executor import (
    ExecutionSpec,
    LaunchResult,
    SubprocessExecutor,
)

from tests.deployment.fork_server import ENTRY_POINTS, READY_FD_VARIABLE, spec_to_line


class ForkServerExecutor(SubprocessExecutor):
    """Run each task's app process as a fork of a warm fork server."""

    def __init__(self, *, fork_server: subprocess.Popen[bytes]) -> None:
        self.fork_server = fork_server

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Send the task to the fork server, which forks its app process."""
        if spec.task_type not in ENTRY_POINTS:
            return LaunchResult.failed(f"no entry point for {spec.task_type}")
        if self.fork_server.poll() is not None:
            return LaunchResult.failed(
                f"fork server exited with {self.fork_server.returncode}"
            )
        assert self.fork_server.stdin is not None
        self.fork_server.stdin.write(spec_to_line(spec))
        self.fork_server.stdin.flush()
        return LaunchResult.accepted()


def main() -> None:
    """``flower-superexec`` with the fork server's executor."""
    # First, while this process has one thread and no Flower state to pass on.
    ready, warm = os.pipe()
    fork_server = subprocess.Popen(
        [sys.executable, "-m", "tests.deployment.fork_server", *sys.argv[1:]],
        stdin=subprocess.PIPE,
        env={**os.environ, READY_FD_VARIABLE: str(warm)},
        pass_fds=(warm,),
    )
    os.close(warm)
    # Until the fork server is warm, no task: it would wait in the pipe while
    # its token ages (Flower refused one after 66 s: 401, and started it again).
    os.read(ready, 1)
    os.close(ready)
    # Flower's default is to look for tasks once a second.
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
    # The executor factory is the one thing replaced in Flower's SuperExec.
    superexec_module.get_executor = lambda *args, **kwargs: ForkServerExecutor(
        fork_server=fork_server
    )
    flower_superexec()


if __name__ == "__main__":
    main()

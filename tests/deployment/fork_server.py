"""The warm interpreter that forks the app processes of ``forking_superexec``.

Test-only. It imports the app's third-party dependencies once, then reads one
task per line on stdin (an ``ExecutionSpec`` as JSON, written by
``forking_superexec``) and forks an app process for each; it exits at the end
of its input, that is when its SuperExec exits. The child runs the
``flwr-serverapp``/``flwr-clientapp`` entry point with the very arguments the
stock executor passes. The app's own modules are not kept: each child loads
the app from the installed FAB, as a fresh process would.

Nothing else runs here: this process has one thread, no Flower client, socket
or exit handler when it forks, so a child starts in the state of a fresh
``flwr-serverapp``/``flwr-clientapp`` process after its imports.

Usage: started by ``forking_superexec``, which waits until the pipe named by
``FORK_SERVER_READY_FD`` closes, with the SuperExec's own arguments
(``--insecure --runtime-api-address 127.0.0.1:PORT ...``), which it ignores:
they put the deployment's address on the command line of every app process,
where the launcher looks for the processes of a deployment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from flwr.supercore.constant import (
    TASK_TYPE_TO_APPIO_API_ADDRESS_ARG,
    TASK_TYPE_TO_COMMAND,
    TaskType,
)
from flwr.supercore.superexec.executor import ExecutionSpec
from flwr.superlink.cli import flwr_serverapp
from flwr.supernode.cli import flwr_clientapp

ENTRY_POINTS: dict[TaskType, Callable[[], None]] = {
    TaskType.SERVER_APP: flwr_serverapp,
    TaskType.CLIENT_APP: flwr_clientapp,
}
APP_PACKAGES = ("simulations", "flwr_importance")
# Names the descriptor of a pipe the fork server closes once warm.
READY_FD_VARIABLE = "FORK_SERVER_READY_FD"


def spec_to_line(spec: ExecutionSpec) -> bytes:
    """One task for the fork server: ``spec`` as a line of JSON."""
    return json.dumps(dataclasses.asdict(spec)).encode() + b"\n"


def line_to_spec(line: bytes) -> ExecutionSpec:
    """The task of one line written by :func:`spec_to_line`."""
    fields: dict[str, Any] = json.loads(line)
    return ExecutionSpec(**{**fields, "task_type": TaskType(fields["task_type"])})


def warm_up() -> None:
    """Import the app once, then forget its own modules, keeping the rest."""
    import simulations.client_app
    import simulations.server_app  # noqa: F401

    for name in list(sys.modules):
        if name.split(".")[0] in APP_PACKAGES:
            del sys.modules[name]


def reap_children() -> None:
    """Collect the exit status of every finished app process."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def run_child(spec: ExecutionSpec) -> None:
    """Body of a forked app process; never returns."""
    code = 1
    try:
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
    """Fork one app process per task line on stdin, until stdin ends."""
    warm_up()
    # The SuperExec takes tasks once this closes: a task's token is only
    # accepted for a while, and the imports take minutes on a loaded machine.
    os.close(int(os.environ.pop(READY_FD_VARIABLE)))
    for line in sys.stdin.buffer:
        reap_children()
        spec = line_to_spec(line)
        if os.fork() == 0:
            run_child(spec)


if __name__ == "__main__":
    main()

"""The fork server of the deployment tests' SuperExec: what its children inherit.

A child forked from a process inherits its threads' held locks (not the
threads), its open sockets and its Python state. The fork server is there so
that an app process starts as a fresh one would after its imports: these tests
look at the fork server's state where it forks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import ExecutionSpec

from tests.deployment.fork_server import READY_FD_VARIABLE, line_to_spec, spec_to_line

REPO_ROOT = Path(__file__).resolve().parents[2]

# The fork server's state after its warm-up, where main() forks.
PROBE = """
import json, os, sys, threading
from flwr.supercore.exit import exit_handler
from tests.deployment.fork_server import APP_PACKAGES, warm_up
warm_up()
links = []
for fd in os.listdir("/proc/self/fd"):
    try:
        links.append(os.readlink(f"/proc/self/fd/{fd}"))
    except FileNotFoundError:  # the listing's own descriptor, closed since
        pass
print(json.dumps({
    "threads": len(os.listdir("/proc/self/task")),
    "python-threads": threading.active_count(),
    "sockets": [link for link in links if link.startswith("socket:")],
    "exit-handlers": len(exit_handler.registered_exit_handlers),
    "app-modules": sorted(
        name for name in sys.modules if name.split(".")[0] in APP_PACKAGES
    ),
    "torch": "torch" in sys.modules,
}))
"""


def test_a_task_crosses_the_pipe_unchanged() -> None:
    spec = ExecutionSpec(
        task_type=TaskType.CLIENT_APP,
        runtime_api_address="127.0.0.1:9094",
        token="a-token",
        insecure=True,
        root_certificates_path=None,
        runtime_dependency_install=False,
        parent_pid=123,
        suppress_output=False,
        task_id=7,
        fab_hash="abc",
    )
    line = spec_to_line(spec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line_to_spec(line) == spec


@pytest.mark.slow
def test_the_fork_server_forks_with_one_thread_and_no_flower_state() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
        timeout=300,
        # One OpenMP/BLAS thread, as the deployment's processes have: with
        # more, OpenBLAS starts its worker threads when NumPy loads.
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    state = json.loads(probe.stdout.decode().splitlines()[-1])
    assert state["threads"] == 1, state
    assert state["python-threads"] == 1, state
    assert state["sockets"] == [], state
    assert state["exit-handlers"] == 0, state
    # Warm: the dependencies stay imported; each child loads the app's own
    # modules from the installed FAB.
    assert state["app-modules"] == [], state
    assert state["torch"], state


@pytest.mark.slow
def test_the_fork_server_says_when_warm_and_exits_at_the_end_of_its_input() -> None:
    ready, warm = os.pipe()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.deployment.fork_server"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1", READY_FD_VARIABLE: str(warm)},
        pass_fds=(warm,),
    )
    os.close(warm)
    # Blocks until the server closes its end, once warm.
    assert os.read(ready, 1) == b""
    os.close(ready)
    _, stderr = server.communicate(input=b"", timeout=300)
    assert server.returncode == 0, stderr.decode()[-2000:]

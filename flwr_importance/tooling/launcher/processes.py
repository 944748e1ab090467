"""Processes: free ports, finding and stopping what a run started, Flower's environment.

Every launcher module starts its processes with :func:`start_logged` (or
``subprocess``) and stops them with :func:`terminate`, children first; a
process is known as ours by its command line (:func:`processes_mentioning`) or
by an environment variable its whole process tree inherits
(:func:`processes_with_environment`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SCRIPTS_DIR = Path(sys.executable).parent


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def format_run_config(values: Mapping[str, object]) -> str:
    """Render ``{"key": value}`` as the TOML-ish ``k=v`` string ``flwr run`` takes."""

    def render(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return f'"{value}"'
        return repr(value)

    return " ".join(f"{key}={render(value)}" for key, value in values.items())


def processes_mentioning(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (Linux ``/proc``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(proc.name))
    return pids


def processes_with_environment(variable: str, value: str) -> list[int]:
    """PIDs whose environment has ``variable=value`` (Linux ``/proc``).

    Children inherit their parent's environment, so a variable set for a
    process started here also marks everything it starts (Ray's raylet and
    workers too, whose command lines name nothing of ours), orphans included.
    """
    entry = f"{variable}={value}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environment = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry in environment:
            pids.append(int(proc.name))
    return pids


def descendants(pid: int) -> list[int]:
    """All descendant PIDs of ``pid`` (children first level, then deeper)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        # The command name (2nd field) may contain spaces: parse after the ')'.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(proc.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _is_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def terminate(pids: Sequence[int], grace_seconds: float = 10.0) -> None:
    """SIGTERM ``pids``, then SIGKILL whatever is still alive after the grace."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in alive if _is_running(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # A killed process takes a moment to go; the caller's "stopped" must hold.
    deadline = time.monotonic() + 5.0
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _is_running(pid)]


def flower_environment(flwr_home: Path) -> dict[str, str]:
    """The environment of this process, set up for Flower processes under ``flwr_home``.

    ``flwr run`` and the SuperLink/SuperNode start Flower's other commands
    (``flower-superexec``, ``flwr-serverapp``, ``flwr-clientapp``) by name, so
    the environment's scripts go on PATH even when it is not activated (make
    run, CI); runtime dependency installation is off so the apps run on this
    environment. Each ClientApp gets one torch/BLAS thread unless
    ``OMP_NUM_THREADS`` is set: Ray runs one actor per reserved CPU share and
    gives each as many threads as its reservation, so on a small machine the
    actors' threads spin against each other (measured: a default experiment's
    actor used 16-27 s of CPU for 0.5 s of training, 6 s with one thread).
    """
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(SCRIPTS_DIR), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_DISABLE_UPDATE_CHECK="1",
        # Ray would otherwise try to reach its usage-stats server.
        RAY_USAGE_STATS_ENABLED="0",
        # Silences Ray's warning about a default that changes in a future release.
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
    )
    return env


def program_name(process: subprocess.Popen[bytes]) -> str:
    """The name of the program ``process`` runs (for error messages)."""
    args = process.args
    first = args[0] if isinstance(args, list) else args
    return Path(os.fsdecode(first)).name  # type: ignore[arg-type]


class RunFailedError(RuntimeError):
    """A ``flwr run`` submission or a run on the deployment did not succeed."""


def start_logged(
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str],
    *,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``command`` with its output in ``log_path`` (a pipe could fill up).

    ``new_session`` keeps the process out of the terminal's process group, so a
    Ctrl-C reaches only this program, which then stops it with its children.
    """
    with log_path.open("wb") as log_file:
        return subprocess.Popen(
            list(command),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=new_session,
        )

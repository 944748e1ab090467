"""Run ``flwr run`` on a project-local, self-contained Flower simulation.

``flwr run`` starts a managed SuperLink that outlives the command, keeps its
configuration in ``~/.flwr`` and, by default, installs the app's dependencies into
a fresh runtime environment on every run (with ``torch`` in the dependencies
that is a multi-GB CUDA build). This module runs it the way this project needs:

- ``FLWR_HOME`` points at a project-local folder holding a minimal
  ``config.toml``, so the user's ``~/.flwr`` is never read or written;
- ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, so the run uses the
  current environment;
- the managed SuperLink listens on free ports chosen here, so a SuperLink that
  is already running (someone else's) is never reused, and it is stopped, with
  everything it started, when the run ends or fails.

Command line::

    python -m flwr_importance.launcher \\
        --run-config simulations/presets/isfedavg-regression.toml

The number of virtual SuperNodes is the run config's ``num-supernodes`` (the
preset's, else the app's default) unless ``--num-supernodes`` overrides it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FLWR_CONFIG = """\
[superlink]
default = "local"

[superlink.local]
address = ":local-in-memory:"
"""


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


def _descendants(pid: int) -> list[int]:
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


def _terminate(pids: Sequence[int], grace_seconds: float = 10.0) -> None:
    """SIGTERM ``pids``, then SIGKILL whatever is still alive after the grace."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists()]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_local_superlink(flwr_home: Path) -> list[int]:
    """Stop the managed SuperLink started under ``flwr_home`` and its children.

    The managed SuperLink writes its log to ``<FLWR_HOME>/local-superlink/``, so
    its command line names that path: that is how we know it is ours.

    Returns
    -------
    list[int]
        The PIDs that were signalled.
    """
    marker = str(flwr_home.resolve() / "local-superlink")
    superlinks = [
        pid
        for pid in processes_mentioning(marker)
        if "flower-superlink" in Path(f"/proc/{pid}/cmdline").read_text()
    ]
    targets = [desc for pid in superlinks for desc in _descendants(pid)] + superlinks
    # Children first: the SuperLink would otherwise re-spawn or orphan them.
    _terminate(targets)
    return targets


def intended_supernodes(
    app_dir: Path, run_config: Path | Mapping[str, object] | None
) -> int:
    """The ``num-supernodes`` of the run config, else of the app's defaults."""
    overrides: Mapping[str, object] = {}
    if isinstance(run_config, Path):
        with run_config.open("rb") as file:
            overrides = tomllib.load(file)
    elif run_config:
        overrides = run_config
    if "num-supernodes" not in overrides:
        with (app_dir / "pyproject.toml").open("rb") as file:
            overrides = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    return int(str(overrides["num-supernodes"]))


def flwr_run(
    app_dir: Path,
    *,
    num_supernodes: int | None = None,
    run_config: Path | Mapping[str, object] | None = None,
    flwr_home: Path | None = None,
    timeout: float | None = None,
    capture: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``flwr run <app_dir> --stream`` and stop its SuperLink afterwards.

    Parameters
    ----------
    app_dir : Path
        The Flower App (folder holding its ``pyproject.toml``).
    num_supernodes : int, optional
        Number of virtual SuperNodes; by default the run config's
        ``num-supernodes``.
    run_config : Path or mapping, optional
        A TOML file of run-config overrides, or the overrides themselves.
    flwr_home : Path, optional
        Project-local Flower home; ``<app_dir>/.flwr-home`` by default.
    timeout : float, optional
        Seconds before the run is killed (``subprocess.TimeoutExpired`` raised).
    capture : bool
        Capture stdout/stderr (tests) instead of streaming them to the terminal.

    Returns
    -------
    subprocess.CompletedProcess
        The finished ``flwr run`` process; check ``returncode``.
    """
    app_dir = app_dir.resolve()
    if num_supernodes is None:
        num_supernodes = intended_supernodes(app_dir, run_config)
    flwr_home = (flwr_home or app_dir / ".flwr-home").resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(FLWR_CONFIG)

    env = dict(os.environ)
    # `flwr run` starts `flower-superlink` by name: the environment's scripts
    # must be on PATH even when it is not activated (make run, CI).
    scripts_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts_dir, env.get("PATH", "")])
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        # Ray would otherwise try to reach its usage-stats server.
        RAY_USAGE_STATS_ENABLED="0",
        # Silences Ray's warning about a default that changes in a future release.
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
    )
    command = [
        str(Path(scripts_dir) / "flwr"),
        "run",
        str(app_dir),
        "--stream",
        "--federation-config",
        f"num-supernodes={num_supernodes}",
    ]
    if isinstance(run_config, Path):
        command += ["--run-config", str(run_config.resolve())]
    elif run_config:
        command += ["--run-config", format_run_config(run_config)]
    try:
        return subprocess.run(
            command,
            env=env,
            cwd=app_dir,
            text=True,
            capture_output=capture,
            timeout=timeout,
            check=False,
        )
    finally:
        stop_local_superlink(flwr_home)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: one ``flwr run`` simulation, cleaned up after."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", type=Path, default=Path.cwd())
    parser.add_argument(
        "--num-supernodes", type=int, help="default: the run config's num-supernodes"
    )
    parser.add_argument(
        "--run-config", type=Path, help="TOML file of run-config overrides"
    )
    parser.add_argument("--flwr-home", type=Path)
    args = parser.parse_args(argv)
    completed = flwr_run(
        args.app,
        num_supernodes=args.num_supernodes,
        run_config=args.run_config,
        flwr_home=args.flwr_home,
    )
    return completed.returncode


if __name__ == "__main__":
    raise SystemExit(main())

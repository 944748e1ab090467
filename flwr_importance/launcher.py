r"""Run ``flwr run`` on a project-local, self-contained Flower simulation.

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
  everything it started, when the run ends, fails or is interrupted (Ctrl-C,
  SIGTERM);
- that SuperLink is started here, with the command line ``flwr run`` would use,
  and given minutes to come up instead of ``flwr run``'s fixed 15 s.

Command line::

    python -m flwr_importance.launcher \
        --run-config simulations/presets/isfedavg-regression.toml

The number of virtual SuperNodes is the run config's ``num-supernodes`` (the
preset's, else the app's default) unless ``--num-supernodes`` overrides it; an
app that sets none (Flower's own examples) runs on Flower's default number, with
a warning saying how to choose it.

Comparing strategies, each through its own ``flwr run`` with the same run
config and seed, the first the baseline (:func:`compare_strategies`)::

    python -m flwr_importance.launcher --compare md,clustered \
        --run-config simulations/presets/main.toml

The deployment engine on loopback (:func:`deployment`): a real
``flower-superlink`` and N ``flower-supernode`` processes on free ports, each
node with its own ``partition-id``/``num-partitions`` node config, runs
submitted with ``flwr run <app> <superlink>`` and followed with ``flwr ls``;
every process started is stopped, with its descendants, on exit.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from flwr_importance.comparison import (
    Comparison,
    compare_histories,
    format_table,
    plot_comparison,
    write_comparison,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCRIPTS_DIR = Path(sys.executable).parent

#: ``--federation-config`` giving each ClientApp one CPU. Flower's default of 2
#: leaves a single Ray actor on a 2-core machine, whose two torch threads mostly
#: wait on each other; with one CPU each, as many actors run as there are cores.
ONE_CPU_PER_CLIENTAPP: Mapping[str, object] = {"client-resources-num-cpus": 1}

#: Environment variable :func:`flwr_run` sets, to a value unique to the run, for
#: ``flwr run`` and the SuperLink: every process of the run inherits it, so
#: those still running when the run is over are found and stopped.
RUN_MARKER = "FLWR_IMPORTANCE_RUN"

# Seconds :func:`flwr_run` waits for the SuperLink it starts before ``flwr run``.
MANAGED_SUPERLINK_STARTUP_TIMEOUT = 180.0

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


def _is_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _terminate(pids: Sequence[int], grace_seconds: float = 10.0) -> None:
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


def _superlink_is_healthy(http_port: str) -> bool:
    """Whether the managed SuperLink on ``http_port`` answers its health check."""
    # No proxy: an HTTP(S)_PROXY in the environment must not see loopback calls.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{http_port}/health", timeout=0.4) as reply:
            return bool(reply.status == HTTPStatus.OK)
    except OSError:
        return False


def _start_managed_superlink(
    flwr_home: Path,
    env: Mapping[str, str],
    timeout: float = MANAGED_SUPERLINK_STARTUP_TIMEOUT,
) -> None:
    """Start the SuperLink ``flwr run`` would start, and wait until it is up.

    ``flwr run`` gives the SuperLink it starts 15 s (Flower 1.41, not
    configurable); on a loaded two-core machine its imports alone can take
    longer and the run fails. Started here with the same command line, on the
    ports ``flwr run`` reads from ``env``, it is found running and used, and
    :func:`stop_local_superlink` stops it like one ``flwr run`` started.

    Raises
    ------
    RunFailedError
        The SuperLink exited, or was not healthy after ``timeout`` seconds
        (then it is stopped); its log is under ``<flwr_home>/local-superlink``.
    """
    log_dir = flwr_home / "local-superlink"
    log_dir.mkdir(parents=True, exist_ok=True)
    http_port = env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    superlink = _start_logged(
        [
            str(SCRIPTS_DIR / "flower-superlink"),
            "--insecure",
            "--simulation",
            "--isolation=subprocess",
            f"--control-api-address=127.0.0.1:{env['FLWR_LOCAL_CONTROL_API_PORT']}",
            "--host=127.0.0.1",
            f"--port={http_port}",
            f"--log-file={log_dir / 'superlink.log'}",
        ],
        log_dir / "console.log",
        env,
        # A SuperLink hit by Ctrl-C itself could exit first and orphan the
        # processes it started, which stop_local_superlink finds as its children.
        new_session=True,
    )
    deadline = time.monotonic() + timeout
    while not _superlink_is_healthy(http_port):
        if superlink.poll() is not None:
            raise RunFailedError(
                f"flower-superlink exited with {superlink.returncode}; "
                f"logs in {log_dir}"
            )
        if time.monotonic() > deadline:
            stop_local_superlink(flwr_home)
            raise RunFailedError(
                f"flower-superlink not up after {timeout} s; logs in {log_dir}"
            )
        time.sleep(0.2)


def load_run_config(
    run_config: Path | Mapping[str, object] | None,
) -> dict[str, object]:
    """The run-config overrides: a TOML file's table, the mapping itself, or ``{}``."""
    if isinstance(run_config, Path):
        with run_config.open("rb") as file:
            return tomllib.load(file)
    return dict(run_config or {})


def app_default_config(app_dir: Path) -> dict[str, object]:
    """The app's ``[tool.flwr.app.config]`` table (``{}`` where it has none)."""
    with (app_dir / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)
    return dict(
        project.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    )


def intended_supernodes(
    app_dir: Path, run_config: Path | Mapping[str, object] | None
) -> int | None:
    """The ``num-supernodes`` of the run config, else of the app's defaults.

    ``num-supernodes`` is this project's convention, not Flower's: ``None``
    when neither the run config nor the app sets it (e.g. Flower's examples).
    """
    for config in (load_run_config(run_config), app_default_config(app_dir)):
        if "num-supernodes" in config:
            return int(str(config["num-supernodes"]))
    return None


def supernodes_for_run(
    app_dir: Path,
    run_config: Path | Mapping[str, object] | None,
    requested: int | None = None,
) -> int:
    """Virtual SuperNodes to run: ``requested``, else the configs', else Flower's.

    Warns (``UserWarning``) when it falls back to Flower's default, saying how
    to choose the number instead.
    """
    if requested is not None:
        return requested
    intended = intended_supernodes(app_dir, run_config)
    if intended is not None:
        return intended
    # Imported here: it loads Flower's protobuf modules (~0.5 s).
    from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG

    flower_default = int(DEFAULT_SIMULATION_CONFIG.num_supernodes)
    warnings.warn(
        f"{app_dir} sets no num-supernodes in [tool.flwr.app.config] and the run "
        f"config does not either: running Flower's default of "
        f"{flower_default} virtual SuperNodes. Choose the number with "
        "--num-supernodes N (or add num-supernodes = N to the app's config).",
        stacklevel=2,
    )
    return flower_default


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


def flwr_run(
    app_dir: Path,
    *,
    num_supernodes: int | None = None,
    run_config: Path | Mapping[str, object] | None = None,
    flwr_home: Path | None = None,
    timeout: float | None = None,
    capture: bool = False,
    extra_env: Mapping[str, str] | None = None,
    federation_config: Mapping[str, object] | None = None,
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
        Capture stdout/stderr (tests) instead of streaming them to the terminal
        (:func:`run_command`).
    extra_env : mapping, optional
        Environment variables for ``flwr run`` and the SuperLink it starts (and
        so the simulation runtime), e.g. ``RAY_ADDRESS`` to run the simulation
        on a Ray cluster started separately.
    federation_config : mapping, optional
        More ``--federation-config`` values besides ``num-supernodes``, e.g.
        ``{"client-resources-num-cpus": 1}``.

    Returns
    -------
    subprocess.CompletedProcess
        The finished ``flwr run`` process; check ``returncode``.

    Notes
    -----
    A run whose Ray node did not start in time (:data:`RAY_STARTUP_TIMEOUT`)
    is run once more, with a ``RuntimeWarning``. ``flwr run --stream`` exits
    with 0 even when the ServerApp raises; a run whose output shows Flower's
    error exit (:func:`server_app_error`) is returned with
    :data:`FAILED_RUN_RETURNCODE` instead.
    """
    app_dir = app_dir.resolve()
    num_supernodes = supernodes_for_run(app_dir, run_config, num_supernodes)
    flwr_home = (flwr_home or app_dir / ".flwr-home").resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(FLWR_CONFIG)

    env = flower_environment(flwr_home)
    env.update(
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(free_port()),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        **{RUN_MARKER: uuid.uuid4().hex},
    )
    if extra_env:
        env.update(extra_env)
    command = [
        str(SCRIPTS_DIR / "flwr"),
        "run",
        str(app_dir),
        "--stream",
        "--federation-config",
        format_run_config(
            {"num-supernodes": num_supernodes, **(federation_config or {})}
        ),
    ]
    if isinstance(run_config, Path):
        command += ["--run-config", str(run_config.resolve())]
    elif run_config:
        command += ["--run-config", format_run_config(run_config)]
    completed = _flwr_run_once(command, env, app_dir, flwr_home, capture, timeout)
    if RAY_STARTUP_TIMEOUT in completed.stdout + completed.stderr:
        warnings.warn(
            "Ray's node missed its fixed 30 s start-up window (a busy machine); "
            "running once more",
            RuntimeWarning,
            stacklevel=2,
        )
        completed = _flwr_run_once(command, env, app_dir, flwr_home, capture, timeout)
    if completed.returncode == 0 and server_app_error(
        completed.stdout + completed.stderr
    ):
        return subprocess.CompletedProcess(
            completed.args, FAILED_RUN_RETURNCODE, completed.stdout, completed.stderr
        )
    return completed


#: The return code :func:`flwr_run` gives a run whose ServerApp failed (what
#: Flower's own processes exit with on an error, ``flwr/supercore/exit``).
FAILED_RUN_RETURNCODE = 1

#: Flower's line when a process ends (``flwr/supercore/exit/exit.py``): codes
#: 0-99 are successes, any other an error (700: the simulation raised).
_EXIT_CODE = re.compile(r"Exit Code: (\d+)")
#: The colours of Flower's log lines.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_TRACEBACK = "Traceback (most recent call last):"


def server_app_error(output: str) -> str | None:
    r"""The error a failed run reports in its output; None if it reports none.

    A ServerApp (or the simulation) that raises logs the traceback and then
    Flower's ``Exit Code: <code>`` line with a code of 100 or more. The error
    is the exception of the last traceback before that line (its message,
    which may span lines), or the exit line itself when no traceback was
    printed.

    Examples
    --------
    >>> server_app_error("INFO : round 1\nINFO : done")
    >>> server_app_error(
    ...     "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
    ...     "ValueError: no sizes\nERROR :     Exit Code: 700\n"
    ... )
    'ValueError: no sizes (Exit Code: 700)'
    """
    lines = _ANSI_ESCAPE.sub("", output).splitlines()
    exits = [
        (index, match)
        for index, line in enumerate(lines)
        if (match := _EXIT_CODE.search(line)) and int(match.group(1)) >= 100
    ]
    if not exits:
        return None
    exit_index, exit_match = exits[-1]
    exit_line = exit_match.group(0)
    starts = [
        index for index in range(exit_index) if lines[index].strip() == _TRACEBACK
    ]
    if not starts:
        return exit_line
    # The exception is the first unindented line after the traceback's frames.
    for index in range(starts[-1] + 1, exit_index):
        if lines[index] and not lines[index][0].isspace():
            message = " ".join(
                line.strip() for line in lines[index:exit_index] if line.strip()
            )
            return f"{message} ({exit_line})"
    return exit_line


#: What Ray reports when its raylet has not registered with the GCS within the
#: 30 s that ``ray._private.node.Node`` waits (a constant, not a setting): on a
#: machine busy with other work the simulation never starts, through no fault
#: of the run (ray-project/ray#47087). :func:`flwr_run` tries once more.
RAY_STARTUP_TIMEOUT = "The current node timed out during startup"


def _flwr_run_once(
    command: list[str],
    env: dict[str, str],
    app_dir: Path,
    flwr_home: Path,
    capture: bool,
    timeout: float | None,
) -> subprocess.CompletedProcess[str]:
    """Start the SuperLink, run ``command``, stop everything the run started."""
    try:
        _start_managed_superlink(flwr_home, env)
        return run_command(command, env, app_dir, capture=capture, timeout=timeout)
    finally:
        stop_local_superlink(flwr_home)
        # What the SuperLink's children left behind (Ray's processes outlive a
        # killed simulation) or started while being stopped carries the marker.
        _terminate(processes_with_environment(RUN_MARKER, env[RUN_MARKER]))


#: How many of the last output lines a streamed run keeps for its checks.
STREAMED_TAIL_LINES = 1000


def run_command(
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    *,
    capture: bool,
    timeout: float | None,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` and wait; its output captured, or echoed as it comes.

    Echoed (``capture=False``), stdout and stderr go to this process's stdout
    line by line, and the returned ``stdout`` holds the last
    :data:`STREAMED_TAIL_LINES` of them, so a streamed run can be checked as
    a captured one is (``stderr`` is then empty).

    Raises
    ------
    subprocess.TimeoutExpired
        The command ran past ``timeout`` seconds; it has been killed.
    """
    if capture:
        return subprocess.run(
            command,
            env=env,
            cwd=cwd,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    tail: collections.deque[str] = collections.deque(maxlen=STREAMED_TAIL_LINES)
    with subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ) as process:
        stream = process.stdout
        assert stream is not None  # stdout=PIPE

        def echo() -> None:
            for line in stream:
                sys.stdout.write(line)
                sys.stdout.flush()
                tail.append(line)

        # A thread reads while the main one waits, so that the timeout holds
        # even when the command prints nothing.
        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        reader.join()
    return subprocess.CompletedProcess(list(command), returncode, "".join(tail), "")


# The name of a deployment's SuperLink connection in its FLWR_HOME config.toml.
DEPLOYMENT_CONNECTION = "deployment"
# `flwr ls` status prefix of a run that is over ("finished:completed", ...).
RUN_FINISHED = "finished"


def _program(process: subprocess.Popen[bytes]) -> str:
    """The name of the program ``process`` runs (for error messages)."""
    args = process.args
    first = args[0] if isinstance(args, list) else args
    return Path(os.fsdecode(first)).name  # type: ignore[arg-type]


class RunFailedError(RuntimeError):
    """A ``flwr run`` submission or a run on the deployment did not succeed."""


@dataclass
class Deployment:
    """A SuperLink and its SuperNodes on loopback, started by :func:`deployment`.

    Attributes
    ----------
    address : str
        ``host:port`` of the SuperLink (Fleet, Control and ServerAppIo APIs).
    flwr_home : Path
        ``FLWR_HOME`` of every process started here and of ``flwr`` commands.
    work_dir : Path
        Folder holding the SuperLink database and one log file per process.
    env : dict
        Environment of the processes and of the ``flwr`` commands.
    processes : list
        The ``flower-superlink`` process first, then one per SuperNode.
    markers : list
        Strings only the command lines of this deployment's processes (and the
        apps they start) contain: its ports and folders.
    """

    address: str
    flwr_home: Path
    work_dir: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)

    def flwr(self, *args: str, timeout: float = 60.0) -> dict[str, object]:
        """Run ``flwr <args> --format json`` against this deployment; its JSON."""
        completed = subprocess.run(
            [str(SCRIPTS_DIR / "flwr"), *args, "--format", "json"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        try:
            reply: dict[str, object] = json.loads(completed.stdout)
        except json.JSONDecodeError as error:
            raise RunFailedError(
                f"flwr {' '.join(args)}: {completed.stdout}{completed.stderr}"
            ) from error
        if not reply.get("success"):
            raise RunFailedError(f"flwr {' '.join(args)}: {reply}")
        return reply

    def submit(
        self, app_dir: Path, run_config: Path | Mapping[str, object] | None = None
    ) -> int:
        """``flwr run <app_dir> <this SuperLink>``; return the new run's id.

        The run is submitted, not awaited: several runs submitted one after the
        other run on the SuperLink at the same time.
        """
        command = ["run", str(app_dir.resolve()), DEPLOYMENT_CONNECTION]
        if isinstance(run_config, Path):
            command += ["--run-config", str(run_config.resolve())]
        elif run_config:
            command += ["--run-config", format_run_config(run_config)]
        # Building and uploading the FAB takes minutes on a loaded machine.
        return int(str(self.flwr(*command, timeout=600.0)["run-id"]))

    def run_statuses(self) -> dict[int, str]:
        """``flwr ls``: each run's status, e.g. ``"finished:completed"``."""
        runs = self.flwr("ls", DEPLOYMENT_CONNECTION)["runs"]
        assert isinstance(runs, list)
        return {int(run["run-id"]): str(run["status"]) for run in runs}

    def wait(
        self, run_ids: Sequence[int], timeout: float, poll_seconds: float = 2.0
    ) -> dict[int, str]:
        """Poll ``flwr ls`` until every run in ``run_ids`` has finished.

        Returns
        -------
        dict[int, str]
            The final status of each run (``"finished:completed"`` on success,
            ``"finished:failed"``/``"finished:stopped"`` otherwise).

        Raises
        ------
        TimeoutError
            Some run had not finished after ``timeout`` seconds; the message
            gives every run's status.
        """
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.run_statuses()
            pending = [
                run_id
                for run_id in run_ids
                if not statuses.get(run_id, "").startswith(RUN_FINISHED)
            ]
            if not pending:
                return {run_id: statuses[run_id] for run_id in run_ids}
            if time.monotonic() > deadline:
                raise TimeoutError(f"runs not finished after {timeout} s: {statuses}")
            self.check_alive()
            time.sleep(poll_seconds)

    def check_alive(self) -> None:
        """Raise if the SuperLink or a SuperNode has exited (see its log)."""
        for process in self.processes:
            if process.poll() is not None:
                raise RunFailedError(
                    f"{_program(process)} exited with {process.returncode}; "
                    f"logs in {self.work_dir}"
                )

    def leftover_processes(self) -> list[int]:
        """PIDs of processes of this deployment still running (``[]`` once stopped)."""
        return sorted(
            {pid for marker in self.markers for pid in processes_mentioning(marker)}
        )

    def stop(self) -> None:
        """Stop every process started here and everything they started.

        Children first (the SuperExecs and the app processes they start), so
        nothing is re-spawned or orphaned; then a sweep for orphans whose
        command line names this deployment's ports or folders.
        """
        started = [process.pid for process in self.processes]
        _terminate([pid for pid in started for pid in _descendants(pid)])
        _terminate(started)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        _terminate(self.leftover_processes())


def _start_logged(
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


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RunFailedError(
                f"{_program(process)} exited with {process.returncode}"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@contextlib.contextmanager
def deployment(
    num_supernodes: int,
    work_dir: Path,
    *,
    node_configs: Sequence[Mapping[str, object]] | None = None,
    executor: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    startup_timeout: float = 60.0,
) -> Iterator[Deployment]:
    """Run a SuperLink and ``num_supernodes`` SuperNodes on loopback (insecure).

    Parameters
    ----------
    num_supernodes : int
        Number of ``flower-supernode`` processes.
    work_dir : Path
        Folder for ``FLWR_HOME`` (``<work_dir>/flwr-home``), the SuperLink's
        database and the process logs (``<work_dir>/logs``).
    node_configs : sequence of mappings, optional
        Node config of each SuperNode; by default node ``i`` gets
        ``partition-id=i num-partitions=num_supernodes``.
    executor : sequence of str, optional
        A SuperExec command (e.g. ``["flower-superexec"]``) to serve the app
        processes in Flower's ``process`` isolation mode: started once for the
        SuperLink and once per SuperNode, with ``--insecure
        --runtime-api-address <address> --parent-pid <pid>`` appended. By
        default (``subprocess`` isolation) the SuperLink and each SuperNode
        start their own ``flower-superexec``.
    extra_env : mapping, optional
        Environment variables added for every process started here.
    startup_timeout : float
        Seconds to wait for the SuperLink to listen.

    Yields
    ------
    Deployment
        Submit runs with :meth:`Deployment.submit`, await them with
        :meth:`Deployment.wait`. On exit, normal or not, every process started
        here is stopped with its descendants.
    """
    if node_configs is None:
        node_configs = [
            {"partition-id": index, "num-partitions": num_supernodes}
            for index in range(num_supernodes)
        ]
    if len(node_configs) != num_supernodes:
        raise ValueError(
            f"{len(node_configs)} node configs for {num_supernodes} SuperNodes"
        )
    work_dir = work_dir.resolve()
    flwr_home = work_dir / "flwr-home"
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    flwr_home.mkdir(parents=True, exist_ok=True)
    superlink_port = free_port()
    address = f"127.0.0.1:{superlink_port}"
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{DEPLOYMENT_CONNECTION}"\n\n'
        f'[superlink.{DEPLOYMENT_CONNECTION}]\naddress = "{address}"\n'
        "insecure = true\n"
    )
    env = flower_environment(flwr_home)
    env.update(extra_env or {})
    isolation = ["--isolation=process"] if executor else []
    running = Deployment(
        address=address,
        flwr_home=flwr_home,
        work_dir=work_dir,
        env=env,
        markers=[str(work_dir), address],
    )
    try:
        superlink = _start_logged(
            [
                str(SCRIPTS_DIR / "flower-superlink"),
                "--insecure",
                "--host=127.0.0.1",
                f"--port={superlink_port}",
                f"--database={work_dir / 'superlink.db'}",
                "--disable-runtime-dependency-installation",
                *isolation,
            ],
            logs / "superlink.log",
            env,
        )
        running.processes.append(superlink)
        _wait_for_port(superlink_port, superlink, startup_timeout)
        runtime_apis = [(superlink_port, superlink, "superlink")]
        for index, node_config in enumerate(node_configs):
            node_port = free_port()
            # The node's ClientApp processes name this address: a marker.
            running.markers.append(f"127.0.0.1:{node_port}")
            supernode = _start_logged(
                [
                    str(SCRIPTS_DIR / "flower-supernode"),
                    "--insecure",
                    f"--superlink={address}",
                    f"--node-config={format_run_config(node_config)}",
                    "--host=127.0.0.1",
                    f"--port={node_port}",
                    *isolation,
                ],
                logs / f"supernode-{index}.log",
                env,
            )
            running.processes.append(supernode)
            runtime_apis.append((node_port, supernode, f"supernode-{index}"))
        for port, parent, name in runtime_apis if executor else []:
            superexec_command = [
                *(executor or []),
                "--insecure",
                f"--runtime-api-address=127.0.0.1:{port}",
                f"--parent-pid={parent.pid}",
            ]
            running.processes.append(
                _start_logged(superexec_command, logs / f"superexec-{name}.log", env)
            )
        yield running
    finally:
        running.stop()


#: The file ``--compare`` writes its table into, in the base output folder.
COMPARISON_JSON = "comparison.json"
#: The file ``--compare`` draws every strategy's curves into, beside the table.
COMPARISON_PLOT = "comparison.png"


@dataclass(frozen=True)
class ComparisonRun:
    """What :func:`compare_strategies` produced.

    Both files are written by the time it is returned; :func:`main` prints
    ``table`` and the two paths.

    Attributes
    ----------
    comparison : Comparison
        The numbers behind the table: the target, how it was fixed, and one
        result per strategy, the baseline first.
    table : str
        A title line (the strategies, the run config's source, the number of
        SuperNodes and the seed), then the target rule and the Markdown table
        of :func:`~flwr_importance.comparison.format_table`.
    json_path : Path
        :data:`COMPARISON_JSON` in the base output folder: the table, the
        shared run config, each run's folder.
    plot_path : Path
        :data:`COMPARISON_PLOT` in the base output folder: every strategy's
        curves in one figure.
    output_dirs : dict[str, Path]
        Strategy -> the ``output-dir`` its run wrote ``history.json`` into.
    """

    comparison: Comparison
    table: str
    json_path: Path
    plot_path: Path
    output_dirs: dict[str, Path]


def compare_strategies(
    app_dir: Path,
    strategies: Sequence[str],
    *,
    run_config: Path | Mapping[str, object] | None = None,
    output_dir: Path | None = None,
    num_supernodes: int | None = None,
    flwr_home: Path | None = None,
    timeout: float | None = None,
    capture: bool = False,
    federation_config: Mapping[str, object] | None = None,
) -> ComparisonRun:
    """Run each strategy through its own ``flwr run``; compare them with the first.

    Every run gets the same run config (hence the same ``seed``: same data
    partition, same initial model) except ``strategy`` and ``output-dir``
    (``<output_dir>/<strategy>``), on the same number of SuperNodes, one after
    the other; each stops everything it started before the next begins
    (:func:`flwr_run`). The app must honour the ``strategy`` and
    ``output-dir`` run-config keys and write ``history.json`` there, as this
    project's simulation app does.

    Parameters
    ----------
    app_dir : Path
        The Flower App.
    strategies : sequence of str
        Two or more distinct ``strategy`` values; the first is the baseline
        the target is fixed from
        (:func:`~flwr_importance.comparison.compare_histories`).
    run_config : Path or mapping, optional
        Run-config overrides shared by every run (a preset TOML file or a mapping).
    output_dir : Path, optional
        Base output folder; by default the run config's ``output-dir`` (the
        preset's, else the app's). ``comparison.json`` and ``comparison.png``
        go there.
    num_supernodes, flwr_home, timeout, capture, federation_config
        As in :func:`flwr_run` (``timeout`` per run).

    Returns
    -------
    ComparisonRun
        The comparison, its table and the files written.

    Raises
    ------
    ValueError
        Fewer than two strategies, or one listed twice.
    RunFailedError
        A run failed or wrote no ``history.json``; the runs after it are not
        started.
    """
    if len(strategies) < 2 or len(set(strategies)) != len(strategies):
        raise ValueError(
            f"--compare needs two or more distinct strategies, got {list(strategies)}"
        )
    app_dir = app_dir.resolve()
    shared = load_run_config(run_config)
    app_defaults = app_default_config(app_dir)
    base_dir = (
        output_dir
        or Path(
            str(shared.get("output-dir", app_defaults.get("output-dir", "outputs")))
        )
    ).resolve()
    # Resolved once: one warning, and every run on the same federation.
    num_supernodes = supernodes_for_run(app_dir, shared, num_supernodes)
    output_dirs = {strategy: base_dir / strategy for strategy in strategies}
    histories: dict[str, list[dict[str, float]]] = {}
    for index, strategy in enumerate(strategies, start=1):
        history_path = output_dirs[strategy] / "history.json"
        # A history left by an earlier run must not pass for this run's.
        history_path.unlink(missing_ok=True)
        print(
            f"=== [{index}/{len(strategies)}] flwr run: strategy={strategy}, "
            f"{num_supernodes} SuperNodes, output in {output_dirs[strategy]}",
            flush=True,
        )
        started = time.monotonic()
        completed = flwr_run(
            app_dir,
            num_supernodes=num_supernodes,
            run_config={
                **shared,
                "strategy": strategy,
                "output-dir": str(output_dirs[strategy]),
            },
            flwr_home=flwr_home,
            timeout=timeout,
            capture=capture,
            federation_config=federation_config,
        )
        if completed.returncode != 0:
            output = (completed.stdout or "")[-3000:] + (completed.stderr or "")[-3000:]
            error = server_app_error(completed.stdout + completed.stderr)
            raise RunFailedError(
                f"flwr run of strategy={strategy} exited with "
                f"{completed.returncode}{f': {error}' if error else ''}\n{output}"
            )
        if not history_path.is_file():
            raise RunFailedError(
                f"flwr run of strategy={strategy} wrote no {history_path}: the "
                "run failed (its log is above) or the app does not write "
                "history.json into its output-dir run-config value"
            )
        histories[strategy] = json.loads(history_path.read_text())
        print(
            f"=== strategy={strategy} done in {time.monotonic() - started:.0f} s",
            flush=True,
        )
    comparison = compare_histories(histories)
    seed = shared.get("seed", app_defaults.get("seed", "?"))
    source = run_config.name if isinstance(run_config, Path) else "run config"
    title = (
        f"{' vs '.join(strategies)}: {source}, {num_supernodes} SuperNodes, seed {seed}"
    )
    return ComparisonRun(
        comparison=comparison,
        table=f"{title}\n{format_table(comparison)}",
        json_path=write_comparison(
            comparison,
            base_dir / COMPARISON_JSON,
            run_config={**app_defaults, **shared, "num-supernodes": num_supernodes},
            output_dirs=output_dirs,
        ),
        plot_path=plot_comparison(
            histories, comparison, base_dir / COMPARISON_PLOT, title
        ),
        output_dirs=output_dirs,
    )


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM into ``SystemExit``, so ``finally`` blocks stop what was started."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: one ``flwr run``, or ``--compare`` strategies."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", type=Path, default=Path.cwd())
    parser.add_argument(
        "--num-supernodes",
        type=int,
        help="default: the run config's num-supernodes, else Flower's default",
    )
    parser.add_argument(
        "--run-config", type=Path, help="TOML file of run-config overrides"
    )
    parser.add_argument("--flwr-home", type=Path)
    parser.add_argument(
        "--client-cpus",
        # Flower's federation config takes a whole number of CPUs.
        type=int,
        default=ONE_CPU_PER_CLIENTAPP["client-resources-num-cpus"],
        help="CPUs Ray reserves per ClientApp (Flower's own default is 2)",
    )
    parser.add_argument(
        "--compare",
        metavar="BASELINE,STRATEGY[,...]",
        help="run each strategy (comma-separated, the baseline first) through its "
        "own flwr run with the same run config, then print a table and write "
        f"{COMPARISON_JSON} and {COMPARISON_PLOT} into the output dir",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="--compare's base output dir (default: the run config's output-dir)",
    )
    args = parser.parse_args(argv)
    federation_config = {"client-resources-num-cpus": args.client_cpus}
    # `kill` and `timeout` send SIGTERM: unwind like Ctrl-C, stopping the SuperLink.
    previous_sigterm_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if args.compare is None:
            completed = flwr_run(
                args.app,
                num_supernodes=args.num_supernodes,
                run_config=args.run_config,
                flwr_home=args.flwr_home,
                federation_config=federation_config,
            )
            error = server_app_error(completed.stdout + completed.stderr)
            if completed.returncode != 0 and error:
                print(f"error: the run failed: {error}", file=sys.stderr)
            return completed.returncode
        result = compare_strategies(
            args.app,
            [name.strip() for name in args.compare.split(",") if name.strip()],
            run_config=args.run_config,
            output_dir=args.output_dir,
            num_supernodes=args.num_supernodes,
            flwr_home=args.flwr_home,
            federation_config=federation_config,
        )
    except KeyboardInterrupt:
        print(
            "Interrupted; every process this run started is stopped.", file=sys.stderr
        )
        return 130
    except (RunFailedError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm_handler)
    print(f"\n{result.table}\n")
    print(f"Plot written to {result.plot_path}")
    print(f"Table written to {result.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

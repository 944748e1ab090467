"""``flwr run`` on the simulation engine, with its own ``FLWR_HOME`` and SuperLink.

``flwr run`` starts a managed SuperLink that outlives the command, keeps its
configuration in ``~/.flwr`` and, by default, installs the app's dependencies
into a fresh runtime environment on every run. :func:`flwr_run` runs it the way
this project needs: a project-local ``FLWR_HOME``, the current environment, a
SuperLink of its own on free ports (:mod:`.superlink`), stopped with everything
it started when the run ends, fails or is interrupted; a run whose ServerApp
failed returns :data:`FAILED_RUN_RETURNCODE` (:func:`server_app_error`).
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from flwr_importance.tooling.launcher.processes import (
    SCRIPTS_DIR,
    flower_environment,
    format_run_config,
    free_port,
    processes_with_environment,
    terminate,
)
from flwr_importance.tooling.launcher.superlink import (
    FLWR_CONFIG,
    start_managed_superlink,
    stop_local_superlink,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: ``--federation-config`` giving each ClientApp one CPU. Flower's default of 2
#: leaves a single Ray actor on a 2-core machine, whose two torch threads mostly
#: wait on each other; with one CPU each, as many actors run as there are cores.
ONE_CPU_PER_CLIENTAPP: Mapping[str, object] = {"client-resources-num-cpus": 1}

#: Environment variable :func:`flwr_run` sets, to a value unique to the run, for
#: ``flwr run`` and the SuperLink: every process of the run inherits it, so
#: those still running when the run is over are found and stopped.
RUN_MARKER = "FLWR_IMPORTANCE_RUN"


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
        start_managed_superlink(flwr_home, env)
        return run_command(command, env, app_dir, capture=capture, timeout=timeout)
    finally:
        stop_local_superlink(flwr_home)
        # What the SuperLink's children left behind (Ray's processes outlive a
        # killed simulation) or started while being stopped carries the marker.
        terminate(processes_with_environment(RUN_MARKER, env[RUN_MARKER]))


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

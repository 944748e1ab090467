"""The local SuperLink of a simulation-engine ``flwr run``: started, checked, stopped.

``flwr run`` gives the SuperLink it starts 15 s (Flower 1.41, not
configurable); on a loaded two-core machine its imports alone can take longer.
:func:`start_managed_superlink` starts it with the command line ``flwr run``
would use and waits for its health check; :func:`stop_local_superlink` stops
it, with everything it started, by its ``FLWR_HOME``.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path

from flwr_importance.tooling.launcher.processes import (
    SCRIPTS_DIR,
    RunFailedError,
    descendants,
    processes_mentioning,
    start_logged,
    terminate,
)

# Seconds :func:`start_managed_superlink` waits for the SuperLink to come up.
MANAGED_SUPERLINK_STARTUP_TIMEOUT = 180.0

FLWR_CONFIG = """\
[superlink]
default = "local"

[superlink.local]
address = ":local-in-memory:"
"""


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
    targets = [desc for pid in superlinks for desc in descendants(pid)] + superlinks
    # Children first: the SuperLink would otherwise re-spawn or orphan them.
    terminate(targets)
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


def start_managed_superlink(
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
    superlink = start_logged(
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

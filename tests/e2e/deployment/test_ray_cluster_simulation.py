"""The simulation runtime on a Ray cluster started separately (two Ray nodes).

A Ray head (``ray start --head``, one CPU) and a second Ray node (``ray start
--address``, one CPU, its own ports and ``--temp-dir``) run on this machine as
Flower's multi-node simulation guide describes; ``flwr run`` then runs a
preset on that cluster. Flower 1.41's ``init-args`` carry only ``num-cpus``,
``num-gpus``, ``logging-level`` and ``log-to-driver`` (``flwr/cli/flower_config.py``),
and its Ray backend calls ``ray.init(**init_args)`` with no address, so Ray
resolves the cluster from ``RAY_ADDRESS``: the launcher passes it to the
SuperLink it starts, whose simulation process inherits it. With
``client-resources-num-cpus=1``, Ray places one ClientApp actor per node; each
node's worker logs (in its own temp dir) must show a ``ClientAppActor``.

Other tests' ``ray.init()`` cannot attach to this cluster: with no address and
no ``RAY_ADDRESS`` (set only in the SuperLink's environment here) Ray reads
``<default temp dir>/ray_current_cluster``, and ``ray start`` writes that file
into its own ``--temp-dir`` (``ray/scripts/scripts.py``), not the default one.
The cluster is stopped by signalling the two ``ray start --block`` processes
(each stops what it started) and then anything whose command line names the
cluster's temp dirs; never by ``ray stop``, which stops every Ray on the host.

Why the timeout is long and the cluster lean: on a loaded two-core CI machine
(``pytest -n 4``) this test once ran past its 150 s; the run's output showed
Ray's "Running out of retries to initialize the metrics agent". That line is a
symptom, not the cause: Ray is installed without ``ray[default]``, so no
metrics agent ever listens, and every Ray process (GCS, raylets, driver,
workers) logs it 30 s after it starts, i.e. whenever the run lasts that long.
The cause is CPU: the two nodes' Ray processes, the Flower processes and two
ClientApp actors importing torch, on cores that three other workers share. The
run now has :data:`RUN_TIMEOUT` and, on expiry, fails with the tails of both
nodes' logs, the SuperLink's log and the run's output. The cluster starts only
what the run needs (see :func:`ray_node_command`), with no metrics recording
(:data:`RAY_ENVIRONMENT`), and the nodes are awaited by reading the GCS node
table rather than by connecting a driver (``ray.init``) every half second.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from flwr_importance.tooling.launcher import (
    ONE_CPU_PER_CLIENTAPP,
    flower_environment,
    flwr_run,
    free_port,
    processes_mentioning,
)
from flwr_importance.tooling.launcher.processes import descendants, terminate

# Room for both nodes' NODE_TIMEOUT and the RUN_TIMEOUT within pytest's limit,
# so that a slow start fails here, with the logs, rather than by pytest-timeout.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200, func_only=True),
    pytest.mark.usefixtures("heavy_run"),
]

APP_DIR = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).parent / "ray")
ACTOR_MARKER = ":actor_name:ClientAppActor"

#: Seconds the run may take. Alone it takes ~30 s; in a loaded ``-n 4`` run on
#: two cores it has taken over 150 s.
RUN_TIMEOUT = 400
#: Seconds each Ray node may take to join the cluster.
NODE_TIMEOUT = 180

#: Ray settings for the cluster's processes and the run's (the driver and the
#: ClientApp workers inherit the SuperLink's environment), on top of the
#: launcher's ``flower_environment`` (no usage stats, one torch thread).
RAY_ENVIRONMENT = {
    # No metrics agent exists (Ray without ``ray[default]``): record no metrics.
    "RAY_enable_metrics_collection": "0",
    # A worker that starts slowly on a loaded machine must not be killed
    # (default 60 s), or its ClientApp actor dies and that node runs none.
    "RAY_worker_register_timeout_seconds": "300",
}


def ray_node_command(temp_dir: Path, head_port: int, head: bool) -> list[str]:
    """``ray start --block`` of one single-CPU node with its own ports.

    No autoscaler monitor (``--no-monitor``) nor log monitor (worker output
    stays in the node's worker logs, which is where this test reads it). The
    head's API server, which ``--include-dashboard=false`` does not stop, and
    its Ray Client server, which no option stops, listen on free ports rather
    than on 8265 and 10001, where another test's Ray may be.
    """
    command = [
        RAY,
        "start",
        "--block",
        "--num-cpus=1",
        "--disable-usage-stats",
        "--include-log-monitor=false",
    ]
    command += (
        [
            f"--port={head_port}",
            "--head",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
            "--no-monitor",
        ]
        if head
        else [f"--address=127.0.0.1:{head_port}"]
    )
    command += [
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={temp_dir}",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]
    return command


@contextlib.contextmanager
def ray_cluster(root: Path) -> Iterator[tuple[str, list[Path]]]:
    """A two-node Ray cluster; yields its address and each node's temp dir."""
    temp_dirs = [root / "head", root / "node"]
    head_port = free_port()
    env = flower_environment(root / "flwr-home")
    env.pop("RAY_ADDRESS", None)
    env.update(RAY_ENVIRONMENT)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for temp_dir, head in zip(temp_dirs, (True, False), strict=True):
            temp_dir.mkdir(parents=True)
            log = (root / f"{temp_dir.name}.log").open("wb")
            processes.append(
                subprocess.Popen(
                    ray_node_command(temp_dir, head_port, head),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
            wait_for_nodes(f"127.0.0.1:{head_port}", processes, root, env)
        yield f"127.0.0.1:{head_port}", temp_dirs
    finally:
        started = [process.pid for process in processes]
        terminate([pid for pid in started for pid in descendants(pid)])
        terminate(started)
        for process in processes:
            process.wait(timeout=10)
        terminate(processes_mentioning(str(root)))


def wait_for_nodes(
    address: str,
    processes: list[subprocess.Popen[bytes]],
    root: Path,
    env: dict[str, str],
    timeout: float = NODE_TIMEOUT,
) -> None:
    """Wait until the cluster's GCS lists one alive node with a CPU per process.

    Reads the GCS node table without connecting a driver (no job, no worker),
    and gives up as soon as a ``ray start`` exits.
    """
    probe_code = (
        "import sys, time\n"
        "from ray._private.state import GlobalState\n"
        "from ray._raylet import GcsClientOptions\n"
        "while True:\n"
        "    state = GlobalState()\n"
        "    state._initialize_global_state(GcsClientOptions.create(\n"
        f"        {address!r}, None, allow_cluster_id_nil=True,\n"
        "        fetch_cluster_id_if_nil=False))\n"
        "    try:\n"
        "        nodes = state.node_table()\n"
        "    except Exception:\n"
        "        nodes = []\n"
        "    state.disconnect()\n"
        "    alive = [n for n in nodes if n['Alive'] and n['Resources'].get('CPU')]\n"
        f"    if len(alive) >= {len(processes)}: sys.exit(0)\n"
        "    time.sleep(0.5)\n"
    )
    # A separate process: this test process must stay without Ray.
    probe = subprocess.Popen(
        [sys.executable, "-c", probe_code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + timeout
    try:
        while probe.poll() is None:
            exited = [process for process in processes if process.poll() is not None]
            if exited or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    assert probe.returncode == 0, (
        f"{len(processes)} Ray node(s) not up after "
        f"{time.monotonic() - deadline + timeout:.0f} s\n{cluster_logs(root)}"
    )


def tail(path: Path, chars: int = 1500) -> str:
    """The end of the text file ``path`` (a note if it does not exist)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as error:
        return f"<{error}>"


def cluster_logs(root: Path, flwr_home: Path | None = None) -> str:
    """The tails of each Ray node's logs (and of the SuperLink's), to diagnose."""
    parts = []
    for name in ("head", "node"):
        parts.append(f"--- ray start ({name}) ---\n{tail(root / f'{name}.log')}")
        logs = root / name / "session_latest" / "logs"
        for log_name in ("raylet.out", "raylet.err", "gcs_server.out"):
            if (logs / log_name).exists():
                parts.append(f"--- {name} {log_name} ---\n{tail(logs / log_name)}")
        workers = sorted(logs.glob("worker-*"))
        parts.append(f"--- {name} worker logs: {[path.name for path in workers]}")
        for worker_log in workers:
            if worker_log.stat().st_size:
                parts.append(f"--- {name} {worker_log.name} ---\n{tail(worker_log)}")
    if flwr_home is not None:
        for log in sorted((flwr_home / "local-superlink").glob("*.log")):
            parts.append(f"--- SuperLink {log.name} ---\n{tail(log, 3000)}")
    return "\n".join(parts)


def test_ray_cluster_runs_client_apps_on_both_nodes(tmp_path: Path) -> None:
    # Ray's socket paths must fit in 107 bytes: pytest's tmp_path is too long.
    root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    output_dir = tmp_path / "out"
    flwr_home = tmp_path / "flwr-home"
    try:
        with ray_cluster(root) as (address, temp_dirs):
            default_bootstrap = (
                Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
            )
            assert not (
                default_bootstrap.exists() and address in default_bootstrap.read_text()
            ), "the cluster is visible to a plain ray.init()"
            try:
                # Flower's pool holds one actor per node (one CPU each) and
                # sends each its first ClientApp at once, whichever starts
                # first; four ClientApps a round keep both busy.
                completed = flwr_run(
                    APP_DIR,
                    num_supernodes=4,
                    run_config={
                        "strategy": "fedavg",
                        "partitioning": "iid",
                        "num-server-rounds": 2,
                        "clients-per-round": 4,
                        "local-steps": 5,
                        "output-dir": str(output_dir),
                    },
                    flwr_home=flwr_home,
                    extra_env={"RAY_ADDRESS": address, **RAY_ENVIRONMENT},
                    federation_config=ONE_CPU_PER_CLIENTAPP,
                    capture=True,
                    timeout=RUN_TIMEOUT,
                )
            except subprocess.TimeoutExpired as timed_out:
                pytest.fail(
                    f"flwr run not done after {RUN_TIMEOUT} s\n"
                    f"{cluster_logs(root, flwr_home)}\n--- flwr run output ---\n"
                    f"{_text(timed_out.stdout)[-3000:]}"
                    f"{_text(timed_out.stderr)[-3000:]}"
                )
            log = completed.stdout[-3000:] + completed.stderr[-3000:]
            assert completed.returncode == 0, f"{cluster_logs(root, flwr_home)}\n{log}"
            nodes_with_client_apps = [
                temp_dir.name
                for temp_dir in temp_dirs
                if any(
                    ACTOR_MARKER in worker_log.read_text(errors="replace")
                    for worker_log in temp_dir.glob("session_*/logs/worker-*.out")
                )
            ]
            diagnosis = f"{cluster_logs(root, flwr_home)}\n{log}"
        assert nodes_with_client_apps == ["head", "node"], diagnosis
        rows = json.loads((output_dir / "history.json").read_text())
        assert rows[-1]["loss"] < rows[0]["loss"], rows
        assert processes_mentioning(str(root)) == []
        assert processes_mentioning(str(flwr_home.resolve())) == []
        assert not ray.is_initialized()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _text(output: str | bytes | None) -> str:
    """A ``TimeoutExpired``'s captured output as text (``None`` when nothing)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""

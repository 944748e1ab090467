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
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from flwr_importance.launcher import (
    ONE_CPU_PER_CLIENTAPP,
    _descendants,
    _terminate,
    flower_environment,
    flwr_run,
    free_port,
    processes_mentioning,
)

pytestmark = pytest.mark.slow

APP_DIR = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
ACTOR_MARKER = ":actor_name:ClientAppActor"


def ray_node_command(temp_dir: Path, head_port: int, head: bool) -> list[str]:
    """``ray start --block`` of one single-CPU node with its own ports."""
    command = [RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats"]
    command += (
        [f"--port={head_port}", "--head", "--include-dashboard=false"]
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
            wait_for_nodes(f"127.0.0.1:{head_port}", len(processes), root)
        yield f"127.0.0.1:{head_port}", temp_dirs
    finally:
        started = [process.pid for process in processes]
        _terminate([pid for pid in started for pid in _descendants(pid)])
        _terminate(started)
        for process in processes:
            process.wait(timeout=10)
        _terminate(processes_mentioning(str(root)))


def wait_for_nodes(address: str, count: int, root: Path, timeout: float = 60) -> None:
    """Wait until the cluster's GCS lists ``count`` alive nodes."""
    probe = (
        "import ray, sys, time\n"
        f"deadline = time.monotonic() + {timeout}\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        f"        ray.init(address={address!r}, logging_level='ERROR')\n"
        "        alive = sum(node['Alive'] for node in ray.nodes())\n"
        "        ray.shutdown()\n"
        f"        if alive >= {count}: sys.exit(0)\n"
        "    except ConnectionError:\n"
        "        pass\n"
        "    time.sleep(0.5)\n"
        "sys.exit(1)\n"
    )
    # A separate process: this test process must stay without a Ray driver.
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, (completed.stderr[-3000:], root)


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
                extra_env={"RAY_ADDRESS": address},
                federation_config=ONE_CPU_PER_CLIENTAPP,
                capture=True,
                timeout=150,
            )
            log = completed.stdout[-3000:] + completed.stderr[-3000:]
            assert completed.returncode == 0, log
            nodes_with_client_apps = [
                temp_dir.name
                for temp_dir in temp_dirs
                if any(
                    ACTOR_MARKER in worker_log.read_text(errors="replace")
                    for worker_log in temp_dir.glob("session_*/logs/worker-*.out")
                )
            ]
        assert nodes_with_client_apps == ["head", "node"], log
        rows = json.loads((output_dir / "history.json").read_text())
        assert rows[-1]["loss"] < rows[0]["loss"], rows
        assert processes_mentioning(str(root)) == []
        assert processes_mentioning(str(flwr_home.resolve())) == []
        assert not ray.is_initialized()
    finally:
        shutil.rmtree(root, ignore_errors=True)

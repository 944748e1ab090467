"""Deployment seconds per message and per round: our ClientApp against a plain one.

A loopback deployment (:func:`flwr_importance.tooling.launcher.deployment`: one
SuperLink, ``NUM_SUPERNODES`` SuperNodes, Flower's default ``subprocess``
isolation) runs, one after the other, a plain FedAvg app written as a user's
quickstart would be (``benchmarks/plain_fedavg_app``: its own MLP, a DataLoader
loop, Flower's ``FedAvg``, torch and numpy only), the simulation app with
``strategy = "fedavg"``, and (``--full``) the simulation app with each library
strategy. Every run trains the same MLP on the same digits partitions with the
same local work (``local-steps`` SGD steps of ``batch-size`` samples, as in
:mod:`benchmarks.client_overhead`); the plain app reads its partition from an
``.npz`` file written here from the same split. The plain app runs before
and after every other run, and each run is compared with the mean of its two
neighbours (the machine's load drifts during a benchmark).

Each SuperNode starts a new ``flwr-clientapp`` process for every message, so a
message costs a whole process: interpreter start, imports, loading the app,
the handler, the reply. This benchmark watches those processes from
``/proc``: a process's seconds run from its start (its ``starttime``) to its
exit (the first poll that finds it gone or a zombie); the SuperNode's log
(``Receiving: <type> message``, in order per node and run) gives each
process's message type. Reported per run:

- seconds per ``train`` message (the mean over the run's train processes) and
  its ratio to the plain app's (target: at most 1.5 for ``fedavg``);
- seconds per round: from the first ClientApp process's start to the last
  one's exit, divided by the rounds (ServerApp start-up left out), and its
  ratio to the plain app's;
- ClientApp processes per round, by message type (OCS and MMFL train every
  node in ``query.norm``; their ``train`` only sends the kept update). A
  node's first message of a run builds the digits split and keeps its
  partition in the node state (:func:`simulations.task.node_data`): the size
  queries of the size-based methods pay for that, otherwise round 1's train.

It also times importing each app's ClientApp module in a fresh interpreter.
Times vary between runs and machines.

    python -m benchmarks.deployment_overhead          # quick: fedavg, 2 rounds
    python -m benchmarks.deployment_overhead --full   # + library strategies, 3 rounds
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.client_overhead import BATCH_SIZE, LOCAL_STEPS, METHODS
from benchmarks.harness import benchmark_parser, format_ratio, markdown_table
from flwr_importance.tooling.launcher import Deployment, deployment
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.methods import LIBRARY_METHODS
from simulations.task import federated_data

#: The section title of this benchmark in docs/results.md.
TITLE = "Deployment seconds per message vs a plain FedAvg app"

REPO_ROOT = Path(__file__).resolve().parent.parent
PLAIN_APP_DIR = Path(__file__).resolve().parent / "plain_fedavg_app"
PLAIN = "plain"
NUM_SUPERNODES = 3
CLIENTS_PER_ROUND = 2
#: The target of issue 16: the app's seconds per train message over the plain's.
TARGET_RATIO = 1.5
#: Seconds between two looks at ``/proc`` (a process's end is known to this).
POLL_SECONDS = 0.05
#: Seconds the SuperNodes may take to start their SuperExecs.
SUPEREXEC_TIMEOUT = 120.0
#: Seconds a run may take, ServerApp start-up included, on a loaded machine.
RUN_TIMEOUT = 600.0

#: The settings every run shares (the simulation app's names).
COMMON: dict[str, bool | int | float | str] = {
    "dataset": "digits",
    "partitioning": "iid",
    "model": "mlp",
    "clients-per-round": CLIENTS_PER_ROUND,
    "local-lr": 0.2,
    "local-steps": LOCAL_STEPS,
    "local-epochs": 0,
    "batch-size": BATCH_SIZE,
    "heterogeneous-steps": False,
    "num-supernodes": NUM_SUPERNODES,
    "seed": 0,
}
#: Overrides so that every library strategy runs on three nodes of digits.
DEPLOYMENT_OVERRIDES: dict[str, dict[str, bool | int | float | str]] = {
    # Sizes above the largest partition are clipped (and the estimate wrong).
    "fedsampling": {"fedsampling-max-size": 1500},
}

_RECEIVING = re.compile(r"Receiving: (\S+) message")
_RUN = re.compile(r"\[RUN (\d+)")


@dataclass
class ClientAppProcess:
    """One ``flwr-clientapp`` process seen in ``/proc``."""

    node: int
    start: float
    end: float | None = None
    message_type: str = ""
    #: Its command line was seen to run ``flwr-clientapp``.
    confirmed: bool = False

    @property
    def seconds(self) -> float:
        """From start to exit."""
        if self.end is None:
            raise ValueError("the process has not been seen to exit")
        return self.end - self.start


class ClientAppWatcher:
    """Records every ClientApp process of a deployment's SuperNodes from ``/proc``.

    Each SuperNode starts one SuperExec, and the SuperExec starts a ClientApp
    process per message: a new process whose parent is the SuperExec of
    SuperNode ``supernode_pids[i]`` and whose command line, once it has
    exec'd (a child shows its parent's until then), runs ``flwr-clientapp`` is
    a ClientApp of node ``i``. Times are seconds since boot, the clock of
    ``/proc/<pid>/stat``'s ``starttime``.
    """

    def __init__(self, supernode_pids: Sequence[int]) -> None:
        self.supernode_pids = list(supernode_pids)
        self.processes: dict[int, ClientAppProcess] = {}
        self._superexecs: dict[int, int] = {}
        self._known: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> ClientAppWatcher:
        # A SuperNode starts its SuperExec once it is up (and other, short-lived
        # children: the SuperExec is the one running flower-superexec).
        deadline = time.monotonic() + SUPEREXEC_TIMEOUT
        while set(self._superexecs.values()) != set(range(len(self.supernode_pids))):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"SuperExecs of nodes {sorted(self._superexecs.values())} only, "
                    f"after {SUPEREXEC_TIMEOUT:.0f} s"
                )
            time.sleep(POLL_SECONDS)
            # Processes already there (an earlier run's, maybe zombies) are not
            # ClientApps of this run; the SuperExecs are among them.
            self._known = self._pids()
            for pid in self._known:
                fields = self._stat_fields(pid)
                if (
                    fields is not None
                    and int(fields[1]) in self.supernode_pids
                    and self._runs(pid, b"flower-superexec")
                ):
                    self._superexecs[pid] = self.supernode_pids.index(int(fields[1]))
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.poll()
            time.sleep(POLL_SECONDS)
        self.poll()

    def poll(self) -> None:
        """Note new ClientApp processes and the exit of the ones seen before."""
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        pids = self._pids()
        for pid, process in self.processes.items():
            if process.end is None and not self._alive(pid):
                process.end = now
            elif not process.confirmed:
                process.confirmed = self._runs(pid, b"flwr-clientapp")
        for pid in pids - self._known:
            fields = self._stat_fields(pid)
            if fields is not None and int(fields[1]) in self._superexecs:
                # Field 22 of stat (starttime) is the 20th after the name.
                self.processes[pid] = ClientAppProcess(
                    self._superexecs[int(fields[1])], int(fields[19]) / self._ticks
                )
        self._known = pids

    @property
    def clientapps(self) -> list[ClientAppProcess]:
        """The ClientApp processes seen (other children of a SuperExec left out)."""
        return [process for process in self.processes.values() if process.confirmed]

    @staticmethod
    def _runs(pid: int, program: bytes) -> bool:
        """Whether ``pid``'s command line runs ``program`` (a script or not)."""
        try:
            command = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            return False
        return any(part.endswith(program) for part in command.split(b"\0")[:2])

    @staticmethod
    def _pids() -> set[int]:
        return {int(name) for name in os.listdir("/proc") if name.isdigit()}

    @staticmethod
    def _stat_fields(pid: int) -> list[str] | None:
        """The fields of ``/proc/<pid>/stat`` after the command name."""
        try:
            stat = (Path("/proc") / str(pid) / "stat").read_text()
        except OSError:
            return None
        # Empty when read as the process is reaped.
        return stat[stat.rindex(")") + 2 :].split() if ")" in stat else None

    def _alive(self, pid: int) -> bool:
        fields = self._stat_fields(pid)
        # A zombie has exited: the SuperExec reaps its children only later.
        return fields is not None and fields[0] != "Z"


def received_message_types(log_file: Path, run_id: int) -> list[str]:
    """The message types a SuperNode received for ``run_id``, in order."""
    types, current_run = [], None
    for line in log_file.read_text(errors="replace").splitlines():
        if run := _RUN.search(line):
            current_run = int(run.group(1))
        elif (received := _RECEIVING.search(line)) and current_run == run_id:
            types.append(received.group(1))
    return types


@dataclass
class RunTiming:
    """One run's ClientApp processes and wall time."""

    name: str
    rounds: int
    processes: list[ClientAppProcess] = field(default_factory=list)
    wall_seconds: float = float("nan")

    def seconds_per_message(self, message_type: str) -> float:
        """Mean seconds of the run's ``message_type`` processes (NaN if none)."""
        seconds = [p.seconds for p in self.processes if p.message_type == message_type]
        return statistics.fmean(seconds) if seconds else float("nan")

    @property
    def seconds_per_round(self) -> float:
        """First ClientApp start to last ClientApp exit, over the rounds."""
        if not self.processes:
            raise ValueError(f"{self.name}: no ClientApp process was seen")
        start = min(process.start for process in self.processes)
        end = max(process.seconds + process.start for process in self.processes)
        return (end - start) / self.rounds

    @property
    def processes_per_round(self) -> dict[str, float]:
        """ClientApp processes per round, by message type."""
        counts = Counter(process.message_type for process in self.processes)
        return {kind: count / self.rounds for kind, count in sorted(counts.items())}


def timed_run(
    running: Deployment,
    name: str,
    app_dir: Path,
    run_config: Mapping[str, bool | int | float | str],
) -> RunTiming:
    """Submit one run, wait for it, and time its ClientApp processes."""
    rounds = int(run_config["num-server-rounds"])
    # The SuperNodes' processes follow the SuperLink's.
    supernode_pids = [process.pid for process in running.processes[1:]]
    start = time.perf_counter()
    with ClientAppWatcher(supernode_pids) as watcher:
        run_id = running.submit(app_dir, run_config)
        status = running.wait([run_id], timeout=RUN_TIMEOUT)[run_id]
        # The last process may still be exiting after the run is marked done.
        deadline = time.monotonic() + 60.0
        while any(process.end is None for process in watcher.processes.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: a ClientApp process did not exit")
            time.sleep(POLL_SECONDS)
    if status != "finished:completed":
        raise RuntimeError(f"{name}: run {run_id} {status}; logs in {running.work_dir}")
    timing = RunTiming(name, rounds, wall_seconds=time.perf_counter() - start)
    by_node: defaultdict[int, list[ClientAppProcess]] = defaultdict(list)
    for process in watcher.clientapps:
        by_node[process.node].append(process)
    for node in range(NUM_SUPERNODES):
        processes = sorted(by_node[node], key=lambda process: process.start)
        types = received_message_types(
            running.work_dir / "logs" / f"supernode-{node}.log", run_id
        )
        # One message at a time per node and run: the k-th process serves the
        # k-th message the node received.
        if len(types) != len(processes):
            raise RuntimeError(
                f"{name}: node {node} received {len(types)} messages but "
                f"{len(processes)} ClientApp processes were seen"
            )
        for process, message_type in zip(processes, types, strict=True):
            process.message_type = message_type
        timing.processes += processes
    return timing


def write_plain_data(data_dir: Path) -> None:
    """The digits split of :data:`COMMON` as ``.npz`` files for the plain app."""
    config = ExperimentConfig.from_run_config(resolve_run_config(COMMON))
    split = federated_data(config, NUM_SUPERNODES)
    data_dir.mkdir(parents=True, exist_ok=True)
    for index, partition in enumerate(split.partitions):
        np.savez(
            data_dir / f"partition-{index}.npz",
            x=partition.x.numpy(),
            y=partition.y.numpy(),
        )
    np.savez(data_dir / "test.npz", x=split.test.x.numpy(), y=split.test.y.numpy())


def plain_run_config(
    data_dir: Path, rounds: int
) -> dict[str, bool | int | float | str]:
    """The plain app's run config: the shared settings it knows."""
    shared = ("local-lr", "local-steps", "batch-size", "seed")
    return {
        **{key: COMMON[key] for key in shared},
        # Flower's FedAvg samples int(fraction-train * nodes) nodes.
        "fraction-train": CLIENTS_PER_ROUND / NUM_SUPERNODES,
        "num-server-rounds": rounds,
        "data-dir": str(data_dir),
    }


def app_run_config(
    strategy: str, rounds: int, output_dir: Path
) -> dict[str, bool | int | float | str]:
    """The simulation app's run config for ``strategy``."""
    return {
        **COMMON,
        **METHODS[strategy],
        **DEPLOYMENT_OVERRIDES.get(strategy, {}),
        "num-server-rounds": rounds,
        "output-dir": str(output_dir),
    }


def import_seconds(module: str, cwd: Path, repeats: int = 3) -> float:
    """Median seconds of ``python -c "import <module>"`` in a fresh interpreter."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], cwd=cwd, check=True)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def run_row(timing: RunTiming) -> dict[str, Any]:
    """One run's seconds per message type and per round, and its processes."""
    return {
        "run": timing.name,
        "rounds": timing.rounds,
        "seconds_per_train": timing.seconds_per_message("train"),
        "seconds_per_round": timing.seconds_per_round,
        "seconds_by_type": {
            kind: timing.seconds_per_message(kind)
            for kind in timing.processes_per_round
        },
        "processes_per_round": timing.processes_per_round,
        "wall_seconds": timing.wall_seconds,
    }


def rows(timings: Sequence[RunTiming]) -> list[dict[str, Any]]:
    """Each app run against the mean of the plain runs just before and after it.

    ``timings`` alternate: plain, app, plain, app, ..., plain. The machine's
    load drifts over a benchmark; the neighbouring plain runs saw the closest.
    """
    table = []
    for index in range(1, len(timings), 2):
        before, timing, after = timings[index - 1 : index + 2]
        if {before.name, after.name} != {PLAIN} or timing.name == PLAIN:
            raise ValueError("runs must alternate plain, app, plain")
        row = run_row(timing)
        for key in ("seconds_per_train", "seconds_per_round"):
            plain = statistics.fmean(run_row(each)[key] for each in (before, after))
            row[f"plain_{key}"] = plain
            row[f"ratio_{key.removeprefix('seconds_')}"] = row[key] / plain
        table.append(row)
    return table


def overhead_table(table: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a markdown table."""
    columns = [
        "strategy",
        "s per train message",
        "plain",
        "ratio",
        "s per round",
        "plain",
        "ratio",
        "ClientApp processes per round (mean s)",
    ]
    cells = []
    for row in table:
        processes = ", ".join(
            f"{kind} {count:.1f} ({row['seconds_by_type'][kind]:.1f} s)"
            for kind, count in row["processes_per_round"].items()
        )
        cells.append(
            [
                row["run"],
                f"{row['seconds_per_train']:.2f}",
                f"{row['plain_seconds_per_train']:.2f}",
                format_ratio(row["ratio_per_train"]),
                f"{row['seconds_per_round']:.2f}",
                f"{row['plain_seconds_per_round']:.2f}",
                format_ratio(row["ratio_per_round"]),
                processes,
            ]
        )
    return markdown_table(columns, cells)


def main(argv: Sequence[str] | None = None) -> None:
    """Time the runs on one deployment; write the table and JSON."""
    args = benchmark_parser("deployment_overhead", __doc__).parse_args(argv)
    strategies = ["fedavg", *LIBRARY_METHODS] if args.full else ["fedavg"]
    rounds = 3 if args.full else 2
    args.output_dir.mkdir(parents=True, exist_ok=True)
    imports = {
        PLAIN: import_seconds("plain_fedavg.client_app", PLAIN_APP_DIR),
        "simulation app": import_seconds("simulations.client_app", REPO_ROOT),
    }
    timings = []
    # Kept after the run: the deployment's logs are there.
    work_dir = args.output_dir / "work"
    shutil.rmtree(work_dir, ignore_errors=True)
    write_plain_data(work_dir / "data")
    plain_config = plain_run_config(work_dir / "data", rounds)
    with deployment(NUM_SUPERNODES, work_dir / "deployment") as running:
        # Each app run between two plain runs (see rows).
        for name in [PLAIN, *(run for each in strategies for run in (each, PLAIN))]:
            if name == PLAIN:
                timing = timed_run(running, name, PLAIN_APP_DIR, plain_config)
            else:
                run_config = app_run_config(name, rounds, work_dir / name)
                timing = timed_run(running, name, REPO_ROOT, run_config)
            print(
                f"{name}: {timing.wall_seconds:.0f} s, "
                f"{timing.seconds_per_message('train'):.2f} s per train message",
                flush=True,
            )
            timings.append(timing)
    leftover = running.leftover_processes()
    table = rows(timings)
    fedavg = next(row for row in table if row["run"] == "fedavg")
    results = {
        "mode": "full" if args.full else "quick",
        "num_supernodes": NUM_SUPERNODES,
        "rounds": rounds,
        "settings": {**COMMON},
        "import_seconds": imports,
        "target_ratio_per_train": TARGET_RATIO,
        "fedavg_within_target": fedavg["ratio_per_train"] <= TARGET_RATIO,
        "leftover_processes": leftover,
        "plain_runs": [run_row(each) for each in timings if each.name == PLAIN],
        "rows": table,
    }
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    verdict = "within" if results["fedavg_within_target"] else "above"
    text = (
        "# Deployment seconds per message and per round\n\n"
        f"Loopback deployment, {NUM_SUPERNODES} SuperNodes (a new ClientApp "
        f"process per message), {rounds} rounds, {CLIENTS_PER_ROUND} clients per "
        f"round, {LOCAL_STEPS} local steps of {BATCH_SIZE} samples, MLP on digits. "
        "Each run of the simulation app with a strategy is compared with the mean "
        "of a plain FedAvg app's runs (torch and numpy only) just before and "
        "after it. Seconds per message: a ClientApp process from start to exit; "
        "per round: first ClientApp start to last exit over the rounds. Importing "
        f"the ClientApp module: plain {imports[PLAIN]:.2f} s, simulation app "
        f"{imports['simulation app']:.2f} s. The app's seconds per train message "
        f"are {fedavg['ratio_per_train']:.2f}x the plain app's, {verdict} the "
        f"{TARGET_RATIO}x target. A node's first message of a run builds the "
        "digits split (the size queries, where a method sends them). Times vary "
        "between runs and machines.\n\n"
        f"{overhead_table(table)}\n"
    )
    (args.output_dir / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

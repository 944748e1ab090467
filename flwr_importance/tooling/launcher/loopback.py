"""The deployment engine on loopback: a SuperLink and its SuperNodes as processes.

:func:`deployment` starts a real ``flower-superlink`` and N
``flower-supernode`` processes on free ports, each node with its own
``partition-id``/``num-partitions`` node config; runs are submitted with
``flwr run <app> <superlink>`` and followed with ``flwr ls``
(:class:`Deployment`); every process started is stopped, with its
descendants, on exit.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

from flwr_importance.tooling.launcher.processes import (
    SCRIPTS_DIR,
    RunFailedError,
    descendants,
    flower_environment,
    format_run_config,
    free_port,
    processes_mentioning,
    program_name,
    start_logged,
    terminate,
)

# The name of a deployment's SuperLink connection in its FLWR_HOME config.toml.
DEPLOYMENT_CONNECTION = "deployment"
# `flwr ls` status prefix of a run that is over ("finished:completed", ...).
RUN_FINISHED = "finished"


@dataclass(frozen=True)
class Transport:
    """How a deployment's processes connect: the flags and settings each takes.

    The default is the insecure loopback deployment of :func:`deployment`
    (plaintext gRPC/HTTP, no node authentication); :mod:`.secure` builds one
    with TLS and SuperNode authentication.

    Attributes
    ----------
    connection : str
        Lines of the ``config.toml`` connection after its ``address``.
    superlink : tuple of str
        Flags of ``flower-superlink``.
    supernode : callable
        Flags of SuperNode ``index`` (``supernode(index)``).
    superlink_superexec, supernode_superexec : tuple of str
        Flags of a SuperExec (``executor``) serving the SuperLink's and a
        SuperNode's runtime API.
    before_supernodes : callable, optional
        Called with the deployment once the SuperLink listens, before any
        SuperNode starts (e.g. to register the nodes' public keys).
    """

    connection: str = "insecure = true\n"
    superlink: tuple[str, ...] = ("--insecure",)
    supernode: Callable[[int], Sequence[str]] = lambda index: ("--insecure",)
    superlink_superexec: tuple[str, ...] = ("--insecure",)
    supernode_superexec: tuple[str, ...] = ("--insecure",)
    before_supernodes: Callable[[Deployment], None] | None = None


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
                    f"{program_name(process)} exited with {process.returncode}; "
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
        terminate([pid for pid in started for pid in descendants(pid)])
        terminate(started)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        terminate(self.leftover_processes())


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RunFailedError(
                f"{program_name(process)} exited with {process.returncode}"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def supernode_command(
    flags: Sequence[str], superlink: str, node_config: Mapping[str, object], port: int
) -> list[str]:
    """``flower-supernode`` with ``flags``, for ``superlink``, on loopback ``port``."""
    return [
        str(SCRIPTS_DIR / "flower-supernode"),
        *flags,
        f"--superlink={superlink}",
        f"--node-config={format_run_config(node_config)}",
        "--host=127.0.0.1",
        f"--port={port}",
    ]


class DeploymentOptions(TypedDict, total=False):
    """The keyword options of :func:`deployment` and ``secure_deployment``.

    Documented on :func:`deployment`.
    """

    node_configs: Sequence[Mapping[str, object]] | None
    executor: Sequence[str] | None
    extra_env: Mapping[str, str] | None
    startup_timeout: float
    supernode_superlink: Callable[[str], str] | None


@contextlib.contextmanager
def deployment(
    num_supernodes: int, work_dir: Path, **options: Unpack[DeploymentOptions]
) -> Iterator[Deployment]:
    """Run a SuperLink and ``num_supernodes`` SuperNodes on loopback (insecure).

    Parameters
    ----------
    num_supernodes : int
        Number of ``flower-supernode`` processes.
    work_dir : Path
        Folder for ``FLWR_HOME`` (``<work_dir>/flwr-home``), the SuperLink's
        database and the process logs (``<work_dir>/logs``).
    **options
        The :class:`DeploymentOptions` below.

    Other Parameters
    ----------------
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
    supernode_superlink : callable, optional
        Given the SuperLink's address once it listens, the address the
        SuperNodes dial instead (e.g. :meth:`.wiretap.WireTap.relay_to`, a
        relay that records what the nodes send); by default the SuperLink's.

    Yields
    ------
    Deployment
        Submit runs with :meth:`Deployment.submit`, await them with
        :meth:`Deployment.wait`. On exit, normal or not, every process started
        here is stopped with its descendants.
    """
    with deploy(Transport(), num_supernodes, work_dir, **options) as running:
        yield running


@contextlib.contextmanager
def deploy(
    transport: Transport,
    num_supernodes: int,
    work_dir: Path,
    *,
    node_configs: Sequence[Mapping[str, object]] | None = None,
    executor: Sequence[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    startup_timeout: float = 60.0,
    supernode_superlink: Callable[[str], str] | None = None,
    running_type: type[Deployment] = Deployment,
) -> Iterator[Deployment]:
    """:func:`deployment` with the flags of ``transport``.

    ``running_type`` is the class of the yielded deployment (a subclass of
    :class:`Deployment` taking the same fields).
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
        + transport.connection
    )
    env = flower_environment(flwr_home)
    env.update(extra_env or {})
    isolation = ["--isolation=process"] if executor else []
    running = running_type(
        address=address,
        flwr_home=flwr_home,
        work_dir=work_dir,
        env=env,
        markers=[str(work_dir), address],
    )
    try:
        superlink = start_logged(
            [
                str(SCRIPTS_DIR / "flower-superlink"),
                *transport.superlink,
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
        if transport.before_supernodes is not None:
            transport.before_supernodes(running)
        runtime_apis = [(superlink_port, superlink, "superlink")]
        node_superlink = (
            supernode_superlink(address) if supernode_superlink else address
        )
        for index, node_config in enumerate(node_configs):
            node_port = free_port()
            # The node's ClientApp processes name this address: a marker.
            running.markers.append(f"127.0.0.1:{node_port}")
            supernode = start_logged(
                supernode_command(
                    [*transport.supernode(index), *isolation],
                    node_superlink,
                    node_config,
                    node_port,
                ),
                logs / f"supernode-{index}.log",
                env,
            )
            running.processes.append(supernode)
            runtime_apis.append((node_port, supernode, f"supernode-{index}"))
        for port, parent, name in runtime_apis if executor else []:
            superexec_command = [
                *(executor or []),
                *(
                    transport.superlink_superexec
                    if parent is superlink
                    else transport.supernode_superexec
                ),
                f"--runtime-api-address=127.0.0.1:{port}",
                f"--parent-pid={parent.pid}",
            ]
            running.processes.append(
                start_logged(superexec_command, logs / f"superexec-{name}.log", env)
            )
        yield running
    finally:
        running.stop()

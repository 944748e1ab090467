"""The deployment engine on loopback with TLS and SuperNode authentication.

:func:`secure_deployment` is :func:`.loopback.deployment` with every
connection encrypted and every SuperNode authenticated, from credentials made
for the run under ``<work_dir>/credentials`` with Python's ``cryptography``:

- a CA (``ca.crt``) and a server certificate for ``127.0.0.1``/``localhost``
  signed by it (``server.pem``, ``server.key``);
- one NIST P-384 key pair per SuperNode, in OpenSSH format
  (``supernode-<i>``, ``supernode-<i>.pub``), the format Flower 1.41 reads.

The SuperLink starts with ``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile``
and ``--enable-supernode-auth``; each node's public key is registered with
``flwr supernode register <key.pub> <connection>`` (Flower 1.41 dropped the
SuperLink's ``--auth-list-public-keys``) before the node starts with
``--root-certificates ca.crt --auth-supernode-private-key <key>``; ``flwr``
commands trust the CA through ``root-certificates`` in ``config.toml``.
:meth:`SecureDeployment.start_outsider` starts a SuperNode that is not part of
the federation (a key never registered, or plaintext), to check it is refused.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Unpack

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from flwr_importance.tooling.launcher.loopback import (
    DEPLOYMENT_CONNECTION,
    Deployment,
    DeploymentOptions,
    Transport,
    deploy,
    supernode_command,
)
from flwr_importance.tooling.launcher.processes import (
    free_port,
    start_logged,
    terminate,
)

# How long a node whose key is refused keeps trying (``flower-supernode``'s
# ``--max-retries`` / ``--max-wait-time``) before it exits.
OUTSIDER_MAX_RETRIES = 3
OUTSIDER_MAX_WAIT_SECONDS = 20


@dataclass(frozen=True)
class Credentials:
    """The files of a secure deployment (all PEM/OpenSSH, made for one run)."""

    ca_certificate: Path
    server_certificate: Path
    server_key: Path
    node_keys: tuple[Path, ...]

    def public_key(self, index: int) -> Path:
        """OpenSSH public key of SuperNode ``index`` (what is registered)."""
        return public_key_path(self.node_keys[index])


def public_key_path(private_key: Path) -> Path:
    """Where :func:`write_node_key` puts the public key of ``private_key``."""
    return private_key.with_name(private_key.name + ".pub")


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def write_node_key(path: Path) -> Path:
    """Write a NIST P-384 key pair: ``path`` (private) and ``path.pub``, OpenSSH."""
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    public_key_path(path).write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return path


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
) -> x509.Certificate:
    """A certificate of ``key``: self-signed CA, or server signed by ``issuer``."""
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, signing_key = issuer if issuer else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True
        )
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return builder.sign(signing_key, hashes.SHA256())


def write_credentials(folder: Path, num_supernodes: int) -> Credentials:
    """Make a CA, a server certificate for loopback and the nodes' key pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = "flwr-importance loopback CA"
    server_key = ec.generate_private_key(ec.SECP384R1())
    files = Credentials(
        ca_certificate=folder / "ca.crt",
        server_certificate=folder / "server.pem",
        server_key=folder / "server.key",
        node_keys=tuple(
            write_node_key(folder / f"supernode-{index}")
            for index in range(num_supernodes)
        ),
    )
    pem = serialization.Encoding.PEM
    files.ca_certificate.write_bytes(
        _certificate(ca_name, ca_key, None).public_bytes(pem)
    )
    files.server_certificate.write_bytes(
        _certificate("127.0.0.1", server_key, (ca_name, ca_key)).public_bytes(pem)
    )
    _write_private(
        files.server_key,
        server_key.private_bytes(
            pem,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return files


def superlink_flags(credentials: Credentials) -> tuple[str, ...]:
    """``flower-superlink`` flags: TLS with the run's certificate, node auth on."""
    return (
        f"--ssl-ca-certfile={credentials.ca_certificate}",
        f"--ssl-certfile={credentials.server_certificate}",
        f"--ssl-keyfile={credentials.server_key}",
        "--enable-supernode-auth",
    )


def supernode_flags(ca_certificate: Path, private_key: Path) -> tuple[str, ...]:
    """``flower-supernode`` flags: trust the run's CA, sign with the node's key."""
    return (
        f"--root-certificates={ca_certificate}",
        f"--auth-supernode-private-key={private_key}",
    )


def connection_settings(ca_certificate: Path) -> str:
    """``config.toml`` lines of the connection after its address: trust the CA."""
    return f'root-certificates = "{ca_certificate}"\n'


@dataclass
class SecureDeployment(Deployment):
    """A :class:`Deployment` with TLS and node authentication.

    Attributes
    ----------
    credentials : Credentials, optional
        The run's CA, server certificate and node keys.
    registered : dict
        Node ID the SuperLink gave each registered SuperNode (by index).
    outsiders : list
        SuperNodes started with :meth:`start_outsider`; stopped on exit too.
    """

    credentials: Credentials | None = None
    registered: dict[int, int] = field(default_factory=dict)
    outsiders: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def register(self, public_key: Path) -> int:
        """``flwr supernode register <key.pub> <connection>``; the node's ID."""
        reply = self.flwr(
            "supernode", "register", str(public_key), DEPLOYMENT_CONNECTION
        )
        return int(str(reply["node-id"]))

    def nodes(self) -> dict[int, str]:
        """``flwr supernode ls``: each node the SuperLink knows, by ID, its status."""
        reply = self.flwr("supernode", "ls", DEPLOYMENT_CONNECTION)
        nodes = reply["nodes"]
        assert isinstance(nodes, list)
        return {int(node["node-id"]): str(node["status"]) for node in nodes}

    def start_outsider(
        self,
        name: str,
        *,
        private_key: Path | None = None,
        insecure: bool = False,
        node_config: Mapping[str, object] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a SuperNode outside the federation; its log is ``logs/<name>.log``.

        It signs with ``private_key`` if given (registered or not) and speaks
        TLS unless ``insecure``; either way it gives up after
        ``OUTSIDER_MAX_RETRIES`` tries or ``OUTSIDER_MAX_WAIT_SECONDS``.
        """
        assert self.credentials is not None
        flags: tuple[str, ...] = (
            ("--insecure",)
            if insecure
            else (f"--root-certificates={self.credentials.ca_certificate}",)
        )
        if private_key is not None:
            flags += (f"--auth-supernode-private-key={private_key}",)
        port = free_port()
        self.markers.append(f"127.0.0.1:{port}")
        flags += (
            f"--max-retries={OUTSIDER_MAX_RETRIES}",
            f"--max-wait-time={OUTSIDER_MAX_WAIT_SECONDS}",
        )
        process = start_logged(
            supernode_command(flags, self.address, node_config or {}, port),
            self.work_dir / "logs" / f"{name}.log",
            self.env,
        )
        self.outsiders.append(process)
        return process

    def stop(self) -> None:
        """Stop the outsiders, then everything :meth:`Deployment.stop` stops."""
        terminate([process.pid for process in self.outsiders])
        for process in self.outsiders:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        super().stop()


@contextlib.contextmanager
def secure_deployment(
    num_supernodes: int, work_dir: Path, **options: Unpack[DeploymentOptions]
) -> Iterator[SecureDeployment]:
    """:func:`.loopback.deployment` with TLS and SuperNode authentication.

    Credentials are made under ``<work_dir>/credentials``
    (:func:`write_credentials`); each SuperNode's public key is registered
    with ``flwr supernode register`` once the SuperLink listens, before the
    nodes start. An ``executor`` serving the SuperLink trusts the run's CA
    (``--root-certificates``); the nodes' runtime APIs stay on loopback
    without TLS, as Flower's own SuperNodes start their SuperExecs.
    Parameters and the exit behaviour are :func:`.loopback.deployment`'s.
    """
    work_dir = work_dir.resolve()
    credentials = write_credentials(work_dir / "credentials", num_supernodes)

    def register_all(running: Deployment) -> None:
        assert isinstance(running, SecureDeployment)
        running.credentials = credentials
        for index in range(num_supernodes):
            running.registered[index] = running.register(credentials.public_key(index))

    transport = Transport(
        connection=connection_settings(credentials.ca_certificate),
        superlink=superlink_flags(credentials),
        supernode=lambda index: supernode_flags(
            credentials.ca_certificate, credentials.node_keys[index]
        ),
        superlink_superexec=(f"--root-certificates={credentials.ca_certificate}",),
        supernode_superexec=("--insecure",),
        before_supernodes=register_all,
    )
    with deploy(
        transport, num_supernodes, work_dir, running_type=SecureDeployment, **options
    ) as running:
        assert isinstance(running, SecureDeployment)
        yield running

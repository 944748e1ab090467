"""A loopback TCP relay that keeps every byte the SuperNodes send the SuperLink.

A test that claims the server never sees a client's value in the clear must
look where the value would travel. :class:`WireTap` sits between the
SuperNodes and the SuperLink of a loopback deployment: the SuperNodes dial the
tap (``deployment(..., supernode_superlink=tap.relay_to)``), the tap dials the
SuperLink and relays both ways, and :attr:`WireTap.sent_by_nodes` holds every
byte that went from a SuperNode towards the SuperLink (plaintext gRPC over
HTTP/2 in an insecure deployment, so a reply's arrays appear as their raw
bytes, cut only where HTTP/2 frames them).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from flwr_importance.tooling.launcher.processes import free_port

# Bytes read per recv call; any size works, this one keeps the relay cheap.
_CHUNK = 1 << 16


class WireTap:
    """Relay ``127.0.0.1:<port>`` to a SuperLink and record the nodes' bytes.

    Use it as a context manager; :meth:`relay_to` starts the relay, and leaving
    the ``with`` block closes the listening socket and every relayed
    connection.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recorded = bytearray()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()

    @property
    def sent_by_nodes(self) -> bytes:
        """Every byte relayed from a SuperNode towards the SuperLink so far."""
        with self._lock:
            return bytes(self._recorded)

    def relay_to(self, superlink_address: str) -> str:
        """Start relaying to ``superlink_address``; the address nodes should dial."""
        if self._listener is not None:
            raise RuntimeError("this WireTap already relays to a SuperLink")
        host, port = superlink_address.rsplit(":", 1)
        listener = socket.create_server(("127.0.0.1", free_port()))
        self._listener = listener
        threading.Thread(
            target=self._accept, args=(listener, (host, int(port))), daemon=True
        ).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    def close(self) -> None:
        """Stop relaying: close the listener and every relayed connection."""
        self._stopped.set()
        with self._lock:
            sockets = [*self._sockets, *([self._listener] if self._listener else [])]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> WireTap:
        """Return the tap; it relays once :meth:`relay_to` is called."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close every socket of the tap."""
        self.close()

    def _accept(self, listener: socket.socket, superlink: tuple[str, int]) -> None:
        while not self._stopped.is_set():
            try:
                node_side, _ = listener.accept()
            except OSError:
                return
            try:
                link_side = socket.create_connection(superlink)
            except OSError:
                node_side.close()
                continue
            with self._lock:
                self._sockets += [node_side, link_side]
            for source, sink, record in (
                (node_side, link_side, True),
                (link_side, node_side, False),
            ):
                threading.Thread(
                    target=self._pump, args=(source, sink, record), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        for chunk in _chunks(source):
            if record:
                with self._lock:
                    self._recorded += chunk
            try:
                sink.sendall(chunk)
            except OSError:
                break
        # One side hung up: let the other side see it too.
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _chunks(source: socket.socket) -> Iterator[bytes]:
    """What ``source`` sends, chunk by chunk, until it closes or fails."""
    while True:
        try:
            chunk = source.recv(_CHUNK)
        except OSError:
            return
        if not chunk:
            return
        yield chunk

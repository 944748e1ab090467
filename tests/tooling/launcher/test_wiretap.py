"""The wire tap relays both ways and records exactly what the nodes' side sent."""

from __future__ import annotations

import socket
import threading

from flwr_importance.tooling.launcher.wiretap import WireTap


def _echo_server() -> tuple[socket.socket, str]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            while data := connection.recv(1024):
                connection.sendall(data.upper())

    threading.Thread(target=serve, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


def test_relays_both_ways_and_records_only_the_nodes_bytes() -> None:
    server, address = _echo_server()
    with server, WireTap() as tap:
        host, port = tap.relay_to(address).rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as node:
            node.sendall(b"masked?")
            reply = b""
            while len(reply) < len(b"masked?"):
                reply += node.recv(1024)
        assert reply == b"MASKED?"
        assert tap.sent_by_nodes == b"masked?"

"""Where a paused call's pdb listens, and who may talk to it: the two listeners of the
in-task debugger, and the client's side of each (``lightwork debug`` connects with
:func:`connect`).

* :class:`UnixListener` (the embedded runtime): a Unix socket in the session directory
  (0700), itself 0600; a client of another uid (``SO_PEERCRED``) is closed before a
  byte is read or sent.
* :class:`TokenListener` (a cluster worker): a TCP socket bound to the worker's own
  cluster address (never to every interface), on a port the system picks. The client's
  first line must be ``HELLO <token>`` with the driver session's token; anything else
  (a wrong token, no line within ``AUTH_TIMEOUT_S``, a line too long) gets the status
  line ``refused`` and is closed, before pdb's text is sent or a command is read.

Both carry the same text protocol (``debugger.py``): lines in, pdb's output out, a
status line last. Nothing received is ever unpickled; the token is compared in
constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import os
import socket
from typing import Any, Protocol

from lightwork.kernel.control import peer_uid
from lightwork.kernel.pauses import STATUS

HELLO = "HELLO"
#: How long a TCP client has to send its token line (the paused call's thread waits on
#: it: a client that connects and says nothing must not hold the session).
AUTH_TIMEOUT_S = 10.0
MAX_HELLO = 512
REFUSE_LINGER_S = 1.0


class Listener(Protocol):
    """What ``SocketTerminal`` listens with: ``address`` names it for the driver's list."""

    address: str

    def accept(self) -> socket.socket | None:
        """The next admitted client, or None when one was refused."""

    def close(self) -> None: ...


class UnixListener:
    """A Unix socket ``path`` (0600) for clients of this uid only."""

    def __init__(self, path: str) -> None:
        self.address = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)
        self._sock.listen(4)

    def accept(self) -> socket.socket | None:
        conn, _ = self._sock.accept()
        if peer_uid(conn) not in (None, os.getuid()):
            conn.close()  # another user: refused before a byte is read or sent
            return None
        return conn

    def close(self) -> None:
        _wake_and_close(self._sock)
        try:
            os.unlink(self.address)
        except OSError:
            pass


class TokenListener:
    """A TCP socket on ``host`` for clients that know ``token``."""

    def __init__(self, host: str, token: str) -> None:
        if not host or host in ("0.0.0.0", "::", ""):
            raise ValueError(f"the debugger listens on one address, not {host!r}")
        self._token = token.encode()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(4)
        port = self._sock.getsockname()[1]
        self.address = f"tcp://[{host}]:{port}" if family == socket.AF_INET6 \
            else f"tcp://{host}:{port}"

    def accept(self) -> socket.socket | None:
        conn, _ = self._sock.accept()
        try:
            conn.settimeout(AUTH_TIMEOUT_S)
            line = _read_hello(conn)
            conn.settimeout(None)
        except OSError:
            line = None
        expected = f"{HELLO} ".encode() + self._token
        if line is None or not hmac.compare_digest(line, expected):
            _refuse(conn)
            return None
        return conn

    def close(self) -> None:
        _wake_and_close(self._sock)


def _refuse(conn: socket.socket) -> None:
    """Say ``refused`` and close. What the client sent after its line is read and
    dropped first (briefly): closing with it unread would reset the connection, and the
    client would not hear why."""
    try:
        conn.settimeout(REFUSE_LINGER_S)
        conn.sendall(f"{STATUS}refused\n".encode())
        conn.shutdown(socket.SHUT_WR)
        for _ in range(64):
            if not conn.recv(4096):
                break
    except OSError:
        pass
    conn.close()


def _read_hello(conn: socket.socket) -> bytes | None:
    """The client's first line (without its newline), or None if it sent none. Read a
    byte at a time: what follows it is pdb's, typed ahead, and stays in the socket."""
    data = bytearray()
    while len(data) <= MAX_HELLO:
        byte = conn.recv(1)
        if not byte:
            return None
        if byte == b"\n":
            return bytes(data).rstrip(b"\r")
        data += byte
    return None


def _wake_and_close(sock: socket.socket) -> None:
    """Close a listening socket, waking a thread blocked in its ``accept``."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def split_tcp(address: str) -> tuple[str, int]:
    """(host, port) of a ``tcp://host:port`` address (an IPv6 host in brackets)."""
    rest = address[len("tcp://"):]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def connect(row: dict[str, Any], timeout: float = 10.0) -> socket.socket:
    """A connection to the paused call of ``row`` (a ``debug_paused`` row), greeted with
    its token if it listens on TCP; raises OSError if it cannot be reached."""
    address = row["socket"]
    if address.startswith("tcp://"):
        sock = socket.create_connection(split_tcp(address), timeout=timeout)
        sock.settimeout(None)
        try:
            sock.sendall(f"{HELLO} {row.get('token', '')}\n".encode())
        except OSError:
            sock.close()
            raise
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock

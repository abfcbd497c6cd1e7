"""Small task results sent by the worker straight to the driver that owns them.

A synchronous ``get(f.remote())`` on distributed waits for the worker to tell the
scheduler the task finished, for the scheduler to tell the client, and then for the
client's gather, which asks the scheduler, which fetches the value from the worker: a
small result crosses the worker's link three times after it is made, and waits on the
worker's and the scheduler's batched streams (see ``backend``, *Where a call's time
goes*). Here the worker also sends the result, when it is small, to the driver that
submitted the task, as Ray's owner receives a small return with the task's reply: a
``get`` that finds it has the value once, one crossing after the task ended.

Nothing else changes. The task still returns its result to distributed, which stores
it on the worker, tells the scheduler, frees the task's resources, feeds the dependent
tasks and counts retries; the driver's future still follows the key, and a ref dropped
before the scheduler's report keeps its future until the task ends (``orphans``). The
pushed copy is only a way for ``get`` not to wait for the report and the fetch.

Who takes part
--------------
:class:`Replies` is the driver's ``replies`` component. It owns a listening socket, on
the interface the client reaches the scheduler from (a worker reaches the driver as the
scheduler does), its accept thread and one reader thread per worker process connected,
the table of the tasks whose replies it awaits (``_expected``: task id -> ``_PENDING``,
the stored value once it came, or ``_ENDED``) and the takes waiting on them
(``_waiters``), all under its own ``_lock``. ``tasks`` files a task in the table as it
submits (``expect``, before the submission: a reply may come before ``submit`` returns)
and takes it out when the task's last ref goes or the program cancels it (``forget``):
a reply for a task not in the table is dropped, so a cancelled task's get says it was
cancelled. ``fetch`` reads the table: ``get`` takes the values that came (``take``) and
fetches only the others through the client; ``wait`` counts a task whose value came as
ready (``came``), and so does the event log's ``ready_value``.

What is sent
------------
Every task the driver submitted with ``num_returns=1``, not a generator, replies when
it ends: with its stored result if that is small (at most ``push_max`` bytes pickled)
and holds no refs (a ``WithRefs`` value is held by its key's plugin,
``cluster_plugin.ExportedRefs``, which the fetch path keeps), else with a notice that it
ended and its result stays on the worker (``_ENDED``), which a ``get`` then fetches
through the client as before. A task's error, or a failed argument's, is a small
result. A task that printed (``output.took_output``) sends the notice only: its lines
travel through the scheduler, ahead of its end there, so its result does too, and the
driver shows the lines before the value. The header's last field says where to reply, the session's key and the size
limit (None: no reply). Nested tasks submitted from a worker get no reply: their client
fetches as before.

Waiting
-------
A ``take`` registers a :class:`_Waiter` for its task ids still pending; each reply
settles it (``_arrive``), and the first failure among them, or the last reply, sets its
event. A reply that will never come (its worker died mid-task, the driver is out of its
reach) must not hang the ``get``: once no reply has settled it for ``QUIET_S``, the take
also watches the futures of the rest (a done callback each, which distributed runs on a
thread pool: the reason they are not watched from the start, since a batch of small
tasks would pay one such hop per task). A long task is then settled by its future or its
reply, whichever comes first. Nothing polls.

On the worker, :func:`send_reply` runs on the task's thread after the result is stored
and its event log stamped. One connection per driver address per worker process, kept
(``_Sender``: a lock, since the pool's threads share it). Connecting waits at most
``CONNECT_TIMEOUT_S``, a send ``SEND_TIMEOUT_S``; a driver that cannot be reached or
stopped reading is marked unreachable for the process's life (each session listens on a
new port), and its tasks' results take the scheduler's path alone: a failed reply costs
time (``QUIET_S`` per ``get``, at most), never a result.

Wire: the worker proves it knows the session's key (32 random bytes, in the task's
header, which travels through the scheduler like the tasks themselves) by answering a
nonce with its HMAC; then each message is a 4-byte length and a pickled ``(task id,
stored value)`` or ``(task id,)`` (cloudpickle when the value's class lives only in the
driver's ``__main__``). Values cross in the clear, as distributed's own TCP comms carry
them; a driver that talks to its scheduler over TLS (or inproc) starts no listener.

What happens to a reply when the worker is lost: a result that came is the object's
value (the owner has it, as in Ray), even if the scheduler then runs the task again for
dependents or fails it with ``KilledWorker``; a result that did not come is fetched, or
retried, as before. A small result that came stays in the driver while a ref to it
lives (as Ray's owner keeps small returns in its own memory store), beside the
worker's copy, which dependents read.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

import cloudpickle

from lightwork.engines.distributed import output as cluster_output

if TYPE_CHECKING:
    from lightwork.engines.distributed.backend import DistributedBackend

#: Results of at most this many bytes pickled are sent to the driver (0: none are). A
#: result this size crosses a LAN in well under a millisecond; larger ones stay on the
#: worker, where dependents read them without a detour through the driver.
PUSH_MAX = 64 * 1024
CONNECT_TIMEOUT_S = 2.0
SEND_TIMEOUT_S = 10.0
_NONCE = 32
_LENGTH = struct.Struct("!I")
_PENDING = object()  # a task in the table whose reply has not come
#: The reply of a task whose result stays on its worker: it ended, fetch it there.
_ENDED = object()
#: How long a ``take`` waits with no reply coming before it watches the futures too.
QUIET_S = 0.05


class _Waiter:
    """One ``take``'s wait: its pending task ids (settled by their replies, or by their
    futures' done callbacks once it watches those), and the event that ends it."""

    __slots__ = ("pending", "final", "lock", "done", "last")

    def __init__(self, pending: dict[int, int], final: Any) -> None:
        self.pending = dict(pending)  # task id -> index, while unsettled
        self.final = final
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.last = time.monotonic()  # when a reply last settled one

    def open(self) -> list[tuple[int, int]]:
        with self.lock:
            return list(self.pending.items())

    def settle(self, task_id: int, value: Any = _PENDING) -> None:
        with self.lock:
            if self.pending.pop(task_id, None) is None:
                return
            self.last = time.monotonic()
            if not self.pending or (self.final is not None and value is not _PENDING
                                    and self.final(value)):
                self.done.set()


def _digest(authkey: bytes, nonce: bytes) -> bytes:
    return hmac.new(authkey, nonce, hashlib.sha256).digest()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("closed")
        chunks += chunk
    return bytes(chunks)


def listen_host(client: Any) -> str | None:
    """The local host the client reaches the scheduler from, if that is plain TCP."""
    try:
        local = str(client.scheduler_comm.comm.local_address)
    except AttributeError:
        return None
    if not local.startswith("tcp://"):
        return None  # inproc, TLS, ucx: no plain listener beside them
    host = local[len("tcp://"):].rsplit(":", 1)[0]
    return host.strip("[]") or None


class Replies:
    """The driver's listener for small results and its table of awaited ones (see the
    module docstring)."""

    def __init__(self, backend: DistributedBackend, host: str, push_max: int) -> None:
        self.backend = backend
        self._expected: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._authkey = os.urandom(32)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.bind((host, 0))
        self._socket.listen(64)
        self.received = 0  # replies taken into the table (the tests read it)
        self._closed = False
        self._readers: list[socket.socket] = []
        self._waiters: dict[int, list[_Waiter]] = {}  # task id -> the takes waiting
        #: What a task's header carries: where to send, the key, the size limit.
        self.reply_to = (host, self._socket.getsockname()[1], self._authkey, push_max)
        threading.Thread(target=self._accept, daemon=True,
                         name="lightwork-replies").start()

    # -- the table ------------------------------------------------------------------------
    def expect(self, task_id: int) -> None:
        with self._lock:
            self._expected[task_id] = _PENDING

    def forget(self, task_id: int) -> None:
        with self._lock:
            self._expected.pop(task_id, None)

    def awaited(self, task_id: int) -> bool:
        return task_id in self._expected

    def came(self, task_id: int) -> bool:
        """Whether ``task_id``'s result was sent here (a ``get`` of it would not wait)."""
        value = self._expected.get(task_id, _PENDING)
        return value is not _PENDING and value is not _ENDED

    def take(self, task_ids: list[int], futures: list[Any], deadline: float | None,
             final: Any = None) -> dict[int, Any]:
        """Wait until each of ``task_ids`` has its reply here or its future (same order)
        is done, or until ``deadline``, or until a value that ``final`` says ends the
        wait (a failure) came; the stored values that came, by position (see *Waiting*
        in the module docstring)."""
        expected = self._expected
        with self._lock:
            values: dict[int, Any] = {}
            pending: dict[int, int] = {}
            for index, task_id in enumerate(task_ids):
                value = expected.get(task_id, _PENDING)
                if value is not _PENDING:
                    if value is _ENDED:
                        continue
                    values[index] = value
                    if final is not None and final(value):
                        return values
                elif task_id in expected and not futures[index].done():
                    pending[task_id] = index
            if not pending:
                return values
            waiter = _Waiter(pending, final)
            for task_id in pending:
                self._waiters.setdefault(task_id, []).append(waiter)
        try:
            watched = False
            while not waiter.done.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                if watched:
                    waiter.done.wait(left)
                    continue
                quiet = waiter.last + QUIET_S - time.monotonic()
                if quiet > 0:
                    waiter.done.wait(quiet if left is None else min(quiet, left))
                    continue
                # No reply for a while: a long task, or a reply that will not come (its
                # worker lost, the driver out of its reach); the futures settle those.
                watched = True
                for task_id, index in waiter.open():
                    futures[index].add_done_callback(
                        lambda _f, task_id=task_id: waiter.settle(task_id))
        finally:
            with self._lock:
                for task_id in pending:
                    waiting = self._waiters.get(task_id)
                    if waiting is not None:
                        waiting.remove(waiter)
                        if not waiting:
                            del self._waiters[task_id]
                for task_id, index in pending.items():
                    value = expected.get(task_id, _PENDING)
                    if value is not _PENDING and value is not _ENDED:
                        values[index] = value
        return values

    def _arrive(self, task_id: int, stored: Any) -> None:
        with self._lock:
            if self._expected.get(task_id, None) is not _PENDING:
                return  # not awaited: its refs are gone, or it was cancelled
            self._expected[task_id] = stored
            self.received += stored is not _ENDED
            for waiter in self._waiters.get(task_id, ()):
                waiter.settle(task_id, stored)

    # -- the listener's threads -----------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _address = self._socket.accept()
            except OSError:  # closed at shutdown
                return
            threading.Thread(target=self._read, args=(sock,), daemon=True,
                             name="lightwork-replies-reader").start()

    def _read(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(CONNECT_TIMEOUT_S + SEND_TIMEOUT_S)  # for the handshake
            nonce = os.urandom(_NONCE)
            sock.sendall(nonce)
            if not hmac.compare_digest(_read_exactly(sock, 32),
                                       _digest(self._authkey, nonce)):
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    return
                self._readers.append(sock)
            while True:
                (size,) = _LENGTH.unpack(_read_exactly(sock, _LENGTH.size))
                message = pickle.loads(_read_exactly(sock, size))
                # (task id, stored value), or (task id,): it ended, its result stays there
                self._arrive(message[0], message[1] if len(message) > 1 else _ENDED)
        except Exception:  # noqa: BLE001, S110 - a worker gone, or not one of ours: the
            pass           # scheduler's path still carries its results
        finally:
            sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            readers, self._readers = self._readers, []
            self._expected.clear()
            waiters = [w for waiting in self._waiters.values() for w in waiting]
        for waiter in waiters:  # (their gets fetch through the client, which says why)
            waiter.done.set()
        try:
            self._socket.close()
        except OSError:
            pass
        for sock in readers:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# ------------------------------------------------------------------ the worker's side
class _Sender:
    __slots__ = ("sock", "lock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()


_senders: dict[tuple[str, int], _Sender | None] = {}  # None: unreachable
_senders_lock = threading.Lock()


def _connect(host: str, port: int, authkey: bytes) -> _Sender | None:
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError:
        return None
    try:
        sock.sendall(_digest(authkey, _read_exactly(sock, _NONCE)))
        sock.settimeout(SEND_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        sock.close()
        return None
    return _Sender(sock)


def _sender(host: str, port: int, authkey: bytes) -> _Sender | None:
    address = (host, port)
    try:
        return _senders[address]
    except KeyError:
        pass
    with _senders_lock:
        if address not in _senders:
            _senders[address] = _connect(host, port, authkey)
        return _senders[address]


def send_reply(reply_to: Any, task_id: int, stored: Any, size: int,
               sendable: bool = True) -> bool:
    """Tell a task's driver it ended: with its stored result if that is small and
    ``sendable`` (``size``: its stored size), else that it stays here (see the module
    docstring); True if the result went. Never raises."""
    if reply_to is None:
        return False
    host, port, authkey, push_max = reply_to
    data = None
    if sendable and cluster_output.took_output(task_id):
        sendable = False  # its lines go through the scheduler: so does its result
    if sendable and size <= push_max:
        try:
            data = pickle.dumps((task_id, stored), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a class of the driver's __main__, say
            try:
                data = cloudpickle.dumps((task_id, stored), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001 - the scheduler's path will say what is wrong
                data = None
        if data is not None and len(data) > push_max:
            data = None
    sent = data is not None
    if data is None:
        data = pickle.dumps((task_id,), protocol=pickle.HIGHEST_PROTOCOL)
    sender = _sender(host, port, authkey)
    if sender is None:
        return False
    try:
        with sender.lock:
            sender.sock.sendall(_LENGTH.pack(len(data)) + data)
        return sent
    except OSError:  # the driver went, or stopped reading: no more replies to it
        with _senders_lock:
            _senders[(host, port)] = None
        try:
            sender.sock.close()
        except OSError:
            pass
        return False

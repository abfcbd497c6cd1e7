"""Frames between the driver and its workers.

Every driver<->worker channel is an inherited Unix socket pair: no listening socket
carries pickles, so no other user of the machine can inject work.

A frame is a 4-byte little-endian length and a pickle: of one message, or of a list of
messages when there are several to send at once (batches of tasks, batches of results).
That is what makes many short tasks cheap: one pickle per batch writes the pickler's
set-up, and what the messages of a batch share (the ``Stored`` class, the function key,
the shape, empty arguments), once. Messages are tuples whose first item is one of the
kinds below, so a decoded list is always a batch; user values inside them are already
serialized (a ``Stored``, or its bytes alone: below), so decoding a frame never runs
user code. Frames are pickles only: a fixed ``struct`` layout for a synchronous call's
messages was no faster once values travel bare.

A task's arguments and a task's result travel bare when they can
(``serialization.bare``): the pickle's bytes alone, not the ``Stored`` around them, which
the pickler writes through ``__reduce__`` (a Python call) and the reader rebuilds by a
class call.

A ``DONE`` is flat, ``(DONE, task_id, outcome, started, args_loaded, finished, stored,
cpu_time)``: the worker's clock readings are items of the message, not a tuple inside
it. A call whose memory was read (``task_memory.py``) has two more, ``rss_peak,
rss_change``; the driver unpacks the short form, and only its failing unpack (a
``ValueError`` raised before anything is stored, free in the common case) tries the
long one. And a task's one scalar result is its outcome as its pickle's bytes alone, where
other results come as a list (``Worker.store_results``). Each is an object less to
build, pickle, read and free per task on both sides.

Driver -> worker: ``TASK``, ``FUNCTION``, ``REPLY``, ``EXIT``, ``ACTOR_INIT``,
``COLLECT`` (run the cycle collector: ``store.py``).
Worker -> driver: ``DONE``, ``SUBMIT``, ``PUT``, ``GET``, ``WAIT``, ``BORROW``,
``RELEASE``, ``BLOCKED``, ``UNBLOCKED``, ``BOUNCE``, ``CANCEL``, ``CALL``, ``MAPPED``,
``UNMAPPED`` (which shared-memory segments the worker maps: see ``store.py``),
``OUTPUT`` (what its calls printed: ``output.py``), ``DEBUG`` (a call paused in the
debugger, or runs on: ``kernel/debugger.py``).

Measured: see bench/HOTPATH.md, "The wire format".
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from typing import Any

from lightwork.engines.local.spin import Spinner

TASK = 1
FUNCTION = 2
REPLY = 3
EXIT = 4
ACTOR_INIT = 5
DONE = 10
SUBMIT = 11
PUT = 12
GET = 13
WAIT = 14
BORROW = 15
RELEASE = 16
BLOCKED = 17
UNBLOCKED = 18
BOUNCE = 19
CANCEL = 20
CALL = 21
MAPPED = 22
UNMAPPED = 23
RETIRE = 24  # worker -> driver: it ran a max_calls function's last call and exits now
OUTPUT = 25  # worker -> driver: lines its calls printed (``output.py``)
DEBUG = 26  # worker -> driver: a call paused in the debugger, or resumed (kernel/debugger.py)
ADVICE = 27  # worker -> driver: what only the worker saw, for the advisor (a fork in a call)
COLLECT = 28  # driver -> worker: the store is under pressure, run the cycle collector

# The driver's reply to a generator's raised exception (a stream's "yield" with an error):
# not an item count but "raise it": the task fails with it and is retried
# (``retry_exceptions``), the re-run skipping the items the stream has (streams.py).
STREAM_RETRY = -1

_LENGTH = struct.Struct("<I")


def cancel_file(session_dir: str, worker_id: int) -> str:
    """Where the driver appends the ids of tasks it cancels on a worker (one per line).

    A cancel is that line, then SIGINT to the worker: a signal carries no task id, and
    the worker's main thread may be deep in user code, so no frame could be read.
    """
    return os.path.join(session_dir, f"cancel-w{worker_id}")
#: The most one read takes from a socket. Reads go into a buffer of this size allocated
#: once per connection (``recv_into``). ``recv(256 KiB)`` allocated a fresh bytes object
#: per read, which glibc maps with mmap, the kernel faults in, and the resize to the
#: bytes received shrinks with mremap: 10-15% of a worker's CPU per no-op task (perf).
RECV_SIZE = 1 << 16


def encode(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=5)
    return _LENGTH.pack(len(payload)) + payload


def encode_many(messages: list[tuple[Any, ...]]) -> bytes:
    """One frame for all of ``messages`` (see the module docstring)."""
    if len(messages) == 1:
        return encode(messages[0])
    payload = pickle.dumps(messages, protocol=5)
    return _LENGTH.pack(len(payload)) + payload


class FrameDecoder:
    """Accumulates bytes and yields whole messages."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | memoryview) -> list[tuple[Any, ...]]:
        buffer = self._buffer
        buffer += data
        messages = []
        position = 0
        end = len(buffer)
        while end - position >= 4:
            (length,) = _LENGTH.unpack_from(buffer, position)
            if end - position - 4 < length:
                break
            start = position + 4
            decoded = pickle.loads(memoryview(buffer)[start : start + length])
            if type(decoded) is list:  # a batch (encode_many)
                messages.extend(decoded)
            else:
                messages.append(decoded)
            position = start + length
        if position:
            del buffer[:position]
        return messages


class BlockingConnection:
    """The worker's end: blocking sends and receives on one socket.

    Only one thread receives at a time (``Worker._take_turn`` sees to it); sends are
    serialized by ``send_lock``.
    """

    def __init__(self, sock: socket.socket) -> None:
        import threading

        self.sock = sock
        self._decoder = FrameDecoder()
        self._scratch = memoryview(bytearray(RECV_SIZE))  # see RECV_SIZE
        self._pending: list[tuple[Any, ...]] = []
        self.send_lock = threading.Lock()
        self.spinner = Spinner()

    def send(self, messages: list[tuple[Any, ...]]) -> None:
        """Send ``messages``; if the driver has closed the channel (it shut down, or
        exited, while this worker still ran), end this process quietly, as ``recv``
        does: there is no one to report to. (A worker still starting an actor when the
        driver shut down printed a BrokenPipeError traceback on the user's terminal.)"""
        data = encode_many(messages)
        with self.send_lock:
            try:
                self.sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                os._exit(0)

    def recv(self) -> tuple[Any, ...] | None:
        """The next message, or None when the driver has closed the channel.

        Polls first while frames have been coming quickly (``spin.py``), then blocks."""
        while not self._pending:
            try:
                size = self.spinner.wait(self._recv_now, self._recv_blocking)
            except (ConnectionResetError, OSError):
                return None
            if not size:
                return None
            self._pending = self._decoder.feed(self._scratch[:size])
            self._pending.reverse()
        return self._pending.pop()

    def _recv_blocking(self) -> int:
        return self.sock.recv_into(self._scratch)

    def _recv_now(self) -> int | None:
        """Bytes read into the scratch buffer without waiting (0: closed), or None."""
        try:
            return self.sock.recv_into(self._scratch, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None

    def has_buffered(self) -> bool:
        return bool(self._pending)


def fill_done(record: Any, done: tuple[Any, ...]) -> None:
    """Copy a ``DONE``'s clock readings (and memory, in its long form) into ``record``.
    The general paths call this; the batched loops over a read's frames unpack inline,
    the same two forms, without the call."""
    try:
        (_, _, _, record.started, record.args_loaded, record.finished,
         record.stored, record.cpu_time) = done
    except ValueError:  # a DONE with its memory read
        (_, _, _, record.started, record.args_loaded, record.finished,
         record.stored, record.cpu_time, record.rss_peak, record.rss_change) = done

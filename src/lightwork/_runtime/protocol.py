"""Frames between the driver and its workers.

Every driver<->worker channel is an inherited Unix socket pair: no listening socket
carries pickles, so no other user of the machine can inject work.

A frame is a 4-byte little-endian length and a pickle: of one message, or of a list of
messages when there are several to send at once (batches of tasks, batches of results).
That is what makes many short tasks cheap: one pickle per batch rather than per message
costs 0.2-0.5 µs per message to write and as much to read, against 1.7-3.6 µs and
1.9-2.3 µs for a frame each (a no-op's TASK and DONE; the pickler's set-up, and the
``Stored`` class and the function key, shape and empty arguments that the messages of
a batch share and that one pickle writes once). Messages are tuples whose first item is
one of the kinds below, so a decoded list is always a batch; user values inside them are
already serialized (``Stored``), so decoding a frame never runs user code.

A lone TASK or DONE of the common shape (a synchronous call's two frames) is not
pickled but packed into a fixed layout (``_encode_fast``): a header of ``struct``
fields, then the function key, the name and the inline value's bytes. A pickle starts
with its protocol byte (0x80), a fixed layout with a tag of its own, so the decoder tells
them apart by the first byte, and what it decodes is equal, type for type, to what the
pickle would have given: the rest of the runtime cannot tell them apart. The common shape:
inline arguments or result with no buffers and no refs inside (up to
``_FAST_DATA_MAX``), no dependencies, one return, a default task's or an actor call's
shape; anything else is pickled. Why: pickling a ``Stored`` means looking its class up
by name and calling its constructor on load, and the pickler's set-up is per call; a
no-op's TASK and DONE took 1.9-2.3 µs each to pickle and 2.3-2.4 µs to decode, against
0.8-0.9 and 1.2-1.6 µs in a fixed layout (a loaded machine; issue 13). In a batch the
pickle's memo writes those once per frame, so batches stay pickles.

Driver -> worker: ``TASK``, ``FUNCTION``, ``REPLY``, ``EXIT``, ``ACTOR_INIT``.
Worker -> driver: ``DONE``, ``SUBMIT``, ``PUT``, ``GET``, ``WAIT``, ``BORROW``,
``RELEASE``, ``BLOCKED``, ``UNBLOCKED``, ``BOUNCE``, ``CANCEL``, ``CALL``, ``MAPPED``,
``UNMAPPED`` (which shared-memory segments the worker maps: see ``store.py``).
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from typing import Any

from lightwork._runtime.serialization import Stored
from lightwork._runtime.spin import Spinner

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
    kind = message[0]
    if kind == TASK or kind == DONE:  # a sync call's frames: a fixed layout, not a pickle
        fast = _encode_fast(message)
        if fast is not None:
            return fast
    payload = pickle.dumps(message, protocol=5)
    return _LENGTH.pack(len(payload)) + payload


def encode_many(messages: list[tuple[Any, ...]]) -> bytes:
    """One frame for all of ``messages`` (see the module docstring)."""
    if len(messages) == 1:
        return encode(messages[0])
    payload = pickle.dumps(messages, protocol=5)
    return _LENGTH.pack(len(payload)) + payload


# --- the fixed layouts of a lone TASK and DONE (see the module docstring) --------------
#: A pickle (protocol 5) starts with PROTO 5; a fixed layout starts with its own tag.
_PICKLE_TAG = 0x80
_TASK_TAG = 0x01
_DONE_TAG = 0x02
#: tag, shape code, whether the key is a str (an actor method; else a function's hash),
#: key length, task id, return id, name length, argument bytes, the arguments' size.
_TASK_HEAD = struct.Struct("<BBBBQQHIQ")
#: tag, task id, started, arguments loaded, finished, stored, CPU time, result size,
#: result bytes.
_DONE_HEAD = struct.Struct("<BQ5dQI")
#: The shapes a fixed TASK carries, by code: an actor call's and a default task's.
_SHAPES: tuple[tuple[tuple[str, float], ...], ...] = ((), (("CPU", 1.0),))
#: Larger values go as pickles: decoding copies a fixed layout's bytes twice.
_FAST_DATA_MAX = 16 * 1024


def _inline_bytes(stored: Any) -> bytes | None:
    """The bytes of ``stored`` if a fixed layout can carry it: inline, no buffers, no
    refs inside, at most ``_FAST_DATA_MAX``; else None."""
    if type(stored) is not Stored or stored.buffers or stored.path is not None or stored.contained:
        return None
    data = stored.data
    return data if type(data) is bytes and len(data) <= _FAST_DATA_MAX else None


def _encode_fast(message: tuple[Any, ...]) -> bytes | None:
    """The fixed layout of ``message``, or None when it does not have the common shape:
    one TASK with inline arguments (no buffers, no refs inside), no dependencies, one
    return and a common shape; one DONE with one such result and its five times."""
    try:
        if message[0] == TASK:
            task_id, key, name, args, deps, return_ids, shape, gpu_ids = message[1]
            data = _inline_bytes(args)
            if data is None or deps != () or gpu_ids != () or len(return_ids) != 1:
                return None
            shape_code = _SHAPES.index(shape)
            key_is_str = type(key) is str
            if not key_is_str and type(key) is not bytes:
                return None
            key_bytes = key.encode("utf-8", "surrogatepass") if key_is_str else key
            name_bytes = name.encode("utf-8", "surrogatepass")
            return b"".join((
                _LENGTH.pack(_TASK_HEAD.size + len(key_bytes) + len(name_bytes) + len(data)),
                _TASK_HEAD.pack(_TASK_TAG, shape_code, key_is_str, len(key_bytes), task_id,
                                return_ids[0], len(name_bytes), len(data), args.size),
                key_bytes, name_bytes, data))
        _, task_id, outcome, times = message
        if type(outcome) is not list or len(outcome) != 1:
            return None  # an error, a cancel, several returns
        result = outcome[0]
        data = _inline_bytes(result)
        if data is None:
            return None
        return b"".join((
            _LENGTH.pack(_DONE_HEAD.size + len(data)),
            _DONE_HEAD.pack(_DONE_TAG, task_id, *times, result.size, len(data)), data))
    except (ValueError, TypeError, AttributeError, struct.error):
        return None  # another shape (times that are not five numbers, a long key or name)


def _decode_fast(buffer: bytearray, start: int) -> tuple[Any, ...]:
    """The message the fixed layout at ``buffer[start:]`` stands for (see ``encode``)."""
    if buffer[start] == _TASK_TAG:
        (_, shape_code, key_is_str, key_length, task_id, return_id, name_length,
         data_length, size) = _TASK_HEAD.unpack_from(buffer, start)
        at = start + _TASK_HEAD.size
        key_end = at + key_length
        name_end = key_end + name_length
        key: bytes | str = (buffer[at:key_end].decode("utf-8", "surrogatepass")
                            if key_is_str else bytes(buffer[at:key_end]))
        name = buffer[key_end:name_end].decode("utf-8", "surrogatepass")
        args = Stored(bytes(buffer[name_end:name_end + data_length]), (), None, size, ())
        return (TASK, (task_id, key, name, args, (), (return_id,), _SHAPES[shape_code], ()))
    (_, task_id, started, loaded, finished, stored, cpu, size,
     data_length) = _DONE_HEAD.unpack_from(buffer, start)
    at = start + _DONE_HEAD.size
    result = Stored(bytes(buffer[at:at + data_length]), (), None, size, ())
    return (DONE, task_id, [result], (started, loaded, finished, stored, cpu))


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
            if buffer[start] != _PICKLE_TAG:
                messages.append(_decode_fast(buffer, start))
            else:
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

"""The pipe floor: what two Python processes need to exchange a small pickled message.

Issue 13 states lightwork's hot-path targets as ratios to this floor, measured on the
same machine in the same run, so a loaded or slow machine moves both sides alike:

* ``floor_roundtrip_us``: the parent pickles a small task-like message, sends it over
  a ``socket.socketpair`` to a child Python process, which unpickles it, pickles a
  small reply and sends it back; the parent unpickles the reply. One at a time: the
  median per round trip over batches of 100 (as ``workloads.median_sync_us`` times
  ``get(f.remote())``). This is what a synchronous task can at best cost.
* ``floor_pipelined_us``: the parent sends N such messages from a writer thread while
  its main thread reads the N replies (one thread cannot do both: a Unix socket's
  buffer holds only a few hundred small messages, so sending all first would
  deadlock against the child's replies); per message, best of a few runs
  (as ``workloads.best_async_us`` times 10,000 tasks). Each message is still pickled,
  sent, received and unpickled on its own (one ``sendall`` each; reads are buffered),
  so this is the cost a runtime cannot avoid per task without batching messages.

No runtime is imported: the child is ``python floor.py --echo FD``, plain sockets and
``pickle``. ``run.py`` measures the floor just before and just after lightwork's own
child and keeps the lower of each figure (load can only add time), then divides
lightwork's hot-path figures by it (``FLOOR_RATIOS``). Run alone:
``python bench/floor.py`` prints both figures.
"""

from __future__ import annotations

import pickle
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

#: Frame header: payload length, network order.
HEADER = struct.Struct("!I")
#: A message shaped like a task submission: an id, a function key, empty arguments.
MESSAGE: tuple[Any, ...] = ("task", 123456, b"0123456789abcdef", (), {}, None)
REPLY: tuple[Any, ...] = ("done", 123456, None)
BATCH = 100

#: lightwork figure -> (floor figure it is divided by, target ratio) (issue 13).
FLOOR_RATIOS: dict[str, tuple[str, float]] = {
    "sync_roundtrip_us": ("floor_roundtrip_us", 2.0),
    "async_per_task_us": ("floor_pipelined_us", 2.0),
    "actor_sync_call_us": ("floor_roundtrip_us", 2.0),
    "actor_async_per_call_us": ("floor_pipelined_us", 2.0),
}


def send(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(HEADER.pack(len(data)) + data)


def receive(stream: BinaryIO) -> Any:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("the other side closed the socket")
    (size,) = HEADER.unpack(header)
    return pickle.loads(stream.read(size))


def echo(fd: int) -> None:
    """Child: answer every message with ``REPLY`` until the socket closes."""
    sock = socket.socket(fileno=fd)
    stream = sock.makefile("rb")
    try:
        while True:
            receive(stream)
            send(sock, REPLY)
    except (EOFError, ConnectionError):
        pass


def measure(sync_calls: int = 2_000, pipelined: int = 10_000, runs: int = 3) -> dict[str, float]:
    """Start an echo child, time both figures, stop it."""
    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--echo", str(child.fileno())],
        pass_fds=[child.fileno()],
    )
    child.close()
    stream = parent.makefile("rb")
    try:
        for _ in range(BATCH):  # warm up both interpreters
            send(parent, MESSAGE)
            receive(stream)
        per_call_us = []
        for _ in range(max(3, sync_calls // BATCH)):
            start = time.perf_counter()
            for _ in range(BATCH):
                send(parent, MESSAGE)
                receive(stream)
            per_call_us.append((time.perf_counter() - start) / BATCH * 1e6)

        def writer() -> None:
            for _ in range(pipelined):
                send(parent, MESSAGE)

        best = float("inf")
        for _ in range(runs):
            start = time.perf_counter()
            thread = threading.Thread(target=writer)
            thread.start()
            for _ in range(pipelined):
                receive(stream)
            thread.join()
            best = min(best, time.perf_counter() - start)
    finally:
        stream.close()
        parent.close()
        proc.wait(timeout=30)
    return {
        "floor_roundtrip_us": statistics.median(per_call_us),
        "floor_pipelined_us": best / pipelined * 1e6,
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--echo":
        echo(int(sys.argv[2]))
    else:
        for name, value in measure().items():
            print(f"{name}: {value:.1f}")

"""Spin, then block: how a waiter catches a frame that is about to arrive.

A synchronous call (``get(f.remote())``, an actor's method called the same way) makes two
processes wait for each other in turn: the worker waits for the task, the driver for the
result. If each waiter blocks in the kernel, every hand-over costs a sleep and a
wake-up, and the Python code runs with cold caches after each sleep; on a small machine
that is the bulk of a synchronous call.

So a waiter whose last waits were short first *polls* for the frame (a non-blocking
read, or ``epoll_wait`` with a zero timeout, then ``sched_yield`` so that anything else
runnable on the core goes first) for at most ``SPIN_S``, and only then blocks. A
synchronous loop then stays on the CPU on both sides; batches, whose waiters find frames
already there, are unaffected. This is the adaptive spin of OpenMP's ``KMP_BLOCKTIME``
and of adaptive mutexes, kept short and taken only where it is likely to pay:

* ``Spinner.spin_next``: a waiter spins only if its previous wait ended within
  ``SPIN_S`` (the frame came while it spun, or soon after it blocked). A worker whose
  tasks come seldom, or a driver waiting for long tasks, blocks at once.
* A spin that runs out of budget, or whose polls were slow (the core was shared:
  ``sched_yield`` handed it to another thread), is a miss: after n misses in a row the
  next 2**n waits block at once (``MAX_BACKOFF``).
* Not while the machine is oversubscribed: a spinner then only takes a core from the
  thread it waits for. Each process looks at ``/proc/loadavg``'s count of runnable
  threads at most every ``SPARE_CHECK_S`` and spins only while it is at most the cores
  plus one (the reader).
* The budget, 200 µs, is a few times a no-op call's round trip and far below anything
  a person or a long task would notice. ``LIGHTWORK_SPIN_US`` (microseconds, read at
  import) changes it; 0 turns spinning off. On a machine with a single CPU it is off:
  the frame cannot be produced while this waiter holds the core.

The worker's reads (``protocol.BlockingConnection.recv``) and the getter that leads a
blocked ``get``/``wait`` in the driver (``IOLoop.poll``) spin; the driver's I/O thread
does not (it is the fallback for everything else, and idles most of the time), and
while a getter leads it does not watch the workers at all unless ``cores_to_spare``
says the machine is full (``io_loop.py``).

Measured: see bench/HOTPATH.md, "Spinning waiters".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _budget_from_environment() -> float:
    text = os.environ.get("LIGHTWORK_SPIN_US", "200")
    try:
        micros = float(text)
    except ValueError:
        raise ValueError(
            f"LIGHTWORK_SPIN_US={text!r} is not a number: give the most microseconds a "
            "waiter polls before it blocks (0 turns polling off)") from None
    if not micros >= 0:
        raise ValueError(f"LIGHTWORK_SPIN_US={text!r} must be 0 or more microseconds")
    return micros / 1e6 if _cores > 1 else 0.0


#: The most a waiter polls before it blocks (seconds; see the module docstring).
SPIN_S = _budget_from_environment()
#: After n spins in a row missed, the next 2**n waits (n at most this) block at once.
MAX_BACKOFF = 6
#: A poll and a ``sched_yield`` take a few µs on a core of one's own; a spin whose polls
#: took longer than this each on average shared its core (``Spinner._missed``).
CONTENDED_POLL_S = 25e-6
#: How often a process looks at the machine's count of runnable threads, and where.
SPARE_CHECK_S = 0.02
LOADAVG_PATH = "/proc/loadavg"

_loadavg: tuple[int, int] | None = None  # (pid, fd of /proc/loadavg)
_spare_checked_at = float("-inf")
_spare = True


def cores_to_spare(now: float) -> bool:
    """Whether, when last looked at, the machine had no more threads ready to run than
    it has cores, besides the caller (``/proc/loadavg``'s count of runnable threads,
    read at most every ``SPARE_CHECK_S``). Where they cannot all run at once, a spinner
    only takes a core from the thread it waits for, or from other work."""
    global _loadavg, _spare_checked_at, _spare
    if now - _spare_checked_at < SPARE_CHECK_S:
        return _spare
    _spare_checked_at = now
    try:
        if _loadavg is None or _loadavg[0] != os.getpid():
            _loadavg = (os.getpid(), os.open(LOADAVG_PATH, os.O_RDONLY))
        runnable = int(os.pread(_loadavg[1], 128, 0).split()[3].split(b"/")[0])
        _spare = runnable - 1 <= _cores  # not counting the thread that reads
    except (OSError, ValueError, IndexError):  # no /proc: judge by the spins alone
        _spare = True
    return _spare


class Spinner:
    """One waiter's spin-or-block choice, learned from how long its last wait took."""

    __slots__ = ("budget", "spin_next", "_misses", "_skip")

    def __init__(self, budget: float = SPIN_S) -> None:
        self.budget = budget
        self.spin_next = False
        self._misses = 0  # spins in a row that missed (see _missed)
        self._skip = 0  # waits left that block at once after a miss

    def wait(self, poll: Callable[[], T | None], block: Callable[[], T],
             limit: float | None = None) -> T:
        """What ``poll`` finds while spinning (if the last waits were short), else what
        ``block`` waits for; ``limit``: the most seconds the caller may wait, if any."""
        found = self.spin(poll, limit) if self.spin_next else None
        if found is None:
            blocked_at = time.monotonic()
            found = block()
            self.blocked(time.monotonic() - blocked_at)
        return found

    def spin(self, poll: Callable[[], T | None], limit: float | None = None) -> T | None:
        """Call ``poll`` (which must not block; None: nothing yet) until it returns
        something else, for at most the budget (or ``limit`` seconds, if less); its
        result, or None if the budget ran out (``wait`` then blocks)."""
        clock = time.monotonic
        if not cores_to_spare(clock()):
            return None
        start = clock()  # after the check: a read of /proc is not a slow poll
        budget = self.budget if limit is None else min(self.budget, limit)
        deadline = start + budget
        polls = 0
        while True:
            found = poll()
            polls += 1
            if found is not None:
                if clock() - start > polls * CONTENDED_POLL_S:
                    self._missed()
                else:
                    self._misses = 0
                return found
            if clock() >= deadline:
                self._missed()
                return None
            os.sched_yield()

    def _missed(self) -> None:
        """The spin was wasted (it ran out of budget) or took a core another thread
        wanted (``sched_yield`` gave it away): the next waits block at once, twice as
        many after each miss in a row."""
        self._misses = min(self._misses + 1, MAX_BACKOFF)
        self._skip = 1 << self._misses
        self.spin_next = False

    def blocked(self, seconds: float) -> None:
        """A blocking wait of ``seconds`` just ended: spin next time if it was short."""
        if self._skip:
            self._skip -= 1
            self.spin_next = False
        else:
            self.spin_next = seconds < self.budget

"""The driver's I/O loop: the poll, reading and sending frames, timers and wake-ups.

Owns the I/O thread "lightwork-node" and everything that decides who reads the workers'
sockets: the selectors and the gate, the wake-up pipes, the leader lock and its spinner,
the muting state (who muted the gate: a leader or a submitting thread), the timers, the
callbacks deferred until the node's lock is let go, and the output waiting for room.
What a frame *means* is the node's (``WorkerRequests._handle_read``); which workers exist
is the pool's (``worker_pool.py``), which calls :meth:`IOLoop.watch_worker` for each new
one. Methods say whether they take the node's lock (one lock: ``self.lock`` is the
node's), or expect it held.

Threads. Two threads run :meth:`IOLoop.poll`:

* the I/O thread (:meth:`IOLoop._loop`), on its epoll of the fork server's control
  socket, a wake-up pipe, the *gate* to the workers' sockets, and any socket with
  output waiting (for writing only);
* the thread leading a blocked ``get`` (:meth:`IOLoop.lead`), on an epoll of the
  workers' sockets and its own wake-up pipe.

Whoever reads a worker applies what it read; then both drain dropped refs, run due
timers, dispatch, and call what was deferred outside the lock. Sends are made by
whichever thread has something to send; a frame that does not fit in the socket buffer
waits in the connection's ``out`` buffer, and the I/O thread's epoll finishes it. Worker
sockets are read into one buffer of ``protocol.RECV_SIZE`` allocated once
(``_recv_scratch``, used under the lock: ``recv`` of a fresh 256 KiB bytes per read cost
an mmap, page faults and an mremap each), and a read stops at a short read (the next
frame wakes the poller anyway).

The gate. The I/O thread watches the workers through an epoll of their own
(``_worker_selector``), one fd in its own epoll, so muting that watch is one
``epoll_ctl`` (changing registrations in ``selectors`` costs several times that in
Python bookkeeping). It is open, or muted by one of two owners:

* a leading getter, from when it starts leading until it stops (:meth:`IOLoop.lead`).
  A spinning leader (``spin.py``) is on the CPU when its frame comes, so a second
  wake-up for the same frame only takes the GIL and the lock from it. Where the machine
  has no core to spare (``spin.cores_to_spare``) the leader does not mute: two threads
  racing for a frame then reach it sooner than one;
* a submitting thread, which reads the workers and dispatches itself every
  ``SUBMITTER_PASS_EVERY`` queued submissions (:meth:`IOLoop.submitter_pass`), so
  that one thread, not two taking turns with the GIL, touches a batch's objects. The
  I/O thread unmutes once no pass came for ``SUBMITTER_LEFT_AFTER_S`` (muted, it sleeps
  at most ``IO_BUSY_SLEEP_S`` at a time to notice), and a getter that starts leading
  takes the muted gate over.

The muting state (``_submitter_muted``, ``_submitter_passed_at``) changes only under
the ``_leader`` lock, which one thread at a time holds: the leader, a submitter's pass,
or the I/O thread unmuting. Without epoll (not Linux) there is no gate and nobody mutes.

Wake-ups. A dropped ref (``_object_ref.RefCounter``'s ``on_first_release``) writes the
wake pipe only while the I/O thread sleeps idle; while the runtime is busy (frames or
wake-ups in the last ``IO_BUSY_FOR_S``) the thread sleeps at most ``IO_BUSY_SLEEP_S``
and drains releases then, if a call has not already.

Measured: see bench/HOTPATH.md, "The I/O thread".
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import selectors
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightwork.kernel.object_ref import ref_counter
from lightwork.engines.local import protocol as p
from lightwork.engines.local.spin import Spinner, cores_to_spare

if TYPE_CHECKING:
    from lightwork.engines.local.driver_calls import Countdown
    from lightwork.engines.local.node import Node
    from lightwork.engines.local.worker_pool import WorkerConn

# The I/O thread's sleep while the runtime is busy (it had frames or wake-ups within
# IO_BUSY_FOR_S): a ref the program drops meanwhile is drained within this, without a
# wake-up of its own. Idle, it sleeps IO_IDLE_SLEEP_S and a dropped ref wakes it.
IO_BUSY_SLEEP_S = 0.005
IO_BUSY_FOR_S = 0.05
IO_IDLE_SLEEP_S = 0.5
# A submitting thread that made no pass (DriverCalls._submitter_pass) for this long has
# stopped submitting: this thread watches the workers again.
SUBMITTER_LEFT_AFTER_S = 0.002



class IOLoop:
    """The node's polling, reading, sending, timers and wake-ups (see the module doc)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.lock = node.lock  # the node's one lock (node_lock.py)
        self._handle_read = node._handle_read  # what a read's frames mean: the node's
        self.selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self.selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self.selector.register(node.pool.forkserver.control, selectors.EVENT_READ, "forkserver")
        # The worker sockets, for this thread: an epoll of their own inside its epoll, so
        # a leading getter can mute them all with one call (see lead). A worker's socket
        # is in this thread's epoll itself only while output to it waits.
        self._worker_selector = selectors.DefaultSelector()
        # Muting goes through a gate, a bare epoll holding only _worker_selector.
        self._workers_gate: Any = None  # select.epoll, or None where there is no epoll
        self._workers_fd = self._worker_selector.fileno()
        if hasattr(select, "epoll"):
            self._workers_gate = select.epoll()
            self._workers_gate.register(self._workers_fd, select.EPOLLIN)
            self.selector.register(self._workers_gate, selectors.EVENT_READ, "workers")
        else:
            self.selector.register(self._worker_selector, selectors.EVENT_READ, "workers")
        # A second epoll over the worker sockets for the thread leading a blocked get:
        # epoll wakes one waiter per event, so the leader cannot share the I/O thread's
        # (whose worker sockets are in _worker_selector, which the leader mutes).
        self._leader_selector = selectors.DefaultSelector()
        self._leader_wake_read, self._leader_wake_write = os.pipe()
        os.set_blocking(self._leader_wake_read, False)
        os.set_blocking(self._leader_wake_write, False)
        self._leader_selector.register(self._leader_wake_read, selectors.EVENT_READ, "wake")
        self._leader = threading.Lock()
        self._leader_spinner = Spinner()  # whoever leads; see spin.py
        self._sleeps_long = False  # the I/O thread is (about to be) in an idle sleep
        self._busy_until = 0.0
        # A submitting thread muted the I/O thread's watch of the workers, and when it
        # last read them (submitter_pass; both under _leader).
        self._submitter_muted = False
        self._submitter_passed_at = 0.0
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._deferred: list[Callable[[], None]] = []
        self._want_write: set[WorkerConn] = set()
        self._recv_scratch = memoryview(bytearray(p.RECV_SIZE))
        self.thread = threading.Thread(target=self._loop, name="lightwork-node", daemon=True)

    def start(self) -> None:
        """Start the I/O thread, and have a dropped ref wake it (``_on_first_release``)."""
        ref_counter.on_first_release = self._on_first_release
        self.thread.start()

    # ------------------------------------------------------------------ wake-ups
    def wake(self) -> None:
        """Make the I/O thread's poll return (any thread, lock or not)."""
        try:
            os.write(self._wake_write, b"x")
        except BlockingIOError:
            pass

    def _on_first_release(self) -> None:
        # Runs inside ObjectRef.__del__ (any thread, any moment): no lock, no state but a
        # flag. A busy I/O thread drains the release within IO_BUSY_SLEEP_S by itself;
        # only an idle one needs the wake-up (see _loop for why none is lost).
        if self._sleeps_long:
            self.wake()

    def wake_leader(self) -> None:
        """Make the leading getter's poll return (any thread)."""
        try:
            os.write(self._leader_wake_write, b"x")
        except BlockingIOError:
            pass

    # ------------------------------------------------------------------ deferred calls
    def defer(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the thread applying this poll lets go of the lock
        (lock held)."""
        self._deferred.append(callback)

    def take_deferred(self) -> list[Callable[[], None]]:
        """The deferred callbacks, for the caller to run after letting go of the lock
        (lock held)."""
        deferred, self._deferred = self._deferred, []
        return deferred

    # ------------------------------------------------------------------ sending
    def send(self, conn: WorkerConn, messages: list[tuple[Any, ...]]) -> None:
        """Send ``messages`` to ``conn``'s worker in one frame (lock held)."""
        if conn.dead:
            return
        out = conn.out
        out += p.encode_many(messages)
        self._flush(conn)

    def _flush(self, conn: WorkerConn) -> None:
        out = conn.out
        try:
            while out:
                sent = conn.sock.send(out)
                del out[:sent]
        except BlockingIOError:
            if threading.current_thread() is self.thread:
                self._watch_writable(conn)
            else:
                self._want_write.add(conn)
                self.wake()
        except OSError:
            out.clear()  # the worker is gone; its EOF is handled by the I/O loop

    # ------------------------------------------------------------------ the I/O loop
    def _loop(self) -> None:
        node = self.node
        try:
            while not node.closed:
                if self._submitter_muted:  # a submitting thread reads the workers
                    self._unmute_if_submitter_left()
                if self._submitter_muted or time.monotonic() < self._busy_until:
                    longest = IO_BUSY_SLEEP_S
                else:
                    # Flag first, then look: a release queued before the flag was set is
                    # seen here; one queued after sees the flag and wakes us (the GIL
                    # orders the two; rearm makes sure it calls us).
                    self._sleeps_long = True
                    longest = 0.0 if ref_counter.rearm() else IO_IDLE_SLEEP_S
                alive = self.poll(longest)
                self._sleeps_long = False
                if not alive:
                    return
        except BaseException as exc:  # noqa: BLE001 - a runtime bug: fail loudly, never hang
            import traceback

            node.fail_runtime(
                "its I/O thread failed:\n" + "".join(traceback.format_exception(exc)).rstrip())

    def _unmute_if_submitter_left(self) -> None:
        """Watch the workers again once the thread that muted it to submit
        (:meth:`submitter_pass`) made no pass for ``SUBMITTER_LEFT_AFTER_S``: it
        stopped submitting, and nobody else would read their results. While muted,
        this thread sleeps at most ``IO_BUSY_SLEEP_S`` at a time, so it looks often."""
        if time.monotonic() - self._submitter_passed_at < SUBMITTER_LEFT_AFTER_S:
            return
        if self._leader.acquire(blocking=False):
            try:
                if self._submitter_muted:
                    self._submitter_muted = False
                    self.watch_workers(True)
            finally:
                self._leader.release()

    def poll(self, longest: float | None, leading: bool = False) -> bool:
        """Wait for I/O up to ``longest`` seconds and apply it; False once closed.

        The I/O thread calls this in its loop. The thread leading a blocked ``get``
        calls it too (``leading``, on its own epoll), so a result wakes its waiter
        directly instead of through the I/O thread. While a leader leads, the I/O thread
        does not watch the workers (``_worker_selector`` muted), unless the machine has no
        core to spare: then both may be woken by the same frame, and the lock makes one
        of them read it while the other finds nothing.
        """
        node = self.node
        selector = self._leader_selector if leading else self.selector
        timeout = longest
        if self._timers:
            until_timer = max(0.0, self._timers[0][0] - time.monotonic())
            timeout = until_timer if timeout is None else min(timeout, until_timer)
        try:
            if leading:  # spin first while results have been coming quickly (spin.py)
                events = self._leader_spinner.wait(
                    self._leader_events_now, lambda: selector.select(timeout), timeout)
            else:
                events = selector.select(timeout)
        except (OSError, ValueError):
            return not node.closed
        if events and not leading:
            self._busy_until = time.monotonic() + IO_BUSY_FOR_S
        with self.lock:
            if node.closed:
                return False
            for key, mask in events:
                data = key.data
                if data == "wake":
                    try:
                        os.read(key.fd, 4096)
                    except BlockingIOError:
                        pass
                elif data == "forkserver":
                    if not node._read_forkserver():  # gone: nothing more to read there
                        self.selector.unregister(key.fileobj)
                elif data == "workers":
                    for worker_key, _ in self._worker_selector.select(0):
                        self.read_worker(worker_key.data)
                elif leading:
                    self.read_worker(data)
                else:  # only this thread's epoll asks for room to write
                    self._flush(data)
                    if not data.out and not data.dead:
                        self.selector.unregister(data.sock)
            if not leading:
                for conn in self._want_write:
                    if not conn.dead and conn.out:
                        self._watch_writable(conn)
                self._want_write.clear()
            node._drain_refs()
            self._run_timers()
            node._dispatch()
            deferred, self._deferred = self._deferred, []
        for callback in deferred:
            callback()
        return True

    # ------------------------------------------------------------------ leading, passes
    def lead(self, countdown: Countdown, timeout: float | None) -> bool:
        """Wait until ``countdown`` completes (False on timeout), polling the workers
        from this thread if no other leads; else on the countdown's event, which the
        leader or the I/O thread sets (takes the lock)."""
        if threading.current_thread() is self.thread or not self._leader.acquire(blocking=False):
            with self.lock:
                if countdown.remaining <= 0:
                    return True
                event = countdown.event = threading.Event()
            return event.wait(timeout)  # the I/O thread or the leading getter completes it
        # While this thread leads, the I/O thread's epoll does not watch the workers,
        # unless the machine's cores are all taken: then two threads waiting for a
        # result see it sooner than one (this one may not be running).
        muted = self._submitter_muted or (cores_to_spare(time.monotonic())
                                          and self.watch_workers(False))
        self._submitter_muted = False  # (taken over: this thread unmutes when it stops)
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            countdown.wake = self.wake_leader
            while countdown.remaining > 0:
                remaining = None
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                if not self.poll(remaining, leading=True):
                    return countdown.remaining <= 0
            return True
        finally:
            if muted:
                self.watch_workers(True)
            self._leader.release()

    def submitter_pass(self) -> None:
        """A thread submits faster than the workers finish (``SUBMITTER_PASS_EVERY``
        submissions queued): it reads what the workers sent and dispatches, as the I/O
        thread would, and mutes the I/O thread's watch of the workers meanwhile (the
        gate, as a leading getter does), so the two do not take turns with the GIL.
        The I/O thread unmutes once no pass came for ``SUBMITTER_LEFT_AFTER_S``
        (:meth:`_loop`); a getter that leads takes the muted gate over. Nothing is done
        while another thread leads (the ``_leader`` lock), nor by the I/O thread itself
        (a callback of its that submits). Takes the lock."""
        if threading.current_thread() is self.thread or not self._leader.acquire(blocking=False):
            return
        node = self.node
        try:
            if not self._submitter_muted:
                self._submitter_muted = self.watch_workers(False)
            self._submitter_passed_at = time.monotonic()
            with self.lock:  # (__enter__ registers what was queued)
                for key, _ in self._leader_selector.select(0):
                    if key.data != "wake":  # (a leading getter's wake-up pipe)
                        self.read_worker(key.data)
                node._drain_refs()
                node._dispatch()
                deferred, self._deferred = self._deferred, []
        finally:
            self._leader.release()
        for callback in deferred:
            callback()

    # ------------------------------------------------------------------ watching sockets
    def watch_worker(self, conn: WorkerConn) -> None:
        """Read a new worker's socket from now on (``WorkerPool.start`` calls this)."""
        self._worker_selector.register(conn.sock, selectors.EVENT_READ, conn)
        self._leader_selector.register(conn.sock, selectors.EVENT_READ, conn)

    def unwatch_worker(self, conn: WorkerConn) -> None:
        """Stop watching a worker's socket, which its caller closes next (its EOF came)."""
        for selector in (self._worker_selector, self.selector, self._leader_selector):
            try:
                selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass

    def _watch_writable(self, conn: WorkerConn) -> None:
        """Have this thread's epoll say when ``conn`` has room for its waiting output."""
        if conn.eof_at or conn.sock in self.selector.get_map():  # closed, or watched
            return
        self.selector.register(conn.sock, selectors.EVENT_WRITE, conn)

    def watch_workers(self, watch: bool) -> bool:
        """Have this thread's epoll watch the workers' sockets, or not (a leading getter
        reads them: :meth:`lead`); False if not done (no gate, or it is closed: shut
        down meanwhile, which :meth:`poll` says)."""
        gate = self._workers_gate
        if gate is None:
            return False
        try:
            gate.modify(self._workers_fd, select.EPOLLIN if watch else 0)
        except (ValueError, OSError):
            return False
        return True

    def _leader_events_now(self) -> list[tuple[Any, int]] | None:
        return self._leader_selector.select(0) or None

    def read_worker(self, conn: WorkerConn) -> None:
        """Read what the worker sent and apply it (lock held)."""
        scratch = self._recv_scratch
        messages: list[tuple[Any, ...]] = []
        eof = False
        while True:
            try:
                size = conn.sock.recv_into(scratch)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not size:
                eof = True
                break
            messages += conn.decoder.feed(scratch[:size])
            if size < len(scratch):
                # All there was; a frame sent meanwhile wakes the poller again. This
                # spares a recv that would fail (a syscall and an exception per wake-up).
                break
        self._handle_read(conn, messages)
        if eof:
            self.node._on_worker_eof(conn)
        elif conn.actor is not None and conn.actor.queue:  # calls held while it was busy
            self.node.actors.pump(conn.actor)

    # ------------------------------------------------------------------ timers
    def add_timer(self, delay: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` in a poll, lock held, ``delay`` seconds from now (lock held)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), callback))
        if threading.current_thread() is not self.thread:
            self.wake()

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback = heapq.heappop(self._timers)
            callback()

    # ------------------------------------------------------------------ shutdown
    def join(self) -> None:
        """Wait for the I/O thread to end (the node is closed and woke it)."""
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=2.0)

    def close(self) -> None:
        """Close the selectors and pipes (after :meth:`join`)."""
        if ref_counter.on_first_release == self._on_first_release:
            ref_counter.on_first_release = None
        self.selector.close()
        if self._workers_gate is not None:
            self._workers_gate.close()
        self._worker_selector.close()
        self._leader_selector.close()
        for fd in (self._wake_read, self._wake_write, self._leader_wake_read,
                   self._leader_wake_write):
            os.close(fd)

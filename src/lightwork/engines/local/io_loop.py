"""The driver's I/O loop: the poll, reading and sending frames, timers and wake-ups.

A mixin of :class:`~lightwork.engines.local.node.Node` (methods on the node's state, called
with its lock held unless they say otherwise).

Threads. Two threads run :meth:`IOLoop._poll`:

* the I/O thread "lightwork-node" (:meth:`IOLoop._loop`), on its epoll of the fork
  server's control socket, a wake-up pipe, the *gate* to the workers' sockets, and any
  socket with output waiting (for writing only);
* the thread leading a blocked ``get`` (``DriverCalls._block_on``), on an epoll of the
  workers' sockets and its own wake-up pipe.

Whoever reads a worker applies what it read (``WorkerRequests._handle_read``); then
both drain dropped refs, run due timers, dispatch, and call what was deferred outside
the lock. Sends are made by whichever thread has something to send; a frame that does
not fit in the socket buffer waits in the connection's ``out`` buffer, and the I/O
thread's epoll finishes it. Worker sockets are read into one buffer of
``protocol.RECV_SIZE`` allocated once (``_recv_scratch``), and a read stops at a short
read (the next frame wakes the poller anyway).

The gate. The I/O thread watches the workers through an epoll of their own
(``_worker_selector``), one fd in its own epoll, so muting that watch is one
``epoll_ctl``. It is open, or muted by one of two owners:

* a leading getter, from when it starts leading until it stops
  (``DriverCalls._block_on``). A spinning leader (``spin.py``) is on the CPU when its
  frame comes, so a second wake-up for the same frame only takes the GIL and the lock
  from it. Where the machine has no core to spare (``spin.cores_to_spare``) the leader
  does not mute: two threads racing for a frame then reach it sooner than one;
* a submitting thread, which reads the workers and dispatches itself every
  ``SUBMITTER_PASS_EVERY`` queued submissions (``DriverCalls._submitter_pass``), so
  that one thread, not two taking turns with the GIL, touches a batch's objects. The
  I/O thread unmutes once no pass came for ``SUBMITTER_LEFT_AFTER_S`` (muted, it sleeps
  at most ``IO_BUSY_SLEEP_S`` at a time to notice), and a getter that starts leading
  takes the muted gate over.

Wake-ups. A dropped ref (``_object_ref.RefCounter``'s ``on_first_release``) writes the
wake pipe only while the I/O thread sleeps idle; while the runtime is busy (frames or
wake-ups in the last ``IO_BUSY_FOR_S``) the thread sleeps at most ``IO_BUSY_SLEEP_S``
and drains releases then, if a call has not already.

Measured: see bench/HOTPATH.md, "The I/O thread".
"""

from __future__ import annotations

import heapq
import os
import select
import selectors
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightwork.kernel.object_ref import ref_counter
from lightwork.engines.local import forkserver, preload
from lightwork.engines.local import protocol as p

if TYPE_CHECKING:
    from lightwork.engines.local.node import NodeState, WorkerConn

    _Base = NodeState
else:
    _Base = object

# The I/O thread's sleep while the runtime is busy (it had frames or wake-ups within
# IO_BUSY_FOR_S): a ref the program drops meanwhile is drained within this, without a
# wake-up of its own. Idle, it sleeps IO_IDLE_SLEEP_S and a dropped ref wakes it.
IO_BUSY_SLEEP_S = 0.005
IO_BUSY_FOR_S = 0.05
IO_IDLE_SLEEP_S = 0.5
# A submitting thread that made no pass (DriverCalls._submitter_pass) for this long has
# stopped submitting: this thread watches the workers again.
SUBMITTER_LEFT_AFTER_S = 0.002


class IOLoop(_Base):
    """The node's polling, reading, sending, timers and wake-ups."""

    # ------------------------------------------------------------------ wake-ups
    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"x")
        except BlockingIOError:
            pass

    def _on_first_release(self) -> None:
        # Runs inside ObjectRef.__del__ (any thread, any moment): no lock, no state but a
        # flag. A busy I/O thread drains the release within IO_BUSY_SLEEP_S by itself;
        # only an idle one needs the wake-up (see _loop for why none is lost).
        if self._io_sleeps_long:
            self._wake()

    def _wake_leader(self) -> None:
        try:
            os.write(self._leader_wake_write, b"x")
        except BlockingIOError:
            pass

    # ------------------------------------------------------------------ sending
    def _send(self, conn: WorkerConn, messages: list[tuple[Any, ...]]) -> None:
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
            if threading.current_thread() is self._thread:
                self._watch_writable(conn)
            else:
                self._want_write.add(conn)
                self._wake()
        except OSError:
            out.clear()  # the worker is gone; its EOF is handled by the I/O loop

    # ------------------------------------------------------------------ the I/O loop
    def _loop(self) -> None:
        try:
            while not self.closed:
                if self._submitter_muted:  # a submitting thread reads the workers
                    self._unmute_if_submitter_left()
                if self._submitter_muted or time.monotonic() < self._io_busy_until:
                    longest = IO_BUSY_SLEEP_S
                else:
                    # Flag first, then look: a release queued before the flag was set is
                    # seen here; one queued after sees the flag and wakes us (the GIL
                    # orders the two; rearm makes sure it calls us).
                    self._io_sleeps_long = True
                    longest = 0.0 if ref_counter.rearm() else IO_IDLE_SLEEP_S
                alive = self._poll(longest)
                self._io_sleeps_long = False
                if not alive:
                    return
        except BaseException as exc:  # noqa: BLE001 - a runtime bug: fail loudly, never hang
            import traceback

            self.fail_runtime(
                "its I/O thread failed:\n" + "".join(traceback.format_exception(exc)).rstrip())

    def _unmute_if_submitter_left(self) -> None:
        """Watch the workers again once the thread that muted it to submit
        (``DriverCalls._submitter_pass``) made no pass for ``SUBMITTER_LEFT_AFTER_S``:
        it stopped submitting, and nobody else would read their results. While muted,
        this thread sleeps at most ``IO_BUSY_SLEEP_S`` at a time, so it looks often."""
        if time.monotonic() - self._submitter_passed_at < SUBMITTER_LEFT_AFTER_S:
            return
        if self._leader.acquire(blocking=False):
            try:
                if self._submitter_muted:
                    self._submitter_muted = False
                    self._watch_workers(True)
            finally:
                self._leader.release()

    def _poll(self, longest: float | None, leading: bool = False) -> bool:
        """Wait for I/O up to ``longest`` seconds and apply it; False once closed.

        The I/O thread calls this in its loop. The thread leading a blocked ``get``
        calls it too (``leading``, on its own epoll), so a result wakes its waiter
        directly instead of through the I/O thread. While a leader leads, the I/O thread
        does not watch the workers (``_worker_selector`` muted), unless the machine has no
        core to spare: then both may be woken by the same frame, and the lock makes one
        of them read it while the other finds nothing.
        """
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
            return not self.closed
        if events and not leading:
            self._io_busy_until = time.monotonic() + IO_BUSY_FOR_S
        with self.lock:
            if self.closed:
                return False
            for key, mask in events:
                data = key.data
                if data == "wake":
                    try:
                        os.read(key.fd, 4096)
                    except BlockingIOError:
                        pass
                elif data == "forkserver":
                    self._read_forkserver()
                elif data == "workers":
                    for worker_key, _ in self._worker_selector.select(0):
                        self._read_worker(worker_key.data)
                elif leading:
                    self._read_worker(data)
                else:  # only this thread's epoll asks for room to write
                    self._flush(data)
                    if not data.out and not data.dead:
                        self.selector.unregister(data.sock)
            if not leading:
                for conn in self._want_write:
                    if not conn.dead and conn.out:
                        self._watch_writable(conn)
                self._want_write.clear()
            self._drain_refs()
            self._run_timers()
            self._dispatch()
            deferred, self._deferred = self._deferred, []
        for callback in deferred:
            callback()
        return True

    def _watch_writable(self, conn: WorkerConn) -> None:
        """Have this thread's epoll say when ``conn`` has room for its waiting output."""
        if conn.eof_at or conn.sock in self.selector.get_map():  # closed, or watched
            return
        self.selector.register(conn.sock, selectors.EVENT_WRITE, conn)

    def _watch_workers(self, watch: bool) -> bool:
        """Have this thread's epoll watch the workers' sockets, or not (a leading getter
        reads them: ``DriverCalls._block_on``); False if not done (no gate, or it is
        closed: shut down meanwhile, which ``_poll`` says)."""
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

    def _read_worker(self, conn: WorkerConn) -> None:
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
            self._on_worker_eof(conn)
        elif conn.actor is not None and conn.actor.queue:  # calls held while it was busy
            self.actors.pump(conn.actor)

    def _read_forkserver(self) -> None:
        import pickle

        control = self.forkserver.control
        try:
            data = control.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(control)
            if not self.closed:
                code = self.forkserver.process.poll()
                self._deferred.append(lambda: self.fail_runtime(
                    f"the fork server (pid {self.forkserver.process.pid}) exited with code "
                    f"{code}, so no worker can be started; its error, if any, is above"))
            return
        buffer = self._fs_decoder
        buffer += data
        while len(buffer) >= 4:
            length = int.from_bytes(buffer[:4], "little")
            if len(buffer) < 4 + length:
                break
            message = pickle.loads(bytes(buffer[4 : 4 + length]))
            del buffer[: 4 + length]
            if message[0] == preload.PRELOADED:
                self.forkserver.preloaded.append(message[2])
                continue
            conn = self.workers.get(message[1])
            if conn is None:
                continue
            if message[0] == forkserver.SPAWNED:
                conn.pid = message[2]
                if conn.doomed or conn.interrupt_on_spawn:  # kill/cancel came before the pid
                    try:
                        os.kill(conn.pid, signal.SIGKILL if conn.doomed else signal.SIGINT)
                    except ProcessLookupError:
                        pass
            elif message[0] == forkserver.EXITED:
                conn.exit_status = message[3]
                if conn.eof_at:
                    self._finish_worker_death(conn)

    def _add_timer(self, delay: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), callback))
        if threading.current_thread() is not self._thread:
            self._wake()

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback = heapq.heappop(self._timers)
            callback()

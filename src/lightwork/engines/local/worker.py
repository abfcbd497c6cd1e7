"""The worker process: run tasks sent by the driver, send results back.

One socket to the driver carries everything. The main thread reads a frame, runs the
task, and sends the result; when more task frames are already buffered, results are
held back briefly and sent together (batching), but never longer than ``FLUSH_AFTER_S``:
only results of tasks shorter than that are held, every send carries them, and a
late-flush thread sends them if the next task runs longer.

This module owns the task loop (reading and routing frames, batching results) and a
call's execution (``execute``, ``start_actor``, what a task frame names: ``target``).
The worker's other sides are mixins of :class:`Worker`: a task calling the API itself
(nested ``remote``/``put``/``get``/``wait``, ``worker_calls.py``), what a call's return
becomes (``worker_results.py``), the driver's cancels (``worker_cancels.py``) and how
the process ends (``worker_exit.py``). Whichever thread needs the next frame reads it
(one at a time, under ``_cond``) and routes it: a reply goes to the thread waiting for
it, a task goes to the inbox; while a thread waits, task frames in the inbox are bounced
back for the driver to place elsewhere. An actor with concurrency runs its calls on
threads or an event loop (``actor_runners.py``).

The loop is defensive: a user error is a result, never a crash of the loop, which ends
only as ``worker_exit.py`` says; faulthandler is on, so a fatal error leaves a stack on
stderr. A task submitted from here carries the running task's id (its parent, for
recursive cancel) and inherits its ``runtime_env`` (``runtime_env.py``).

What a task costs here, and why (on two cores a batch's workers share the core the
driver leaves them, so their CPU bounds a batch as much as the driver's does):

* the read turn takes ``_cond`` once per frame already decoded (twice when it reads the
  socket, letting go of it meanwhile) and notifies only when a thread waits
  (``_cond_waiters``): in a task worker nobody else waits;
* the CPU clock (a syscall) is read only for a function whose last run here took
  ``CPU_CLOCK_MIN_S`` or more; else the record's ``cpu_time`` is 0.0, "not measured",
  which the advisor's CPU rules skip (they read runs of 10 ms or more). So the first long
  run after short ones goes unmeasured, the next is measured. The worker's resident
  memory (peak and change, ``task_memory.py``) is read for the same calls;
* the common call skips what it does not need: one clock reading for the task loop and
  the call's start, no GPU or dependency helper when there are none, the function taken
  from its table directly, one return stored without building a list;
* arguments come, and a result leaves, as their pickle's bytes alone when that is all
  they are (``serialization.bare``, ``protocol.py``): no ``Stored`` is rebuilt from the
  frame or pickled into it;
* sockets are read into one buffer (``protocol.RECV_SIZE``), not a fresh one per read;
* a function whose code assigns a module global is kept wrapped in its table (the
  advisor's global-write, ``kernel/global_writes.py``); the others, nearly all, are
  called as they are: nothing is added to their calls.

The cyclic collector costs a worker nearly nothing (a no-op task's objects die by
reference counting: one young collection per 20,000 tasks), so the loop leaves it
alone, except when the driver asks (``COLLECT``: its store is under pressure, see
``store.py``): then the loop collects between calls and releases what that freed.

Measured: see bench/HOTPATH.md, "The worker loop".
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import itertools
import os
import signal
import socket
import sys
import threading
import time
import types
import traceback
from collections import deque
from typing import Any

import cloudpickle

from lightwork.kernel import exceptions
from lightwork.kernel.generators import (
    DYNAMIC_METHOD,
    STATIC_METHOD,
    GeneratorRaised,
    StaticItems,
)
from lightwork.kernel.object_ref import PROCESS_ID_SHIFT, keep_out_of_band, ref_counter
from lightwork.kernel import control
from lightwork.kernel import debugger
from lightwork.kernel import global_writes, introspect
from lightwork.engines.local import protocol as p
from lightwork.engines.local import task_memory
from lightwork.kernel import serialization
from lightwork.engines.local.actor_runners import (
    COROUTINE_FRAME,
    AsyncRunner,
    CallPool,
    is_async_class,
    leave_sigint_to_the_main_thread,
)
from lightwork.kernel import calls
from lightwork.kernel.global_writes import GlobalWatch
from lightwork.kernel.serialization import SerializationError
from lightwork.engines.local.call_outcomes import LostArgument, error_outcome, load_args
from lightwork.engines.local.worker_calls import WorkerCalls
from lightwork.engines.local.worker_cancels import WorkerCancels
from lightwork.engines.local.worker_exit import ActorExit, WorkerExit
from lightwork.engines.local.worker_results import WorkerResults

FLUSH_AFTER_S = 0.001
# A call whose function's last run here was shorter than this is not timed on the CPU
# clock (its record's cpu_time stays 0.0, "not measured"; the advisor's CPU rules read
# only runs of 10 ms or more, and skip 0.0). See the module docstring.
CPU_CLOCK_MIN_S = 0.001


class Worker(WorkerResults, WorkerCancels, WorkerExit, WorkerCalls):
    """The worker's runtime: the task loop and its calls; its other sides are mixins
    (``worker_state.py`` names them)."""

    def __init__(self, sock: socket.socket, worker_id: int, config: dict[str, Any]) -> None:
        self.conn = p.BlockingConnection(sock)
        self.worker_id = worker_id
        self.job_id = config["job_id"]
        self.shm_dir = config["shm_dir"]
        self.node_id = config["node_id"]
        self.total: dict[str, float] = config["total"]
        self.functions: dict[bytes, Any] = {}
        self.function_blobs: dict[bytes, bytes] = {}
        self.sent_functions: set[bytes] = set()
        # Payloads wrapped in an inherited runtime_env: (key, env) -> (key, blob).
        self._inherited_payloads: dict[tuple[bytes, str], tuple[bytes, bytes]] = {}
        self.inbox: deque[tuple[Any, ...]] = deque()
        self.outbox: deque[tuple[Any, ...]] = deque()
        self.replies: dict[int, Any] = {}
        self._cond = threading.Condition()
        self._reading = False
        self._cond_waiters = 0  # threads waiting on _cond for their turn or a frame
        self._waiting = 0
        self._ids = itertools.count(1)
        self._requests = itertools.count(1)
        self._local = threading.local()
        self.actor: Any = None
        self.actor_id = 0
        self.actor_name: str | None = None
        self.placed_in: Any = ()  # the actor's place shape: a group its calls may capture
        self.actor_gpu_ids: tuple[int, ...] = ()
        self.pool: CallPool | None = None
        self.loop: AsyncRunner | None = None
        self.exiting = False
        # exit_actor(): the task id of the call it ran in (-1: outside any call), else 0;
        # _exit_lock orders it against the constructor's end (request_exit).
        self.exit_call = 0
        self.actor_started = False
        self._exit_lock = threading.Lock()
        self._exit_thread: threading.Thread | None = None
        self.retiring = False  # a max_calls function's last call ran here (calls.CallLimit)
        self.bounce_when_waiting = True
        # Captured stdout/stderr (output.py): set when lines wait for the call's end.
        self.output: Any = None
        self.output_pending = False
        # Cancels (worker_cancels.py): the driver appends a task id to ``cancel_path`` and
        # then sends SIGINT, which the handler counts (``_on_sigint``).
        self.cancel_path = p.cancel_file(config.get("session_dir") or self.shm_dir, worker_id)
        # SIGINTs received (the handler counts them) and read up to: unequal means read the
        # file. Unequal at start: a SIGINT that came before ``main`` installed the handler
        # was lost.
        self.cancel_signals = 1
        self._signals_read = 0
        self.cancelled_ids: set[int] = set()
        self._cancel_offset = 0
        self.interrupted = 0  # the task a KeyboardInterrupt was raised in (at most once)
        # Results of finished tasks held back to be sent in one batch with the next ones.
        # Every send carries them first, and a late-flush thread sends them if the task
        # that followed runs longer than FLUSH_AFTER_S (it might never end: a blocked
        # actor call, or a parent waiting for a child that needs one of these results).
        self._held: list[tuple[Any, ...]] = []
        self._held_since = 0.0
        self._tasks_started = 0
        self._short_runs: set[Any] = set()  # function keys not timed on the CPU clock
        # The actor's methods (by name) whose code rebinds a module global: their calls
        # are watched (``kernel/global_writes.py``; a task function's wrapper is in
        # ``functions``). Empty nearly always: an actor call pays one truth test.
        self._global_watches: dict[str, GlobalWatch] = {}
        self._memory = task_memory.open_probe()  # resident memory around timed calls
        self._flush_soon: threading.Event | None = None
        self._send_lock = threading.Lock()  # one sender at a time: BORROW before RELEASE
        ref_counter.reset()
        ref_counter.on_borrow = self._note_borrow
        ref_counter.on_out_of_band = self._note_out_of_band
        # The driver recycles a segment only when no worker maps it: say so before any
        # message that could end this worker's use of the object (outbox goes first).
        serialization.MAPS.on_map = self._note_mapped
        serialization.MAPS.spill_dir = config.get("spill_dir")

    # -- ids and messages ------------------------------------------------------------
    def next_object_id(self) -> int:
        return (self.worker_id << PROCESS_ID_SHIFT) | next(self._ids)

    def _note_borrow(self, object_id: int) -> None:
        self.outbox.append((p.BORROW, object_id))

    def _note_mapped(self, path: str) -> None:
        self.outbox.append((p.MAPPED, path))

    def _report_unmapped(self) -> None:
        """Close the segments no value of this process points into; tell the driver."""
        closed = serialization.MAPS.release_unused()
        if closed:
            self.outbox.append((p.UNMAPPED, closed))

    def _note_out_of_band(self, ref: Any, how: str) -> None:
        """A call pickled a ref outside lightwork's serializer, or rebuilt one from its
        id: a pickled one is kept while this worker lives (the driver then keeps its
        object); the driver's advisor is told, with the user's line."""
        site = keep_out_of_band(ref, how)
        if site is None:
            return
        frame = self.current
        self.outbox.append((p.ADVICE, "out-of-band", how, ref.hex(), site,
                            frame[2] if frame is not None else None))

    def note_fork(self) -> None:
        """Before a fork in this process: if a call forks (``os.fork``, a fork-start
        multiprocessing pool), tell the driver's advisor, with the user's line."""
        frame = getattr(self._local, "frame", None)
        if frame is None:
            return
        site = introspect.forking_callsite()
        if site is None:
            return
        try:
            self.send([(p.ADVICE, "fork", frame[2], site)])
        except Exception:  # noqa: BLE001 - the fork goes on whatever the advice
            pass

    def send(self, messages: list[tuple[Any, ...]]) -> None:
        """Send held results and queued messages, then ``messages``, releases last."""
        with self._send_lock:
            gone = ref_counter.drain()
            outbox = self.outbox
            if outbox or self._held:
                queued, self._held = self._held, []
                while outbox:  # popleft is atomic: other threads may append meanwhile
                    queued.append(outbox.popleft())
                messages = queued + messages
            if gone:
                messages.append((p.RELEASE, gone))
            if messages:
                self.conn.send(messages)

    def _flush_late(self) -> None:
        """Send held results when the task after them has run for FLUSH_AFTER_S."""
        assert self._flush_soon is not None
        leave_sigint_to_the_main_thread()
        while True:
            self._flush_soon.wait()
            self._flush_soon.clear()
            started = self._tasks_started
            time.sleep(FLUSH_AFTER_S)
            if self._held and self._tasks_started == started:
                self.send([])

    # -- reading ---------------------------------------------------------------------
    def _route(self, message: tuple[Any, ...]) -> bool:
        """File a frame just read (caller holds ``_cond``); True: bounce it back now."""
        kind = message[0]
        if kind == p.REPLY:
            self.replies[message[1]] = message[2]
        elif kind == p.FUNCTION:
            self.function_blobs[message[1]] = message[2]
        elif kind == p.TASK and self._waiting and self.bounce_when_waiting:
            return True
        else:
            self.inbox.append(message)
        return False

    def _take_turn(self, done: Any) -> Any:
        """Read frames until ``done()`` returns something other than None; return it.

        One thread reads at a time (``_reading``); the others wait on ``_cond`` and are
        notified only when there are any (``_cond_waiters``: a task worker's main
        thread is nearly always alone). A frame already decoded is taken without letting
        go of ``_cond``; a read from the socket lets go of it meanwhile.
        """
        cond = self._cond
        conn = self.conn
        with cond:
            while True:
                result = done()
                if result is not None:
                    return result
                if self._reading:
                    self._cond_waiters += 1
                    try:
                        cond.wait()
                    finally:
                        self._cond_waiters -= 1
                    continue
                if conn.has_buffered():
                    message = conn.recv()
                else:
                    self._reading = True
                    try:
                        cond.release()
                        try:
                            message = conn.recv()
                        finally:
                            cond.acquire()
                    finally:
                        self._reading = False
                        if self._cond_waiters:  # one of them reads next
                            cond.notify_all()
                if message is None:
                    os._exit(0)  # the driver is gone: nothing to report to, nothing to keep
                bounce = self._route(message)
                if self._cond_waiters:
                    cond.notify_all()
                if bounce:  # now, not with the next send: this worker is blocked until a reply
                    cond.release()
                    try:
                        self.send([(p.BOUNCE, message[1][0])])
                    finally:
                        cond.acquire()

    def _next_inbox(self) -> tuple[Any, ...] | None:
        return self.inbox.popleft() if self.inbox else None

    # -- the task loop ---------------------------------------------------------------
    def run(self) -> None:
        while True:
            if self._held and (
                not (self.inbox or self.conn.has_buffered())
                or time.monotonic() - self._held_since > FLUSH_AFTER_S
            ):
                self.send([])
            message = self._take_turn(self._next_inbox)
            kind = message[0]
            if kind == p.TASK:
                if self.pool is not None:
                    self.pool.submit(message[1])
                    continue
                self._tasks_started += 1
                if self._held:
                    self._wake_late_flush()
                started = time.monotonic()
                result = self.execute(message[1], started)
                stored = result[6]  # when its result was stored: the end of the call
                if self.exiting or stored - started >= FLUSH_AFTER_S:
                    # Batching only pays for tiny tasks; holding a longer task's result
                    # would only lose it (and re-run the task) if this worker died.
                    if self.exiting:
                        result = self.exit_result(result)
                    self.send([result, (p.RETIRE,)] if self.retiring else [result])
                    if self.exiting:
                        return
                    continue
                with self._send_lock:
                    if not self._held:
                        self._held_since = stored
                    # What the task queued (MAPPED reports, borrows) goes before its result.
                    outbox = self.outbox
                    while outbox:
                        self._held.append(outbox.popleft())
                    self._held.append(result)
            elif kind == p.ACTOR_INIT:
                self.send([self.start_actor(message[1])])
            elif kind == p.EXIT:
                self.send([])
                return
            elif kind == p.COLLECT:
                gc.collect()
                self._report_unmapped()
                self.send([])  # what the collection freed, released now

    # -- the debugger (kernel/debugger.py) ------------------------------------------------
    def announce_pause(self, event: str, info: dict[str, Any]) -> None:
        """A call of this worker paused in the debugger, or runs on: tell the driver now
        (from the paused call's thread; the main thread may be that one)."""
        self.send([(p.DEBUG, event, info)])

    def describe_call(self) -> tuple[int, str]:
        """The running call's task id and name, for the debugger's announcements."""
        frame = self.current
        if frame is None:
            return (0, self.actor_name or "worker")
        return (frame[0], frame[2])

    def _wake_late_flush(self) -> None:
        if self._flush_soon is None:
            self._flush_soon = threading.Event()
            threading.Thread(target=self._flush_late, name="lightwork-flush", daemon=True).start()
        if not self._flush_soon.is_set():  # set() takes the Event's lock: once per task
            self._flush_soon.set()

    def function(self, key: bytes) -> Any:
        fn = self.functions.get(key)
        if fn is None:
            # The blob is dropped only once its function is filed: a load that raises
            # (an import the worker lacks) or that a cancel's KeyboardInterrupt cuts
            # short leaves it for the next call, which the driver sends without it.
            fn = cloudpickle.loads(self.function_blobs[key])
            if type(fn) is types.FunctionType:  # its calls watched if it assigns a global
                watch = global_writes.watch_of(fn)
                if watch is not None:
                    fn = global_writes.watched(fn, watch, self.note_global_write)
            self.functions[key] = fn
            del self.function_blobs[key]
        return fn

    @property
    def current(self) -> tuple[Any, ...] | None:
        """The frame of the call running in this thread (on an async actor's loop: in
        this coroutine), or None."""
        frame = getattr(self._local, "frame", None)
        if frame is None and self.loop is not None:
            frame = COROUTINE_FRAME.get()
        return frame

    @current.setter
    def current(self, frame: tuple[Any, ...] | None) -> None:
        self._local.frame = frame

    def target(self, key: Any) -> Any:
        """The callable a task frame names: a function by hash, or an actor method."""
        if type(key) is bytes:
            return self.function(key)
        if key == "__ray_terminate__":
            self.exiting = True
            return _noop
        try:
            method = calls.actor_method(self.actor, key)
            if self._global_watches and key in self._global_watches:
                return global_writes.watched(method, self._global_watches[key],
                                             self._note_method_global_write)
            return method
        except AttributeError:
            built_in = calls.built_in_method(self.actor, key)
            if built_in is not None:  # __ray_ready__, __ray_call__
                return built_in
            if key.startswith(DYNAMIC_METHOD):  # a num_returns="dynamic" call (api/generator.py)
                from lightwork.kernel.generators import DynamicReturns

                return DynamicReturns(calls.actor_method(self.actor, key[len(DYNAMIC_METHOD):]))
            if key.startswith(STATIC_METHOD):  # a generator method called with num_returns=1
                from lightwork.kernel.generators import StaticReturns

                return StaticReturns(calls.actor_method(self.actor, key[len(STATIC_METHOD):]))
            raise

    def execute(self, frame: tuple[Any, ...], started: float = 0.0) -> tuple[Any, ...]:
        """Run the task of ``frame``; its DONE message. ``started``: when the caller
        took it up (the task loop reads the clock for itself anyway), else now."""
        if _test_gate_dir is not None:
            _hold_at_gate("dispatched", frame[2])
            started = 0.0
        if not started:
            started = time.monotonic()
        args_loaded = finished = started
        cpu = 0.0
        memory = None
        try:
            outcome, args_loaded, finished, cpu, memory = self._execute(frame, started)
        except KeyboardInterrupt:  # a cancel that landed outside _execute's own handlers
            finished = time.monotonic()
            outcome = "cancelled"
        if self.output_pending:  # what the call printed goes before its result
            self.output.end_call()
        self._local.frame = None  # (the ``current`` setter's work, without its call)
        if self.cancelled_ids:
            self.cancelled_ids.discard(frame[0])
        if len(serialization.MAPS):  # _execute's locals (args, result) are gone by now
            self._report_unmapped()
        done = (p.DONE, frame[0], outcome, started, args_loaded, finished, time.monotonic(), cpu)
        return done if memory is None else done + memory  # (protocol.py: a measured DONE)

    def _execute(self, frame: tuple[Any, ...], started: float
                 ) -> tuple[Any, float, float, float, tuple[int, int] | None]:
        """Run one task: its outcome, when its arguments were loaded and it ended, its CPU,
        and its worker's peak resident memory and its change across it (None: not read)."""
        (task_id, key, name, args_stored, dep_values, return_ids, _resources, gpu_ids) = frame
        outcome: Any
        args_loaded = started
        # The process's CPU time (all threads: shows tasks that oversubscribe) over the
        # call alone: loading arguments and storing results are the runtime's work.
        cpu = cpu_started = 0.0
        memory = None
        resident = 0
        try:
            # From here a SIGINT naming this task interrupts it (the ``current`` setter's
            # work, without its call: a worker runs this for every task).
            self._local.frame = frame
            # On a pool thread the main thread may not have run the handler yet.
            grew = self.pool is not None and self._cancel_file_grew()
            if (grew or self.cancel_signals != self._signals_read or self.cancelled_ids) and \
                    self.cancelled(task_id, grew):
                self.interrupted = task_id
                raise KeyboardInterrupt  # cancelled between dispatch and start
            if gpu_ids:
                _set_gpu_env(gpu_ids)
            fn = self.functions.get(key) if type(key) is bytes else None
            if fn is None:  # an actor method, or a function not yet loaded
                fn = self.target(key)
            args, kwargs = (load_args(args_stored, dep_values) if dep_values
                            else serialization.loads(args_stored))
            # The CPU clock is a syscall (1-2.4 µs here): read only when this function's
            # last run here took CPU_CLOCK_MIN_S or more, or it has not run here yet; the
            # resident memory likewise (task_memory.py: ~6 µs).
            timed = key not in self._short_runs
            if timed and self._memory is not None:
                resident = self._memory.before()
            args_loaded = time.monotonic()
            if timed:
                cpu_started = time.process_time()
            if self.loop is None:
                result = fn(*args, **kwargs)
            else:  # an async actor: every method runs on its loop (actor_runners.py)
                result = self.loop.call(fn, args, kwargs, frame)
            stored = None
            if type(result) in _YIELDING:  # its items stream, or fill num_returns=k
                stored = self.store_yields(name, result, return_ids)
                result = None
            del args, kwargs
            finished = time.monotonic()
            if timed:
                cpu = time.process_time() - cpu_started
                if self._memory is not None:
                    memory = self._memory.after(resident)
            if finished - args_loaded < CPU_CLOCK_MIN_S:
                if timed:
                    self._short_runs.add(key)
            elif not timed:
                self._short_runs.discard(key)
            outcome = self.store_results(name, result, return_ids) if stored is None else stored
            del result
        except KeyboardInterrupt as exc:
            finished = time.monotonic()
            # Ours (a cancel) or the user's own: only the first is a cancellation.
            outcome = "cancelled" if self.interrupted == task_id else (
                "error", error_outcome(name, exc))
        except LostArgument as lost:  # the driver rebuilds it and sends the task again
            finished = time.monotonic()
            outcome = ("lost", lost.path)
        except ActorExit:
            finished = time.monotonic()
            self.exiting = True
            outcome = ("exit", None)
        except GeneratorRaised as raised:  # before it filled its returns: the driver
            finished = time.monotonic()      # retries it, or keeps ``partial``
            partial = raised.partial
            if type(partial) is not list:  # a dynamic generator's refs, the error last
                partial = self.store_results(name, partial, return_ids)
            outcome = ("raised", error_outcome(name, raised.error), partial)
            traceback.clear_frames(raised.error.__traceback__)
            del raised, partial
        except SerializationError as exc:
            finished = time.monotonic()
            outcome = ("error", serialization.serialize(
                exceptions.TaskError(name, f"{exc}\n", exc, os.getpid()), None))
        except BaseException as exc:  # noqa: BLE001 - user errors become results
            if debugger.post_mortem_on():  # init(post_mortem=True): pause where it raised
                debugger.post_mortem(exc)
            finished = time.monotonic()
            outcome = ("error", error_outcome(name, exc))
            # The error is sent as text and a copy: drop the failed task's locals now, so a
            # reference cycle through its frames cannot pin its objects (refs, arrays that
            # keep segments mapped) until the collector happens to run.
            traceback.clear_frames(exc.__traceback__)
        return outcome, args_loaded, finished, cpu, memory

    def _note_method_global_write(self, watch: GlobalWatch,
                                  changed: list[tuple[str, int]]) -> None:
        """An actor method rebound a global: reported once, then its calls unwatched."""
        for name, other in list(self._global_watches.items()):
            if other is watch:
                self._global_watches.pop(name, None)
        self.note_global_write(watch, changed)

    def note_global_write(self, watch: GlobalWatch, changed: list[tuple[str, int]]) -> None:
        """A call rebound a module global (``global_writes.watched``): tell the driver's
        advisor, with the running call (its record holds the user's call site)."""
        frame = self.current
        if frame is not None:
            self.outbox.append((p.ADVICE, "global-write", frame[0], frame[2],
                                watch.filename, changed))

    def start_actor(self, frame: tuple[Any, ...]) -> tuple[Any, ...]:
        """Create this worker's actor instance; the DONE says whether ``__init__`` worked."""
        (task_id, key, name, args_stored, dep_values, actor_id, actor_name, concurrency,
         gpu_ids, self.placed_in) = frame
        started = time.monotonic()
        self.actor_gpu_ids = gpu_ids
        _set_gpu_env(gpu_ids)  # for the constructor too: it may pick its device
        self.actor_id, self.actor_name = actor_id, actor_name
        self.bounce_when_waiting = False  # an actor's calls cannot run anywhere else
        outcome: Any = []
        try:
            cls = self.function(key)
            args, kwargs = load_args(args_stored, dep_values)
            if is_async_class(cls):
                self.loop = AsyncRunner(self, concurrency or 1000)
                self.pool = CallPool(self, self.loop.limit)
                # On the loop, as in Ray: the constructor may start asyncio tasks.
                self.actor = self.loop.call(cls, args, kwargs, None)
            else:
                if concurrency and concurrency > 1:
                    self.pool = CallPool(self, concurrency)
                self.actor = cls(*args, **kwargs)
            if isinstance(cls, type):
                self._global_watches.update(global_writes.watches_of_class(cls))
        except (ActorExit, exceptions.AsyncioActorExit):
            outcome = ("exit", None)
        except BaseException as exc:  # noqa: BLE001 - reported as the actor's death cause
            if debugger.post_mortem_on():
                debugger.post_mortem(exc)
            outcome = ("error", error_outcome(f"{name}.__init__", exc))
        if self.output_pending:
            self.output.end_call()
        with self._exit_lock:  # see request_exit
            self.actor_started = True
            if self.exiting and not outcome:  # exit_actor() caught, or in a task it started
                outcome = ("exit", None)
        now = time.monotonic()
        return (p.DONE, task_id, outcome, started, started, now, now, 0.0)


# What a function returns that yields its items (StaticItems: a num_returns=1 call's)
_YIELDING = (types.GeneratorType, types.AsyncGeneratorType, StaticItems)


def _noop() -> None:
    return None


def _set_gpu_env(gpu_ids: tuple[int, ...]) -> None:
    if gpu_ids:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)


def _on_sigint(signum: int, frame: Any) -> None:
    """A cancel: interrupt the running task if the driver named it, else note it.

    Raises at most once per task (``interrupted``), so the KeyboardInterrupt cannot land
    a second time while ``execute`` is turning the first into the "cancelled" outcome.
    """
    worker = _current_worker
    if worker is None:
        return
    if _test_gate_dir is not None:  # a test holds the handler: the main thread is late
        _hold_at_gate("sigint", "handler")
    worker.cancel_signals += 1
    if worker.actor_id:
        # An actor's running call is never interrupted here (Ray: its state could be left
        # half-changed): is_canceled() and the start check read the ids; coroutines of an
        # async actor are cancelled on its loop. See ActorManager.cancel_call.
        worker.cancelled(0)
        if worker.loop is not None and worker.loop.running:
            worker.loop.cancel(worker.cancelled_ids)
        return
    running = worker.current
    if running is not None and worker.interrupted != running[0] and worker.cancelled(running[0]):
        worker.interrupted = running[0]
        raise KeyboardInterrupt


_current_worker: Worker | None = None

# Tests only: LIGHTWORK_TEST_GATE_DIR=<dir> holds a task named N at point P while the
# file <dir>/P-N.hold exists (and creates <dir>/P-N.reached), so a test can act on a
# task at an exact point of its life. Read once in ``main``; unset, it costs one check.
_test_gate_dir: str | None = None


def _hold_at_gate(point: str, task_name: str) -> None:
    gate = os.path.join(_test_gate_dir or "", f"{point}-{task_name}")
    if os.path.exists(gate + ".hold"):
        open(gate + ".reached", "w").close()
        while os.path.exists(gate + ".hold"):
            time.sleep(0.005)


def main(fd: int, worker_id: int, config: dict[str, Any]) -> None:
    """Entry point in the forked child."""
    global _current_worker, _test_gate_dir
    faulthandler.enable()
    _test_gate_dir = os.environ.get("LIGHTWORK_TEST_GATE_DIR") or None
    sys.path[:] = config["sys_path"]
    try:
        os.chdir(config["cwd"])
    except OSError:
        pass
    os.environ.update(config["env"])
    if config.get("as_ray"):  # the driver runs a Ray program: its modules `import ray`
        from lightwork.kernel import ray_alias

        ray_alias.install_as_ray()
    sock = socket.socket(fileno=fd)
    control.install_worker_hooks(worker_id, config)  # stack dumps on SIGUSR1, profile spans
    worker = Worker(sock, worker_id, config)
    _current_worker = worker
    from lightwork.engines.local import sampler

    sampler.install(worker_id, config)  # task profiles: SIGUSR2 starts/stops them
    calls.retire_worker = worker.retire  # max_calls: this process ends after the call
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from lightwork.engines.local.backend import LocalBackend
    from lightwork.kernel import backend as kernel_backend

    kernel_backend.install(LocalBackend(worker, in_driver=False))
    # The atexit handlers that run when an actor ends (Worker.leave) are its own: a fork
    # server forked from the driver carries the driver's (lightwork's shutdown, the
    # user's), which must never run here.
    atexit._clear()
    from lightwork.engines.local import output

    output.install(worker)  # print() and logging reach the driver, labelled
    # PYTHONBREAKPOINT as the driver has it now (0: breakpoints off), then the debugger.
    if config.get("breakpoint") is None:
        os.environ.pop("PYTHONBREAKPOINT", None)
    else:
        os.environ["PYTHONBREAKPOINT"] = config["breakpoint"]
    if config.get("session_dir"):
        debugger.install(config["session_dir"], worker_id, worker.announce_pause,
                         worker.describe_call, config.get("debugger") or "pdb",
                         bool(config.get("post_mortem")))
    os.register_at_fork(before=worker.note_fork)  # (a fork is rare: nothing per call)
    worker.run()
    worker.end()

"""What runs inside a Dask worker for the distributed backend.

Every task is :func:`run_task` called by distributed with a small header and the values of
the task's top-level ref arguments (distributed resolves those futures: they are its
dependencies). The user's function and the rest of its arguments travel as bytes that
distributed never looks into, so refs inside containers stay refs (distributed would
otherwise resolve futures it finds in lists and dicts, and its handling of them races).
Large buffers among the arguments come as one more dependency, a scattered block the
pickle's out-of-band buffers view (:class:`Scattered`, ``cluster_tasks``' *Large
arguments*).

Values as they are stored in the cluster
----------------------------------------
A task's result is stored as the user's value, except:

* :class:`Failed` — the task raised; it carries the ``TaskError`` (user's exception and
  remote traceback). Errors are values, not raised, so distributed never retries them
  behind our back (``retry_exceptions`` is applied here, by exception type, as Ray does)
  and a task whose argument failed fails with that same error;
* :class:`WithRefs` — a value containing refs: its pickled bytes plus ``{id: key}`` for
  every ref inside, so whoever unpickles it can hold those objects (see *borrowing*).

Borrowing
---------
Whoever submits a task holds the futures of the refs inside its arguments until the
task ends, and sends ``{id: key}`` along. Before the task unpickles its arguments, the
worker's backend learns those keys; unpickling a ref then makes it take a future of its
own for that key (``RefCounter.on_borrow``), released when the last ref to that id in the
process is gone. So an object stays alive while any process holds a ref to it, including
refs a task keeps after it returns (in an actor's state, say). Refs a task returns inside
its (single) result are held by the worker that made them while that result's key lives
(``cluster_plugin.ExportedRefs``); inside a ``put`` value, one of several returns, a
generator's item or an actor call's result, while that outer object lives
(``cluster_holds``). A task and an actor call drop their own refs to what they return
when they end, so only those holds keep it.

The event log
-------------
:func:`run_task` stamps its start, arguments loaded, finish and result stored (wall
clock), its retries and its error, into ``cluster_record``'s per-process ring, which the
driver pulls (see ``cluster_record``). With them go the result's size
(:func:`stored_size`: what distributed counts for the stored value, ``safe_sizeof``, so
the same yardstick as its transfers) and, for a task with ref arguments, the fetches
distributed made for it from other workers (:func:`transfers_into`).

Transfers are read on the receiving worker, from the running task's own state: when
distributed fetches a task's dependencies from another worker, it appends an
``{"action": "transfer", "start", "stop", "source"}`` entry to the *dependent* task's
``startstops`` (the same entries the scheduler's plugins receive with the task's
``processing -> memory`` transition, and the Dask dashboard's task stream draws), and one
entry with the bytes moved to ``Worker.transfer_incoming_log``. A ``WorkerPlugin``'s
``transition`` hook gets neither (no kwargs), and a ``SchedulerPlugin`` gets the
startstops without the bytes and on the scheduler's clock; here both are at hand, on this
worker's clock (the stamps carry ``scheduler_delay``, which is taken off again). A batch
fetch is attached by distributed to one dependent of what it fetched: the task that runs
next, typically, as in Dask's task stream.
"""

from __future__ import annotations

import itertools
import os
import pickle
import threading
import time
import traceback
import types
from typing import Any

import cloudpickle
from distributed.sizeof import safe_sizeof

from lightwork.kernel import debugger, exceptions
from lightwork.kernel.object_ref import collecting_refs, ref_counter
from lightwork.kernel import pickler
from lightwork.kernel.generators import GeneratorRaised, StaticItems, take_static
from lightwork.kernel.serialization import SerializationError, pickle_value
from lightwork.kernel.serialization import dumps as dumps_out_of_band
from lightwork.kernel.calls import ArgSlot  # the same placeholder as the local runtime's
from lightwork.kernel.calls import retry_classes
from lightwork.engines.distributed.record import error_text as _error_text
from lightwork.engines.distributed.record import note as _note
from lightwork.engines.distributed import output as cluster_output
from lightwork.engines.distributed.debugging import CALL as _DEBUG_CALL
from lightwork.engines.distributed.replies import send_reply

BACKEND = "distributed"


def unsupported(feature: str, instead: str) -> exceptions.UnsupportedOnBackend:
    """The error for a feature this backend cannot offer, and what to do instead."""
    return exceptions.UnsupportedOnBackend(
        f"{feature} is not supported on the {BACKEND} backend: {instead}")


def key_name(name: str) -> str:
    """A task name as the first part of a distributed key (the dashboard's group name)."""
    return name.split(".<locals>.")[-1].replace("-", "_") or "task"


_wall = time.time  # the event log's worker-side stamps (see cluster_record)

# Values never pickled again to look for refs inside: they cannot hold one.
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)


class Failed:
    """A task's error stored as its value."""

    __slots__ = ("error",)

    def __init__(self, error: exceptions.LightworkError) -> None:
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (Failed, (self.error,))


class WithRefs:
    """A value containing refs: its pickle, and the cluster key of each ref inside."""

    __slots__ = ("payload", "keys")

    def __init__(self, payload: bytes, keys: dict[int, str]) -> None:
        self.payload = payload
        self.keys = keys

    def __reduce__(self) -> tuple[Any, ...]:
        return (WithRefs, (self.payload, self.keys))


#: The running task's (task id, name, resources) per worker thread, for runtime_context.
current = threading.local()
_functions: dict[bytes, Any] = {}
_functions_lock = threading.Lock()


def _function(key: bytes, blob: bytes) -> Any:
    function = _functions.get(key)
    if function is None:
        with _functions_lock:
            function = _functions.get(key)
            if function is None:
                function = _functions[key] = cloudpickle.loads(blob)
    return function


def error_of(name: str, exc: BaseException) -> Failed:
    """The user's exception as a stored TaskError (without the cause if it won't pickle)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    error = exceptions.TaskError(name, tb, exc, os.getpid())
    try:
        pickler.dumps(exc)
    except Exception:  # noqa: BLE001 - an unpicklable exception still reports its traceback
        error = exceptions.TaskError(name, tb, None, os.getpid())
    return Failed(error)


def spread_failure(failed: Failed, num_returns: int) -> Any:
    """``failed`` as the result of a task or call with ``num_returns`` returns."""
    return failed if num_returns <= 1 else (failed,) * num_returns


def _should_retry(
    exc: BaseException, retry_exceptions: Any, attempt: int, max_retries: int
) -> bool:
    if not retry_exceptions or not (max_retries < 0 or attempt < max_retries):
        return False
    return retry_exceptions is True or isinstance(exc, retry_classes(retry_exceptions))


#: How often a task waiting to be retried looks whether it was cancelled meanwhile.
RETRY_WAIT_SLICE_S = 0.05


def wait_before_retry(delay_s: float) -> bool:
    """Wait ``delay_s`` before the running task's retry; False if the task was released
    meanwhile (the program cancelled it, or dropped its refs: the scheduler freed its
    key, so nobody wants the retry's result)."""
    if delay_s <= 0:
        return True
    key = _current_key()
    deadline = time.monotonic() + delay_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, RETRY_WAIT_SLICE_S))
        if key is not None and not _still_wanted(key):
            return False


def _still_wanted(key: Any) -> bool:
    """Whether this worker still runs ``key`` for the scheduler: a task released while
    it runs stays on its thread, its worker-side state ``cancelled``."""
    try:
        from distributed import get_worker

        state = get_worker().state.tasks.get(key)
    except (ValueError, AttributeError):
        return True
    return state is not None and state.state not in ("cancelled", "released", "forgotten")


def stored_size(stored: Any, num_returns: int = 1) -> int:
    """The size of a task's or actor call's stored result(s), as distributed counts a
    stored value (``nbytes``; a value holding refs: its pickle's length)."""
    if num_returns == 1:
        return len(stored.payload) if type(stored) is WithRefs else safe_sizeof(stored)
    return sum(stored_size(part) for part in stored or ())


#: Transfer log entries searched, newest first, for a transfer's bytes (a fetch's entry
#: is logged just before the task it fed can run, so it is among the last few).
TRANSFER_LOG_SCAN = 256


def transfers_into() -> tuple[tuple[float, float, str, int], ...]:
    """The fetches distributed made from other workers for the running task, as
    (start, stop on this worker's wall clock, source worker's address, bytes; 0 if the
    transfer log no longer has it). Empty outside a Dask task."""
    try:
        from distributed import get_worker

        worker = get_worker()
        task = worker.state.tasks.get(worker.get_current_task())
        stamps = task.startstops if task is not None else ()
    except (ValueError, AttributeError, KeyError):
        return ()
    if not stamps:
        return ()
    fetches = [s for s in stamps if s.get("action") == "transfer"]
    if not fetches:
        return ()
    # (Read with defaults: a distributed that renamed these loses the bytes, not the task.)
    delay = getattr(worker, "scheduler_delay", 0.0)  # the stamps carry it: taken off
    logged = list(itertools.islice(reversed(getattr(worker, "transfer_incoming_log", ())),
                                   TRANSFER_LOG_SCAN))
    transfers = []
    for fetch in fetches:
        nbytes = next((entry.get("total", 0) for entry in logged
                       if entry.get("start") == fetch["start"]
                       and entry.get("who") == fetch["source"]), 0)
        transfers.append((fetch["start"] - delay, fetch["stop"] - delay,
                          str(fetch["source"]), int(nbytes)))
    return tuple(transfers)


class Scattered:
    """A task's arguments whose large buffers travel on their own (``cluster_tasks``,
    *Large arguments*): the pickle with those buffers out of band, the position among
    the task's dependencies of the scattered key holding a copy of them all, and where
    each buffer lies in that copy."""

    __slots__ = ("data", "slot", "bounds")

    def __init__(self, data: bytes, slot: int, bounds: tuple[tuple[int, int], ...]) -> None:
        self.data = data
        self.slot = slot
        self.bounds = bounds

    def __reduce__(self) -> tuple[Any, ...]:
        return (Scattered, (self.data, self.slot, self.bounds))

    def __len__(self) -> int:  # the arguments' size, as the event log counts it
        return len(self.data) + (self.bounds[-1][1] if self.bounds else 0)


class InlineBuffers:
    """An actor call's arguments whose large buffers travel in its RPC as one frame of
    their own: the pickle with those buffers out of band, their one copy, and where each
    lies in it. Pickled, the copy is a ``PickleBuffer``, which distributed's RPC sends
    as a frame of its own, not inside a pickle (no copy into one, none out of it)."""

    __slots__ = ("data", "block", "bounds")

    def __init__(self, data: bytes, block: Any, bounds: tuple[tuple[int, int], ...]) -> None:
        self.data = data
        self.block = block
        self.bounds = bounds

    def __reduce__(self) -> tuple[Any, ...]:
        return (InlineBuffers, (self.data, pickle.PickleBuffer(self.block), self.bounds))

    def __len__(self) -> int:  # the arguments' size, as the event log counts it
        return len(self.data) + (self.bounds[-1][1] if self.bounds else 0)


def join_buffers(buffers: list[pickle.PickleBuffer]
                 ) -> tuple[memoryview, tuple[tuple[int, int], ...]]:
    """One copy of ``buffers``, each at an aligned offset, and where each lies: the value
    as it was passed, whatever the caller does to its arrays after (and what a retry or a
    call sent again sends)."""
    pieces: list[Any] = []
    bounds = []
    offset = 0
    for buffer in buffers:
        raw = buffer.raw()
        pad = -offset % ALIGN
        if pad:
            pieces.append(bytes(pad))
        bounds.append((offset + pad, offset + pad + raw.nbytes))
        pieces.append(raw)
        offset += pad + raw.nbytes
    return memoryview(b"".join(pieces)), tuple(bounds)


#: Each buffer's offset in a joined copy (as numpy likes its data).
ALIGN = 64


def call_payload(args: tuple, kwargs: dict, inline_min: int) -> tuple[Any, list[int]]:
    """An actor call's ``(args, kwargs)`` pickled, and the ids of the refs inside: in
    band, or as :class:`InlineBuffers` when its large buffers come to ``inline_min``."""
    data, buffers, contained = dumps_out_of_band((args, kwargs))
    if not buffers or sum(buffer.raw().nbytes for buffer in buffers) < inline_min:
        with collecting_refs() as contained:
            return pickle_value((args, kwargs)), contained
    block, bounds = join_buffers(buffers)
    return InlineBuffers(data, block, bounds), contained


def _views(block: Any, bounds: tuple[tuple[int, int], ...]) -> list[memoryview]:
    copy = memoryview(block).cast("B").toreadonly()  # read-only, however it came
    return [copy[start:stop] for start, stop in bounds]


def load_arguments(payload: Any, dep_values: tuple[Any, ...] = ()) -> Any:
    """A task's or actor call's ``(args, kwargs)`` from its payload; a :class:`Scattered`
    one takes its buffers from a dependency's value, an :class:`InlineBuffers` one from
    its own frame, without a copy (arrays view it)."""
    kind = type(payload)
    if kind is Scattered:  # (received, or kept by this worker)
        return pickle.loads(payload.data,
                            buffers=_views(dep_values[payload.slot], payload.bounds))
    if kind is InlineBuffers:
        return pickle.loads(payload.data, buffers=_views(payload.block, payload.bounds))
    return cloudpickle.loads(payload)


def run_task(header: tuple[Any, ...], *dep_values: Any, stream: Any = None) -> Any:
    """Run one task (see the module docstring); returns its stored result(s). A generator
    task's items go to ``stream`` (``cluster_streams.run_stream_task``) as it yields them,
    and its result is None."""
    started = _wall()
    (task_id, key, blob, name, payload, keys, num_returns, max_retries, retry_exceptions,
     retry_delay_s, resources, session, reply_to) = header
    backend = worker_backend()
    for value in dep_values:  # an argument that failed fails this task with its error
        if type(value) is Failed:
            now = _wall()
            _note(session, task_id, name, 0, started, now, now, now, _error_text(value.error))
            if num_returns == 1 and reply_to is not None:
                send_reply(reply_to, task_id, value, 0)
            return value if num_returns == 1 else (value,) * num_returns
    # Read now: a retry of this task by distributed (its worker lost) starts afresh.
    transfers = transfers_into() if dep_values else ()
    backend.adopt(keys)  # before unpickling: the refs inside are borrowed with these keys
    args, kwargs = load_arguments(payload, dep_values)
    if dep_values:
        values = [backend.decode(value) for value in dep_values]
        args = [values[a.index] if type(a) is ArgSlot else a for a in args]
        kwargs = {k: values[v.index] if type(v) is ArgSlot else v for k, v in kwargs.items()}
    function = _function(key, blob)
    previous = (getattr(current, "task", None), getattr(current, "session", 0),
                getattr(current, "retry_delay_s", None))
    current.task, current.session = (task_id, name, resources), session
    current.retry_delay_s = retry_delay_s  # (what the task's own submissions carry)
    debug_call = _DEBUG_CALL.set((task_id, name, session))  # whom a breakpoint() names
    tag = getattr(backend.futures, "tag", None)
    if keys and tag is not None:  # what its arguments borrowed is its session's (listings)
        tag(keys, session)
    attempt = 0
    retries: tuple[tuple[float, str], ...] = ()
    loaded = _wall()
    short: list[Any] | None = None  # a static generator's items, fewer than its returns
    try:
        while True:
            try:
                result = function(*args, **kwargs)
                if stream is not None:
                    stream.start()
                    for item in result:
                        stream.item(item)
                    result = None
                elif type(result) is StaticItems or (
                        num_returns != 1 and type(result) is types.GeneratorType):
                    # num_returns=k: its first k items (generators.take_static)
                    values = take_static(result, num_returns, name)
                    result = values[0] if num_returns == 1 else values
                break
            except Exception as exc:  # noqa: BLE001 - the user's error becomes the result
                error = exc.error if isinstance(exc, GeneratorRaised) else exc
                if _should_retry(error, retry_exceptions, attempt, max_retries) and \
                        wait_before_retry(retry_delay_s):
                    attempt += 1
                    retries += ((_wall(), f"retry_exceptions: {_error_text(error)}"),)
                    continue
                if debugger.post_mortem_on():  # init(post_mortem=True): pause where it raised
                    debugger.post_mortem(error)
                if isinstance(exc, GeneratorRaised):
                    if type(exc.partial) is not list:  # dynamic: its refs, the error last
                        result = exc.partial
                        break
                    short = exc.partial
                failed = error_of(name, error)
                if short:  # the items it yielded fill the first returns, as in Ray
                    _note(session, task_id, name, 0, started, loaded, _wall(), _wall(),
                          _error_text(error), retries, 0, transfers)
                    try:
                        kept = tuple(backend.encode(part) for part in short)
                    except SerializationError:
                        kept = ()
                    return kept + (failed,) * (num_returns - len(kept))
                now = _wall()
                _note(session, task_id, name, 0, started, loaded, now, now, _error_text(error),
                      retries, 0, transfers)
                if num_returns == 1 and reply_to is not None:
                    send_reply(reply_to, task_id, failed, 0)
                return failed if num_returns == 1 else (failed,) * num_returns
    finally:
        current.task, current.session, current.retry_delay_s = previous
        _DEBUG_CALL.reset(debug_call)
        if cluster_output.pending:  # what it printed leaves before its result
            cluster_output.end_call(task_id)
        del args, kwargs  # the task's refs die here, so the drain below can release them
        if ref_counter._released:  # borrowed objects this task no longer holds
            backend._drain()
        backend.confirm_borrows()  # those it still holds, before it ends (see there)
    finished = _wall()

    def kept_none(exc: Exception) -> Any:
        """The task ran, but its result cannot be kept (``exc``): the error, noted, for
        each of its returns (an unpicklable result is the task's error, as locally)."""
        _note(session, task_id, name, 0, started, loaded, finished, finished,
              _error_text(exc), retries, 0, transfers)
        failed = error_of(name, exc)
        if num_returns == 1 and reply_to is not None:
            send_reply(reply_to, task_id, failed, 0)
        return spread_failure(failed, num_returns)

    if num_returns == 1:
        # Refs inside the result live as long as the result's key (ExportedRefs).
        try:
            stored = backend.encode(result, _current_key(), session)
        except SerializationError as exc:
            return kept_none(exc)
        if type(stored) is WithRefs:  # the refs inside are held by the result now: drop
            del result  # this process's own, so only the result's key keeps them alive
            if ref_counter._released:
                backend._drain()
        size = stored_size(stored)
        _note(session, task_id, name, 0, started, loaded, finished, _wall(), None, retries,
              size, transfers)
        if reply_to is not None:  # (see cluster_replies: refs inside stay with the key)
            send_reply(reply_to, task_id, stored, size, type(stored) is not WithRefs)
        return stored
    if num_returns == 0:
        _note(session, task_id, name, 0, started, loaded, finished, finished, None, retries,
              0, transfers)
        return None
    try:
        parts = tuple(result)
    except TypeError:
        parts = ()
    if len(parts) != num_returns:
        return kept_none(ValueError(
            f"task {name} has num_returns={num_returns} but returned "
            f"{type(result).__name__} {result!r:.80}; return a sequence of "
            f"{num_returns} values"))
    try:
        stored = tuple(backend.encode(part) for part in parts)
    except SerializationError as exc:
        return kept_none(exc)
    _note(session, task_id, name, 0, started, loaded, finished, _wall(), None, retries,
          stored_size(stored, num_returns), transfers)
    main_key = _current_key()
    for index, part in enumerate(stored):
        if type(part) is WithRefs:  # held while the part's own key lives (cluster_holds)
            backend.holds.hold_inside(part, f"{main_key}-{index}", "forgotten")
    del result, parts  # this process's own refs to what is inside go now (as above)
    if ref_counter._released:
        backend._drain()
    return stored


def await_bridged(name: str) -> Any:
    """A bridge task (``cluster_tasks``): the stored result of an actor call, once its
    caller has set the Variable ``name`` to its key; seceded while it waits."""
    from distributed import Variable, get_client, rejoin, secede

    secede()  # waiting for a caller holds no slot
    try:
        variable = Variable(name, client=get_client())
        value = variable.get().result()
        variable.delete()
    finally:
        rejoin()
    return value


def _current_key() -> Any:
    """The key of the task running in this worker thread (None outside one)."""
    try:
        from distributed import get_worker

        return get_worker().get_current_task()
    except (ValueError, AttributeError):
        return None


def pick(values: tuple[Any, ...], index: int) -> Any:
    """The ``index``-th of a task's several returns (its own key, its own ref)."""
    return values[index]


_backend: Any = None
_backend_lock = threading.Lock()

#: Why a Dask worker in the driver's own process is refused (at ``init``, or when one
#: joins later and a task reaches it): the worker's backend would take over the API and
#: the process's one ``RefCounter`` from the driver's, whose objects would then never be
#: released in the cluster (a ``LocalCluster(processes=False)`` kept every result's
#: future).
WORKER_IN_DRIVER = (
    "lightwork's distributed backend needs the Dask workers in processes of their own, "
    "but a worker of this cluster runs inside the driver's process (a LocalCluster or "
    "Client made with processes=False): the driver and the worker would share one count "
    "of each object's refs, and objects would never be freed. Start the workers as "
    "processes (processes=True, LocalCluster's default; or init(address='local-cluster')), "
    "or call lightwork.init() without an address to run on this machine alone."
)


def worker_backend() -> Any:
    """This worker process's backend, made (and given to the API) on its first task."""
    global _backend
    backend = _backend
    if backend is None:
        with _backend_lock:
            if _backend is None:
                from lightwork.engines.distributed.backend import DistributedBackend
                from lightwork.kernel import backend as kernel_backend

                installed = kernel_backend.installed()
                if installed is not None and installed.in_driver:  # a worker joined later
                    raise RuntimeError(WORKER_IN_DRIVER)
                _backend = DistributedBackend(None, in_driver=False)
                kernel_backend.install(_backend)
            backend = _backend
    return backend


def encode(value: Any, keys_of: Any) -> Any:
    """``value`` as stored: itself, or a :class:`WithRefs` if refs are inside it."""
    if type(value) in _PLAIN_TYPES:
        return value
    with collecting_refs() as ids:
        payload = pickle_value(value)
    if not ids:
        return value
    return WithRefs(payload, keys_of(ids))


# ------------------------------------------------------- what a worker holds, per session
class SessionFutures(dict):
    """A worker process's ``futures`` (object id -> future), each tagged with the driver
    session of the task or actor call that made or borrowed it (``current.session`` at
    the time; 0 outside one, e.g. a stream consumer's thread), so a driver can list the
    objects and actors its session holds on the workers (:func:`held_refs`). A worker
    process serves every driver of its cluster, so the tag is what tells them apart."""

    __slots__ = ("session_of",)

    def __init__(self) -> None:
        super().__init__()
        self.session_of: dict[int, int] = {}

    def __setitem__(self, object_id: int, future: Any) -> None:
        dict.__setitem__(self, object_id, future)
        self.session_of[object_id] = getattr(current, "session", 0)

    def setdefault(self, object_id: int, future: Any = None) -> Any:
        if object_id not in self:
            self[object_id] = future
        return dict.__getitem__(self, object_id)

    def pop(self, object_id: int, *default: Any) -> Any:
        self.session_of.pop(object_id, None)
        return dict.pop(self, object_id, *default)

    def __delitem__(self, object_id: int) -> None:
        self.session_of.pop(object_id, None)
        dict.__delitem__(self, object_id)

    def clear(self) -> None:
        self.session_of.clear()
        dict.clear(self)

    def tag(self, object_ids: Any, session: int) -> None:
        """Tag the entries of ``object_ids`` that are here with ``session``."""
        for object_id in object_ids:
            if object_id in self:
                self.session_of[object_id] = session


class Exported:
    """The refs inside one task result this worker stored (``exported_by_key``): held
    while that result lives (``cluster_plugin.ExportedRefs``), and listed by the driver
    of ``session`` as captured in it (:func:`held_refs`)."""

    __slots__ = ("refs", "session")

    def __init__(self, session: int) -> None:
        self.session = session
        self.refs: dict[int, tuple[Any, int]] = {}  # object id -> (future, task id)


def held_refs(dask_worker: Any = None, session: int = 0, with_refs: bool = True) -> dict[str, Any]:
    """The refs (unless not ``with_refs``) and the actors that tasks and actor calls of
    ``session`` hold in this worker process, and the refs inside the results its tasks
    stored here (``captured``: [object id, key, task id, the result's key]); run by
    ``client.run``, read by ``cluster_state``."""
    backend = _backend
    if backend is None:  # this worker ran no lightwork task yet
        return {"pid": os.getpid(), "prefix": None, "refs": [], "actors": [], "captured": []}
    futures = backend.futures
    tags = getattr(futures, "session_of", {})
    refs = []
    for object_id, future in list(futures.items()) if with_refs else ():
        if tags.get(object_id) != session:
            continue
        done = getattr(future, "done", None)
        refs.append([object_id, getattr(future, "key", None), backend.task_ids.get(object_id, 0),
                     bool(done()) if done is not None else True])
    actors = []
    for actor_id, owned in backend.actors.owned_actors():
        future = futures.get(actor_id)
        if tags.get(actor_id) != session or future is None:
            continue  # another session's, or no handle left in this process
        actors.append({"actor_id": actor_id, "class_name": owned.class_name,
                       "key": getattr(future, "key", None), "restarts": owned.restarts,
                       "max_restarts": owned.max_restarts, "restarting": owned.restarting,
                       "dead": owned.dead, "killed": backend.actors.was_killed(actor_id),
                       "status": getattr(future, "status", None)})
    captured = []
    with backend.lock:
        exported = [(key, dict(entry.refs)) for key, entry in backend.exported_by_key.items()
                    if entry.session == session] if with_refs else []
    for outer, inner in exported:
        captured += [[object_id, getattr(future, "key", None), task_id, str(outer)]
                     for object_id, (future, task_id) in inner.items()]
    return {"pid": os.getpid(), "prefix": backend._prefix, "refs": refs, "actors": actors,
            "captured": captured}

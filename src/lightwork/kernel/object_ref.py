"""ObjectRef and the per-process reference counter.

An ``ObjectRef`` is a cheap handle: an integer id whose high bits name the process that
made it (0 is the driver, ``n`` is worker ``n``) and whose low bits are that process's
counter, so any process can mint ids without asking anyone.

Ids are unique across the sessions of one driver process (``shutdown()`` then ``init()``):
the driver's counter and the worker numbers (:data:`DRIVER_IDS`, :data:`WORKER_NUMBERS`)
are never reset, so a new session never hands out an id an old ref still carries. A
session remembers where its ids start (:class:`IdFloor`); an id it does not know and that
is below its floor comes from an ended session, and using it raises
``SessionEndedError`` instead of finding another object. The check runs only when an id
is missing from the object table, so the hot path pays nothing for it.

Reference counting, per process: every live ``ObjectRef`` instance counts once in the
process's :class:`RefCounter`. ``__init__`` increments under a lock; ``__del__`` only
appends the id to a deque (it may run in any thread, at any allocation, even while that
lock is held, so it must not take locks or touch runtime state). The runtime drains the
deque at its next step and learns which ids this process no longer holds. The driver
uses that to free objects; a worker reports its first and last reference to an id to the
driver (a *borrow*), so the driver knows which objects workers still hold.

A ref pickled into another value records its id in the active :func:`collecting_refs`
context, so the runtime knows which objects a serialized value contains.

Out of band: a ref pickled outside every such context (the program's own ``pickle.dumps``
or ``cloudpickle.dumps``), or rebuilt from its id (``from_hex``, ``from_binary``,
``ObjectRef(bytes)``), goes to ``RefCounter.on_out_of_band``, the engine's hook. Nobody
can tell when such bytes are loaded again, so a pickled ref is kept (``pinned``) until the
session ends, as Ray keeps them, and the advisor names the line (``ref-out-of-band``).
lightwork's own pickling outside a context (a function's closure) is told apart by its
caller (``introspect.serializing_callsite``). The common paths pay nothing: a pickle in
a context never reaches the test, and ``__init__`` tests only its argument's type.
"""

from __future__ import annotations

import itertools
import threading
import types
from collections import deque
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lightwork.kernel.collector import untrack_hot

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

PROCESS_ID_SHIFT = 40

# Never reset in this process (see the module docstring): every session draws from them.
DRIVER_IDS = itertools.count(1)
WORKER_NUMBERS = itertools.count(1)


class IdFloor:
    """Where one session's ids start: anything minted below it belongs to an ended session."""

    __slots__ = ("first_object_id", "first_worker")

    def __init__(self) -> None:
        self.first_object_id = next(DRIVER_IDS)
        self.first_worker = next(WORKER_NUMBERS)

    def minted_before(self, object_id: int) -> bool:
        process = object_id >> PROCESS_ID_SHIFT
        if process == 0:
            return object_id < self.first_object_id
        return process < self.first_worker


def ended_session_message(what: str, running: bool) -> str:
    """Why ``what`` (an object ref or actor handle) cannot be used, and what to do."""
    if running:
        now = "This session cannot see it: "
    else:
        now = "No lightwork runtime is running now, and none was started for it: "
    return (
        f"{what} belongs to a lightwork session that has ended (shutdown() was called after "
        f"it was made), so its object or actor is gone. {now}objects and actors do not "
        "outlive their session. Call lightwork.init() if needed, then make it again in the "
        "new session (call the task again, put() the value again, or create the actor again)."
    )


class RefCounter:
    """Counts live ``ObjectRef`` instances of this process, by id."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._released: deque[int] = deque()
        self._lock = threading.Lock()
        # Called with an id whose count went 0 -> 1 through unpickling (a borrowed ref).
        self.on_borrow: Callable[[int], None] | None = None
        # Called when a release is queued and no wake-up is pending: the runtime's
        # wake-up, so objects are freed promptly even while the program makes no calls.
        self.on_first_release: Callable[[], None] | None = None
        # A wake-up was asked for and no drain has begun since. Set by release_later,
        # cleared by drain before it looks at the queue: a release queued while another
        # thread drains is either taken by that drain or wakes a new one. (Testing
        # whether the queue was empty instead could miss: a drain emptying the queue
        # between that test and the append left the release waiting for the next drain.)
        self._wake_pending = False
        #: holds(object_id): whether a live ref counts (a re-borrow may follow a drain
        #: that reported it gone); the dict's own test, without a Python call per id.
        self.holds: Callable[[int], bool] = self._counts.__contains__
        # Called with a ref pickled outside lightwork's serializer (outside every
        # ``collecting_refs`` block: ``how`` "pickle") or rebuilt from its id ("hex":
        # ``from_hex``, ``from_binary``, ``ObjectRef(bytes)``): the engine's, which pins
        # what the user pickled and tells the advisor. None: nobody watches.
        self.on_out_of_band: Callable[[ObjectRef, str], object] | None = None
        # Refs pickled out of band, kept alive until the session ends: nothing can tell
        # when the bytes are loaded again (Ray pins them for the process's life too).
        self.pinned: dict[int, ObjectRef] = {}

    def add(self, object_id: int, borrowed: bool) -> None:
        with self._lock:
            count = self._counts.get(object_id)
            self._counts[object_id] = 1 if count is None else count + 1
        if count is None and borrowed and self.on_borrow is not None:
            self.on_borrow(object_id)

    def release_later(self, object_id: int) -> None:
        self._released.append(object_id)
        if not self._wake_pending:
            self._wake_pending = True
            if self.on_first_release is not None:
                self.on_first_release()

    def rearm(self) -> bool:
        """Before a drainer sleeps: the next release calls ``on_first_release`` again;
        return whether releases are queued already (they will wake no one: drain them)."""
        self._wake_pending = False
        return bool(self._released)

    def drain(self) -> list[int]:
        """Apply pending releases; return the ids this process no longer references."""
        self._wake_pending = False
        if not self._released:
            return []
        gone = []
        with self._lock:
            released = self._released
            counts = self._counts
            while released:
                object_id = released.popleft()
                count = counts[object_id] - 1
                if count:
                    counts[object_id] = count
                else:
                    del counts[object_id]
                    gone.append(object_id)
        return gone


    def reset(self) -> None:
        self.pinned.clear()
        with self._lock:
            self._counts.clear()
            self._released.clear()
            self._wake_pending = False


ref_counter = RefCounter()


def fresh_ref(object_id: int) -> ObjectRef:
    """The first ref to ``object_id``, an id this process minted just now (a call's
    return): counted without the counter's lock, which guards a count's read and write
    against another thread's on the same id; no other thread can hold, copy or release
    an id nobody was given yet, and one dict store is atomic. This skips ``__init__``,
    the lock and a dict read on every task submitted."""
    ref = _new_instance(ObjectRef)
    ref._id = object_id
    ref_counter._counts[object_id] = 1
    if untrack_hot is not None:  # it holds an int: out of the collector (collector.py)
        untrack_hot(ref)
    return ref


_new_instance = object.__new__

_collector = threading.local()


@contextmanager
def collecting_refs() -> Generator[list[int], None, None]:
    """Collect the ids of refs pickled inside this block (the refs a value contains)."""
    previous = getattr(_collector, "ids", None)
    ids: list[int] = []
    _collector.ids = ids
    try:
        yield ids
    finally:
        _collector.ids = previous


class ObjectRef:
    """A reference to an object in the lightwork object store.

    Returned by ``f.remote()`` and ``put()``. Hashable, printable and picklable (a ref
    inside an argument or a result is borrowed). ``get(ref)`` fetches the value;
    ``ref.future()`` gives a ``concurrent.futures.Future``, ``ref.as_future()`` an
    ``asyncio.Future``; ``await ref`` works in asyncio. ``ObjectRef[T]`` annotates a ref
    to a ``T``, as in Ray.
    """

    __slots__ = ("_id", "__weakref__")
    __class_getitem__: classmethod[Any, Any, types.GenericAlias] = classmethod(types.GenericAlias)

    def __init__(self, object_id: int | bytes, *, _borrowed: bool = False) -> None:
        if type(object_id) is not int:  # the user's: Ray's ObjectRef(binary) (one test)
            try:
                object_id, _borrowed = _id_of(object_id), True
            except Exception:
                self.__class__ = _Unbuilt  # (its __del__ would release an id never counted)
                raise
            self._id = object_id
            ref_counter.add(object_id, _borrowed)
            _rebuilt(self)
            return
        self._id = object_id
        ref_counter.add(object_id, _borrowed)

    @classmethod
    def from_hex(cls, hex_id: str) -> ObjectRef:
        """The ref whose :meth:`hex` is ``hex_id`` (as Ray's). Rebuilding refs from
        their ids is Ray's anti-pattern "serializing ObjectRefs out of band": the object
        lives only as long as some ref to it, which a string is not; pass the ref."""
        if not isinstance(hex_id, str):
            raise TypeError(f"ObjectRef.from_hex() takes the str ref.hex() returned, got "
                            f"{type(hex_id).__name__}")
        try:
            binary = bytes.fromhex(hex_id)
        except ValueError:
            raise ValueError(f"ObjectRef.from_hex(): {hex_id!r} is not a hex id; pass "
                             "what ref.hex() returned") from None
        return cls(binary)

    @classmethod
    def from_binary(cls, binary: bytes) -> ObjectRef:
        """The ref whose :meth:`binary` is ``binary`` (see :meth:`from_hex`)."""
        return cls(binary)

    def __del__(self) -> None:
        ref_counter.release_later(self._id)

    @property
    def id(self) -> int:
        return self._id

    def hex(self) -> str:
        return f"{self._id:020x}"

    def binary(self) -> bytes:
        return self._id.to_bytes(10, "big")

    def __repr__(self) -> str:
        return f"ObjectRef({self.hex()})"

    def __hash__(self) -> int:
        return hash(self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __copy__(self) -> ObjectRef:
        return self

    def __deepcopy__(self, memo: Any) -> ObjectRef:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        ids = getattr(_collector, "ids", None)
        if ids is not None:
            ids.append(self._id)
        elif ref_counter.on_out_of_band is not None:  # pickled by someone else
            ref_counter.on_out_of_band(self, "pickle")
        return (_rebuild_ref, (self._id,))

    def future(self) -> concurrent.futures.Future[Any]:
        """A ``concurrent.futures.Future`` that completes with the object's value."""
        from lightwork.kernel import backend

        return backend.current((self,)).future(self)

    def as_future(self) -> asyncio.Future[Any]:
        """An ``asyncio.Future`` of the object's value, on the current event loop.

        Each call makes a new future, so cancelling one (``asyncio.wait_for`` timing
        out) leaves the object, its task and any later ``await ref`` untouched.
        """
        import asyncio  # here: a worker's start-up should not pay for asyncio

        return asyncio.wrap_future(self.future())

    # -- the future protocol asyncio.wait() uses (add/remove_done_callback, done, ...) --
    # Python 3.11's asyncio.wait() no longer wraps awaitables in tasks: it calls these on
    # each element, so `await asyncio.wait([ref, ...])` (Ray's asyncio guide) works; the
    # sets it returns hold the refs. Callbacks live in _DONE_CALLBACKS, not on the ref:
    # refs stay two slots.

    def add_done_callback(self, fn: Callable[[ObjectRef], Any]) -> None:
        """Call ``fn(ref)`` once the object is ready (its value or its error): on the
        running event loop if there is one where this is called, else in the thread that
        sees it complete."""
        import asyncio  # here: a worker's start-up should not pay for asyncio

        if not callable(fn):
            raise TypeError(f"add_done_callback() needs a callable, got {fn!r}")
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        entry = _DoneCallback(fn)
        with _callbacks_lock:
            _DONE_CALLBACKS.setdefault(self._id, []).append(entry)

        def deliver(_: object) -> None:
            with _callbacks_lock:
                if not entry.live:
                    return  # removed meanwhile
                entry.live = False
                _forget_callback(self._id, entry)
            if loop is None:
                fn(self)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(fn, self)

        self.future().add_done_callback(deliver)

    def remove_done_callback(self, fn: Callable[[ObjectRef], Any]) -> int:
        """Remove ``fn`` from the callbacks not yet called; return how many were removed."""
        with _callbacks_lock:
            entries = [e for e in _DONE_CALLBACKS.get(self._id, ()) if e.fn == fn and e.live]
            for entry in entries:
                entry.live = False
                _forget_callback(self._id, entry)
        return len(entries)

    def done(self) -> bool:
        """Whether the object is ready now (never blocks)."""
        from lightwork.kernel import backend

        return bool(backend.current((self,)).wait([self._id], 1, 0))

    def cancelled(self) -> bool:
        """Always False: a ref is not a future that can be cancelled (``cancel(ref)``
        cancels its task, and the ref then raises ``TaskCancelledError``)."""
        return False

    def result(self, timeout: float | None = None) -> Any:
        """The object's value, as ``get(ref, timeout=timeout)``."""
        return self.future().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error ``get(ref)`` would raise, or None when it holds a value."""
        return self.future().exception(timeout)

    def __await__(self) -> Generator[Any, None, Any]:
        import asyncio  # here: a worker's start-up should not pay for asyncio

        return asyncio.wrap_future(self.future()).__await__()

    def task_id(self) -> int:
        from lightwork.kernel import backend

        return backend.current((self,)).task_id_of(self._id)


class _DoneCallback:
    __slots__ = ("fn", "live")

    def __init__(self, fn: Callable[[ObjectRef], Any]) -> None:
        self.fn = fn
        self.live = True


_DONE_CALLBACKS: dict[int, list[_DoneCallback]] = {}  # object id -> callbacks not yet called
_callbacks_lock = threading.Lock()


def _forget_callback(object_id: int, entry: _DoneCallback) -> None:
    """Drop ``entry`` from the table (the caller holds ``_callbacks_lock``)."""
    entries = _DONE_CALLBACKS.get(object_id)
    if entries is not None:
        entries.remove(entry)
        if not entries:
            del _DONE_CALLBACKS[object_id]


def _rebuild_ref(object_id: int) -> ObjectRef:
    return ObjectRef(object_id, _borrowed=True)


class _Unbuilt(ObjectRef):
    """What an ``ObjectRef`` whose ``__init__`` refused its id becomes: it counted no id,
    so it releases none."""

    __slots__ = ()

    def __del__(self) -> None:
        pass


BINARY_SIZE = 10  # bytes of ``ObjectRef.binary()``


def _id_of(binary: Any) -> int:
    """The id in a ref's ``binary()`` (or ``bytes.fromhex(ref.hex())``)."""
    if not isinstance(binary, (bytes, bytearray)):
        raise TypeError(f"ObjectRef() takes the bytes ref.binary() returned, got "
                        f"{type(binary).__name__}; refs come from f.remote() and put(), "
                        "and travel by being passed (as an argument, in a list or dict, "
                        "or returned)")
    if len(binary) != BINARY_SIZE:
        raise ValueError(f"ObjectRef(): {len(binary)} bytes is not a lightwork ref's id "
                         f"({BINARY_SIZE} bytes, what ref.binary() returns); an id from "
                         "another runtime (Ray's are 28) names nothing here")
    return int.from_bytes(binary, "big")


def keep_out_of_band(ref: ObjectRef, how: str) -> tuple[str, int, str] | None:
    """What every engine does with a ref seen by ``RefCounter.on_out_of_band``: the
    user's line that pickled or rebuilt it, or None when lightwork's own code pickles
    it; a ref the user pickled is kept (``RefCounter.pinned``) until the session ends."""
    from lightwork.kernel.introspect import serializing_callsite

    site = serializing_callsite()
    if site is not None and how == "pickle":
        ref_counter.pinned.setdefault(ref._id, ref)
    return site


def _rebuilt(ref: ObjectRef) -> None:
    hook = ref_counter.on_out_of_band
    if hook is not None:
        hook(ref, "hex")


ObjectRef.__module__ = "lightwork"

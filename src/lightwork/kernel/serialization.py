"""Turning values into stored objects and back.

A value is pickled with protocol 5: by the standard pickler when everything in it is
importable by name in a worker (several times quicker), else by cloudpickle (functions
and classes from ``__main__``, lambdas, local definitions). Buffers of at least
``OUT_OF_BAND_MIN`` bytes (numpy arrays, bytes-likes) are taken out of band; a large
``bytes`` value, which pickle keeps in band, is pickled as ``bytes(<buffer>)`` with its
buffer out of band (``_bytes_out_of_band``). The result is
a :class:`Stored` object in one of two forms:

* inline: the pickle and its few out-of-band buffers travel inside protocol frames;
  used when the whole value is smaller than ``SHARED_MEMORY_MIN``;
* shared memory: the pickle and the buffers are written once into a file in the
  session's directory under ``/dev/shm``; any process of the session maps it read-only
  and unpickles with buffers that point into the mapping, so a 160 MB array is read
  without a copy (and comes back read-only, as in Ray).

Who writes a segment: the driver writes into recycled segments it keeps mapped and
faulted in (``store.py``'s :class:`SegmentStore`, any object with a ``write`` method);
a worker, once the store granted it room (``worker_calls.SharedMemoryWriter``), writes with
``pwrite`` over a recycled segment (its pages exist: no allocation) or into a new
file; a new segment is written with ``pwrite`` into a new file (``write_segment``). A
full ``/dev/shm`` then fails that ``pwrite`` with ENOSPC, raised as
:class:`ObjectStoreFullError`: never a SIGBUS, which only a store through a mapping
into unallocated pages can cause, and every mapping written to here covers pages a
completed ``pwrite`` allocated (workers write recycled segments with ``pwrite`` too,
never through a mapping). ``posix_fallocate`` first would
say the same a moment sooner but costs a second pass over the pages, for no gain here,
so the writers keep ``pwrite`` (measured: see bench/HOTPATH.md, "Shared-memory
writes").

Readers: every process maps a segment once (:data:`MAPS`, its :class:`MappedSegments`)
and hands out views of that mapping. A segment may be reused for a new object only once
no reader anywhere still holds a view into it: ``MappedSegments.forget`` says so for
this process (an ``mmap`` refuses to close while a view exists), and workers report
which segments they mapped (``on_map``, at once) and which they let go
(``release_unused``, after each task) so the driver can tell for theirs. A segment the
store moved to disk (spilled) is found under the same name in ``spill_dir``: a reader
that was sent the old path before the move opens the spill file instead, and keeps that
mapping under the spill file's path (the name the store frees it by, so a get racing a
spill does not keep the mapping until shutdown).

The segment file belongs to the driver's store, which recycles or unlinks it when the
object is freed; mappings that readers still hold stay valid until they are dropped. The
whole directory is removed at shutdown, or by the fork server if the driver dies.

Layout of a segment file: a pickled header (the pickle's length and the offset and length
of each buffer), then the pickle, then each buffer at a 64-byte aligned offset.
"""

from __future__ import annotations

import errno
import mmap
import os
import pickle
import struct
import sys
import threading
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, final

import cloudpickle

from lightwork.kernel.object_ref import collecting_refs
from lightwork.kernel import pickler

OUT_OF_BAND_MIN = 64 * 1024
SHARED_MEMORY_MIN = 256 * 1024
_ALIGN = 64
_LAYOUT = struct.Struct("<Q")
#: Buffers from this size are copied by numpy (when loaded), which releases the GIL, so
#: the I/O thread goes on while a large value is written.
_GIL_FREE_COPY_MIN = 1 << 20
#: Buffers from this size are copied by two threads, each copying half: one core's
#: ``memcpy`` does not fill the memory bandwidth; four threads copy no faster than two
#: (measured: see bench/HOTPATH.md, "Shared-memory writes").
_SPLIT_COPY_MIN = 16 << 20


@final
@dataclass(slots=True)
class Stored:
    """A serialized value: inline (``data``, ``buffers``) or in a segment (``path``)."""

    data: bytes = b""
    buffers: tuple[bytes, ...] = ()
    path: str | None = None
    size: int = 0
    contained: tuple[int, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Stored, (self.data, self.buffers, self.path, self.size, self.contained))


def bare(stored: Stored) -> Stored | bytes:
    """How ``stored`` travels in a frame: its pickle alone when that is all it is (inline,
    no out-of-band buffers, no refs inside), else the ``Stored`` itself.

    Frames carry a task's arguments and a task's result this way (``protocol.py``): a
    ``Stored`` is pickled through ``__reduce__`` (a Python call) and rebuilt by a class
    call, where ``bytes`` are copied by the pickler in C. Whoever keeps the value turns
    it back with :func:`unbare`; :func:`loads` takes either.
    """
    if stored.path is None and not stored.buffers and not stored.contained:
        return stored.data
    return stored


def unbare(item: Stored | bytes) -> Stored:
    """The ``Stored`` a frame's item (:func:`bare`) stands for."""
    if type(item) is Stored:
        return item
    return Stored(item, (), None, len(item), ())


class SegmentWriter(Protocol):
    """Where a large value goes: writes the segment, returns the path readers open."""

    def write(self, data: bytes, raws: list[memoryview]) -> str: ...


#: Where ``serialize`` puts a large value: a writer, the path of a new segment file, or
#: None to keep every value inline.
SegmentTarget = SegmentWriter | str | None


class SerializationError(TypeError):
    """A value could not be pickled; the message names what could not be."""


def dumps(value: Any) -> tuple[bytes, list[pickle.PickleBuffer], list[int]]:
    """Pickle ``value``; return the pickle, its out-of-band buffers and contained ref ids."""
    buffers: list[pickle.PickleBuffer] = []

    def keep_large_out_of_band(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes >= OUT_OF_BAND_MIN:
            buffers.append(buf)
            return False
        return True

    with collecting_refs() as ids:
        data = dumps_by_reference(value, keep_large_out_of_band)
        if data is None:
            buffers.clear()
            ids.clear()
            try:
                data = pickler.dumps(value, protocol=5,
                                         buffer_callback=keep_large_out_of_band)
            except Exception as exc:
                raise SerializationError(describe_unpicklable(value, exc)) from exc
    return data, buffers, ids


def pickle_value(value: Any) -> bytes:
    """``value`` pickled in band (the cluster backend's arguments and results), or
    ``SerializationError`` naming what in it could not be, as ``dumps`` says it."""
    try:
        return pickler.dumps(value)
    except Exception as exc:
        raise SerializationError(describe_unpicklable(value, exc)) from exc


def dumps_by_reference(value: Any, buffer_callback: Any = None) -> bytes | None:
    """The plain pickle of ``value``, or None where only cloudpickle gets it right.

    The standard pickler is several times quicker than cloudpickle's pure-Python
    reducer hooks, and gives the same bytes' meaning whenever everything in ``value`` is
    importable by name in the worker. It is not for: anything from ``__main__`` (the
    workers' ``__main__`` is not the driver's: it would pickle "by reference" to nothing
    there), lambdas and local functions or classes (it refuses them), and modules
    registered with ``cloudpickle.register_pickle_by_value``.
    """
    try:
        data = pickle.dumps(value, protocol=5, buffer_callback=buffer_callback)
    except Exception:  # noqa: BLE001 - not picklable by name: cloudpickle decides
        return None
    # A global is pickled as its module's name and its own: a value that may name one
    # of these modules goes to cloudpickle (a false alarm only costs time).
    if b"__main__" in data or any(
            name.encode() in data for name in cloudpickle.list_registry_pickle_by_value()):
        return None
    return data


def describe_unpicklable(value: Any, exc: BaseException) -> str:
    """Say which part of ``value`` cannot be pickled, as precisely as we can find it: for
    a function or class, the global or captured variable it uses that cannot be."""
    captured = _unpicklable_capture(value, depth=0)
    if captured is not None:
        path, culprit = captured
        return (
            f"cannot serialize {_describe(value)}: it uses {path}, a "
            f"{type(culprit).__name__} object {_short_repr(culprit)}, which cannot be pickled "
            f"({type(exc).__name__}: {exc}). Code sent to a worker travels with every "
            "global and captured value it uses: create such an object inside the task "
            "(or in an actor, which keeps it between calls), instead of using it from "
            "outside."
        )
    culprit = _find_unpicklable(value, depth=0)
    what = f"{type(culprit).__name__} object {_short_repr(culprit)}" if culprit is not None else (
        f"{type(value).__name__} object {_short_repr(value)}"
    )
    return (
        f"cannot serialize {what}: {type(exc).__name__}: {exc}. Values sent to or from "
        "tasks must be picklable by cloudpickle; create such objects inside the task, or "
        "hold them in an actor, instead of passing them."
    )


def _describe(value: Any) -> str:
    if isinstance(value, type):
        return f"class {value.__qualname__}"
    if isinstance(value, types.FunctionType):
        return f"function {value.__qualname__}"
    return f"{type(value).__name__} object {_short_repr(value)}"


def _unpicklable_capture(value: Any, depth: int) -> tuple[str, Any] | None:
    """The first global, captured variable or default of function or class ``value``
    that cannot be pickled: ("the global `lock`", its value), following functions it
    uses (``depth`` levels down), or None if ``value`` is neither or none is found."""
    if depth > 2:
        return None
    if isinstance(value, type):
        for attribute, member in vars(value).items():
            function = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(function, types.FunctionType):
                found = _unpicklable_capture(function, depth)
                if found is not None:
                    return f"{found[0]} (in {value.__name__}.{attribute})", found[1]
        return None
    if not isinstance(value, types.FunctionType):
        return None
    code = value.__code__
    used: list[tuple[str, str, Any]] = []
    for name, cell in zip(code.co_freevars, value.__closure__ or ()):
        try:
            used.append(("the captured variable", name, cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    names: list[str] = []
    codes = [code]
    while codes:  # the globals of nested functions and comprehensions count too
        inner = codes.pop()
        names.extend(inner.co_names)
        codes.extend(c for c in inner.co_consts if isinstance(c, types.CodeType))
    module_globals = value.__globals__
    seen = set()
    for name in names:
        if name in module_globals and name not in seen:
            seen.add(name)
            used.append(("the global", name, module_globals[name]))
    for index, default in enumerate((*(value.__defaults__ or ()),
                                     *(value.__kwdefaults__ or {}).values())):
        used.append(("a default argument", str(index), default))
    for kind, name, member in used:
        if isinstance(member, types.ModuleType):
            continue  # pickled by name
        try:
            pickler.dumps(member)
        except Exception:  # noqa: BLE001 - this is the one
            deeper = _unpicklable_capture(member, depth + 1)
            label = f"{kind} `{name}`" if kind != "a default argument" else kind
            if deeper is not None:
                return f"{label}, which uses {deeper[0]}", deeper[1]
            return label, member
    return None


def _find_unpicklable(value: Any, depth: int) -> Any:
    if depth > 4:
        return None
    children: list[Any] = []
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        children = list(vars(value).values())
    for child in children:
        try:
            pickler.dumps(child)
        except Exception:
            return _find_unpicklable(child, depth + 1) or child
    return None if depth else (value if not children else None)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


SCALARS = (int, float, str, bool, type(None))


def serialize(value: Any, segment_path: SegmentTarget) -> Stored:
    """Serialize ``value``; write it to ``segment_path`` (see ``SegmentTarget``) if large."""
    kind = type(value)
    if kind in SCALARS:  # the common tiny result: skip cloudpickle's set-up
        data = pickle.dumps(value, protocol=5)
        return Stored(data, (), None, len(data), ())
    if kind is bytes and len(value) >= OUT_OF_BAND_MIN:
        return store(*_bytes_out_of_band(value), [], segment_path)
    data, buffers, ids = dumps(value)
    return store(data, buffers, ids, segment_path)


class _OutOfBandBytes:
    """Pickles a ``bytes`` as ``bytes(<out-of-band buffer>)``."""

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (bytes, (pickle.PickleBuffer(self.value),))


def _bytes_out_of_band(value: bytes) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """A large ``bytes`` the way an array is stored: its buffer out of band.

    Pickle 5 keeps ``bytes`` in band: the pickler copies it into the pickle (growing its
    buffer as it goes), the ``__main__`` check scans it, and the segment writer copies
    the pickle once more; 1 GiB took 7 s where an array of the same size takes 0.5 s.
    Out of band it is written straight from the value into the segment, and read back
    with one copy (``bytes`` owns its memory, so it cannot point into the mapping).
    """
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(_OutOfBandBytes(value), protocol=5, buffer_callback=buffers.append)
    return data, buffers


def store(
    data: bytes, buffers: list[pickle.PickleBuffer], ids: list[int], segment_path: SegmentTarget
) -> Stored:
    raws = [buf.raw() for buf in buffers]
    size = len(data) + sum(raw.nbytes for raw in raws)
    contained = tuple(ids)
    if segment_path is None or size < SHARED_MEMORY_MIN:
        return Stored(data, tuple(bytes(raw) for raw in raws), None, size, contained)
    if isinstance(segment_path, str):
        write_segment(segment_path, data, raws)
        path = segment_path
    else:
        path = segment_path.write(data, raws)
    return Stored(b"", (), path, size, contained)


@dataclass(slots=True)
class Layout:
    """Where each part of a value goes in its segment (see the module docstring)."""

    prefix: bytes  # the header's length and the header
    body_start: int  # offset of the first buffer
    offsets: list[tuple[int, int]]  # (offset from body_start, length) of each buffer
    total: int  # bytes the segment needs


def layout(data: bytes, raws: list[memoryview]) -> Layout:
    offsets = []
    position = 0
    for raw in raws:
        offsets.append((position, raw.nbytes))
        position = _aligned(position + raw.nbytes)
    header = pickle.dumps((len(data), offsets), protocol=5)
    prefix = _LAYOUT.pack(len(header)) + header
    body_start = _aligned(len(prefix) + len(data))
    return Layout(prefix, body_start, offsets, max(body_start + position, 1))


def write_into(view: memoryview, plan: Layout, data: bytes, raws: list[memoryview]) -> None:
    """Copy a value into ``view`` (a writable mapping at least ``plan.total`` long)."""
    start = len(plan.prefix)
    view[:start] = plan.prefix
    view[start : start + len(data)] = data
    numpy = sys.modules.get("numpy")  # its copy lets go of the GIL; never imported here
    for (offset, length), raw in zip(plan.offsets, raws):
        begin = plan.body_start + offset
        if numpy is not None and length >= _GIL_FREE_COPY_MIN:
            destination = numpy.frombuffer(view[begin : begin + length], dtype=numpy.uint8)
            _copy_without_gil(numpy, destination, numpy.frombuffer(raw, dtype=numpy.uint8))
            del destination
        else:
            view[begin : begin + length] = raw


def _copy_without_gil(numpy: Any, destination: Any, source: Any) -> None:
    """``numpy.copyto``; a large buffer in two halves, the first on a helper thread."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if source.nbytes < _SPLIT_COPY_MIN or (cpus or 1) < 2:
        numpy.copyto(destination, source)
        return
    half = source.nbytes // 2 // mmap.PAGESIZE * mmap.PAGESIZE
    failed: list[BaseException] = []

    def copy_first_half() -> None:
        try:
            numpy.copyto(destination[:half], source[:half])
        except BaseException as exc:  # noqa: BLE001 - raised in the writer below
            failed.append(exc)

    helper = threading.Thread(target=copy_first_half, name="lightwork-copy", daemon=True)
    helper.start()
    try:
        numpy.copyto(destination[half:], source[half:])
    finally:
        helper.join()
    if failed:  # never a value with half of it missing
        raise failed[0]


def write_segment(path: str, data: bytes, raws: list[memoryview], recycled: bool = False) -> int:
    """Write a value into a new segment file at ``path``; return the file's length.

    ``recycled``: ``path`` is a pooled segment the store handed out (its pages exist and
    nobody reads it): write over it in place, keeping its length.
    """
    plan = layout(data, raws)
    if recycled:
        fd = os.open(path, os.O_RDWR)
        try:
            _pwrite_all(fd, plan.prefix + data, 0)
            for (offset, _length), raw in zip(plan.offsets, raws):
                _pwrite_all(fd, raw, plan.body_start + offset)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        # A retried task (its worker died after writing) or a re-run that rebuilds a lost
        # result: replace the file; a reader's mapping keeps the old one's pages alive.
        os.unlink(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        # pwrite, not a writable mapping: tmpfs allocates each page as it is written
        # (no page fault per 4 KiB, no zeroing pass), and a full tmpfs is ENOSPC here.
        os.ftruncate(fd, plan.total)
        _pwrite_all(fd, plan.prefix + data, 0)
        for (offset, _length), raw in zip(plan.offsets, raws):
            _pwrite_all(fd, raw, plan.body_start + offset)
    except OSError as exc:
        os.close(fd)
        fd = -1
        _unlink_quietly(path)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise shared_memory_full(path, plan.total) from exc
        raise
    except BaseException:
        os.close(fd)
        fd = -1
        _unlink_quietly(path)
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    return plan.total


def shared_memory_full(path: str, size: int) -> Exception:
    from lightwork.kernel.exceptions import ObjectStoreFullError

    directory = os.path.dirname(path)
    return ObjectStoreFullError(
        f"no room for an object of {size:,} bytes in shared memory ({directory} has "
        f"{_free_bytes(directory):,} bytes free): other programs or sessions use it. Free "
        "objects you no longer need (drop their ObjectRefs), pass a smaller "
        "object_store_memory to init() so the store spills to disk sooner, or make "
        "/dev/shm larger.")


def segment_length(path: str) -> int:
    """Bytes of segment ``path`` that hold its value (a recycled segment may be longer)."""
    with open(path, "rb") as file:
        (header_len,) = _LAYOUT.unpack(file.read(_LAYOUT.size))
        data_len, offsets = pickle.loads(file.read(header_len))
    body_start = _aligned(_LAYOUT.size + header_len + data_len)
    end = max((offset + length for offset, length in offsets), default=0)
    return body_start + end if offsets else _LAYOUT.size + header_len + data_len


def _free_bytes(directory: str) -> int:
    try:
        stats = os.statvfs(directory)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    written = 0
    while written < view.nbytes:
        written += os.pwrite(fd, view[written:], offset + written)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class MappedSegments:
    """This process's read-only mappings of segments: one per segment, shared by all views.

    Only the ``mmap`` objects are kept, never a view of them: whether one can be closed
    then says exactly whether a value read from it is still alive. ``on_map`` (set in
    workers) hears of each new mapping before any view of it exists. ``spill_dir`` is
    where the store moves segments it spills; a path that is gone from shared memory is
    looked for there.
    """

    def __init__(self) -> None:
        self._mappings: dict[str, mmap.mmap] = {}
        # Every mapping made, while it lives: a value read from one still points into it
        # after ``forget`` let go of its path (the advisor's ``holds``).
        self._made: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.on_map: Callable[[str], None] | None = None
        self.spill_dir: str | None = None

    def parts(self, path: str) -> tuple[memoryview, list[memoryview]]:
        """The pickle and the buffers of the value in segment ``path``, as views of it."""
        with self._lock:  # views are taken under the lock: release_unused may close it
            mapping = self._mappings.get(path)
            if mapping is None:
                # Keyed by the file actually mapped: a segment spilled on the way here is
                # the spill file, which the store frees (``forget``) under that name.
                key, mapping = self._map(path)
                known = self._mappings.get(key)
                if known is not None:
                    mapping.close()
                    mapping = known
                else:
                    self._mappings[key] = mapping
                    self._made.add(mapping)
                    if self.on_map is not None:
                        self.on_map(key)
            view = memoryview(mapping)
            try:
                (header_len,) = _LAYOUT.unpack_from(view, 0)
                start = _LAYOUT.size
                data_len, offsets = pickle.loads(view[start : start + header_len])
                start += header_len
                data = view[start : start + data_len]
                body_start = _aligned(start + data_len)
                buffers = [view[body_start + offset : body_start + offset + length]
                           for offset, length in offsets]
            finally:
                view.release()  # the slices keep the mapping exported, the whole view not
            return data, buffers

    def _map(self, path: str) -> tuple[str, mmap.mmap]:
        """Map ``path`` read-only, or its spill file if it moved: (what was mapped, map)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            if self.spill_dir is None:
                raise
            path = os.path.join(self.spill_dir, os.path.basename(path))
            fd = os.open(path, os.O_RDONLY)
        try:
            return path, mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def __contains__(self, path: object) -> bool:
        return path in self._mappings

    def holds(self, mapping: object) -> bool:
        """Whether ``mapping`` is one this process made (a value read from the store
        points into it), kept or already forgotten."""
        with self._lock:
            return mapping in self._made

    def close_if_unviewed(self, path: str) -> bool:
        """Close ``path``'s mapping if nothing points into it; True if none is left open."""
        with self._lock:
            mapping = self._mappings.get(path)
            if mapping is None:
                return True
            if not _closed(mapping):
                return False
            del self._mappings[path]
            return True

    def __len__(self) -> int:
        return len(self._mappings)

    def forget(self, path: str) -> bool:
        """Stop keeping ``path`` mapped; True if no value read from it is still alive."""
        with self._lock:
            mapping = self._mappings.pop(path, None)
            return mapping is None or _closed(mapping)

    def release_unused(self) -> list[str]:
        """Close every mapping no value points into any more; return their paths."""
        with self._lock:
            closed = [path for path, mapping in self._mappings.items() if _closed(mapping)]
            for path in closed:
                del self._mappings[path]
        return closed

    def clear(self) -> None:
        with self._lock:
            self._mappings.clear()


def _closed(mapping: mmap.mmap) -> bool:
    try:
        mapping.close()  # refuses (BufferError) while any array or view points into it
    except BufferError:
        return False
    return True


#: This process's mappings (the driver's store and a worker's reports both read it).
MAPS = MappedSegments()


def loads(stored: Stored | bytes) -> Any:
    """The value of ``stored`` (or of a bare pickle: see :func:`bare`); arrays in a
    segment point into a read-only mapping.

    A segment is mapped once per process (:data:`MAPS`), and every ``get`` of it returns
    views of the same memory.
    """
    if type(stored) is not Stored:  # (Stored is final: mypy narrows both branches)
        return pickle.loads(stored)
    if stored.path is None:
        return pickle.loads(stored.data, buffers=stored.buffers)
    data, buffers = MAPS.parts(stored.path)
    return pickle.loads(data, buffers=buffers)

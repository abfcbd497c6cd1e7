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

The segment file belongs to the driver's object table, which unlinks it when the object
is freed; mappings that readers still hold stay valid until they are dropped. The whole
directory is removed at shutdown, or by the fork server if the driver dies.

Layout of a segment file: a pickled header (the pickle's length and the offset and length
of each buffer), then the pickle, then each buffer at a 64-byte aligned offset.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import cloudpickle

from lightwork._object_ref import collecting_refs

OUT_OF_BAND_MIN = 64 * 1024
SHARED_MEMORY_MIN = 256 * 1024
_ALIGN = 64
_LAYOUT = struct.Struct("<Q")


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
                data = cloudpickle.dumps(value, protocol=5,
                                         buffer_callback=keep_large_out_of_band)
            except Exception as exc:
                raise SerializationError(describe_unpicklable(value, exc)) from exc
    return data, buffers, ids


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
    """Say which part of ``value`` cannot be pickled, as precisely as we can find it."""
    culprit = _find_unpicklable(value, depth=0)
    what = f"{type(culprit).__name__} object {_short_repr(culprit)}" if culprit is not None else (
        f"{type(value).__name__} object {_short_repr(value)}"
    )
    return (
        f"cannot serialize {what}: {type(exc).__name__}: {exc}. Values sent to or from "
        "tasks must be picklable by cloudpickle; create such objects inside the task, or "
        "hold them in an actor, instead of passing them."
    )


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
            cloudpickle.dumps(child)
        except Exception:
            return _find_unpicklable(child, depth + 1) or child
    return None if depth else (value if not children else None)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_SCALARS = (int, float, str, bool, type(None))


def serialize(value: Any, segment_path: str | None) -> Stored:
    """Serialize ``value``; write it to ``segment_path`` if it is large."""
    kind = type(value)
    if kind in _SCALARS:  # the common tiny result: skip cloudpickle's set-up
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
    data: bytes, buffers: list[pickle.PickleBuffer], ids: list[int], segment_path: str | None
) -> Stored:
    raws = [buf.raw() for buf in buffers]
    size = len(data) + sum(raw.nbytes for raw in raws)
    contained = tuple(ids)
    if segment_path is None or size < SHARED_MEMORY_MIN:
        return Stored(data, tuple(bytes(raw) for raw in raws), None, size, contained)
    write_segment(segment_path, data, raws)
    return Stored(b"", (), segment_path, size, contained)


def write_segment(path: str, data: bytes, raws: list[memoryview]) -> None:
    offsets = []
    position = 0
    for raw in raws:
        offsets.append((position, raw.nbytes))
        position = _aligned(position + raw.nbytes)
    header = pickle.dumps((len(data), offsets), protocol=5)
    body_start = _aligned(_LAYOUT.size + len(header) + len(data))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        # pwrite, not a writable mapping: tmpfs then allocates pages without a page
        # fault per 4 KiB, which makes writing a large array about 1.5x faster.
        os.ftruncate(fd, max(body_start + position, 1))
        _pwrite_all(fd, _LAYOUT.pack(len(header)) + header + data, 0)
        for (offset, _length), raw in zip(offsets, raws):
            _pwrite_all(fd, raw, body_start + offset)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    written = 0
    while written < view.nbytes:
        written += os.pwrite(fd, view[written:], offset + written)


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def loads(stored: Stored, mappings: dict[str, memoryview] | None = None) -> Any:
    """The value of ``stored``; arrays in a segment point into a read-only mapping.

    With ``mappings`` (the driver's, owned by its object table), a segment is mapped once
    and every ``get`` of it returns views of the same memory.
    """
    if stored.path is None:
        return pickle.loads(stored.data, buffers=stored.buffers)
    view = mappings.get(stored.path) if mappings is not None else None
    if view is None:
        fd = os.open(stored.path, os.O_RDONLY)
        try:
            view = memoryview(mmap.mmap(fd, 0, prot=mmap.PROT_READ))
        finally:
            os.close(fd)
        if mappings is not None:
            mappings[stored.path] = view
    (header_len,) = _LAYOUT.unpack_from(view, 0)
    start = _LAYOUT.size
    data_len, offsets = pickle.loads(view[start : start + header_len])
    start += header_len
    data = view[start : start + data_len]
    body_start = _aligned(start + data_len)
    buffers = [view[body_start + offset : body_start + offset + length] for offset, length in offsets]
    return pickle.loads(data, buffers=buffers)

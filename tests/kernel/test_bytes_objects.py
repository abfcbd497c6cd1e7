"""Large ``bytes`` values are stored like arrays: their buffer out of band.

Pickle 5 keeps ``bytes`` in band, so a 1 GiB result was copied into the pickle, scanned
and copied again (7 s against 0.5 s for an array). The figures are in ``bench/``; these
tests pin the behaviour: the pickle of a large bytes holds no payload, and every size and
path (inline, shared memory, task result, argument, put) gives back equal ``bytes``.
"""

from __future__ import annotations

import pytest

import lightwork as ray
from lightwork.kernel import serialization
from lightwork.kernel.serialization import OUT_OF_BAND_MIN, SHARED_MEMORY_MIN


@pytest.fixture(scope="module", autouse=True)
def runtime(two_cpus):
    return two_cpus


def _payload(size: int) -> bytes:
    return bytes(range(256)) * (size // 256) + b"\x07" * (size % 256)


@pytest.mark.parametrize("size", [
    OUT_OF_BAND_MIN - 1, OUT_OF_BAND_MIN, SHARED_MEMORY_MIN - 1, SHARED_MEMORY_MIN, 3 << 20,
])
def test_bytes_round_trip_at_every_size(tmp_path, size):
    value = _payload(size)
    stored = serialization.serialize(value, str(tmp_path / "segment"))
    back = serialization.loads(stored)
    assert type(back) is bytes and back == value
    assert (stored.path is not None) == (stored.size >= SHARED_MEMORY_MIN)
    if size >= OUT_OF_BAND_MIN:
        # The pickle only names the rebuild; the payload is one out-of-band buffer, which
        # the segment writer writes straight from the value.
        inline = serialization.serialize(value, None)
        assert len(inline.data) < 256 and [len(b) for b in inline.buffers] == [size]


def test_a_bytes_subclass_keeps_its_type(tmp_path):
    class Tagged(bytes):
        pass

    value = Tagged(_payload(SHARED_MEMORY_MIN * 2))
    back = serialization.loads(serialization.serialize(value, str(tmp_path / "segment")))
    assert type(back) is Tagged and back == value


@ray.remote
def make(size: int) -> bytes:
    return _payload(size)


@ray.remote
def length_and_ends(value: bytes) -> tuple:
    return type(value).__name__, len(value), value[:3], value[-3:]


def test_large_bytes_through_tasks_put_and_arguments():
    size = (8 << 20) + 5
    expected = _payload(size)
    result = ray.get(make.remote(size), timeout=60)
    assert type(result) is bytes and result == expected
    ref = ray.put(expected)
    assert ray.get(ref, timeout=60) == expected
    summary = ("bytes", size, expected[:3], expected[-3:])
    assert ray.get(length_and_ends.remote(ref), timeout=60) == summary
    assert ray.get(length_and_ends.remote(expected), timeout=60) == summary
    assert ray.get(length_and_ends.remote(make.remote(size)), timeout=60) == summary


def test_bytes_inside_containers_still_round_trip():
    value = {"blob": _payload(SHARED_MEMORY_MIN * 2), "parts": [_payload(OUT_OF_BAND_MIN)] * 2}
    assert ray.get(ray.put(value), timeout=60) == value

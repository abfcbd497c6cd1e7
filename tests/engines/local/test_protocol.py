"""Frames between the driver and its workers (protocol.py): one message or a batch."""

from __future__ import annotations

import socket
import threading

from lightwork.engines.local import protocol as p
from lightwork.kernel import serialization
from lightwork.kernel.serialization import Stored


def _task(i: int, shared: Stored) -> tuple:
    return (p.TASK, (i, b"k" * 16, "noop", shared, (), (i + 1,), (("CPU", 1.0),), ()))


def test_a_batch_is_one_frame_and_decodes_to_its_messages_in_order() -> None:
    shared = Stored(b"\x80\x05N.", (), None, 4, ())
    messages = [_task(i, shared) for i in range(50)]
    data = p.encode_many(messages)
    (length,) = p._LENGTH.unpack_from(data)
    assert length == len(data) - 4  # one frame, not fifty
    decoded = p.FrameDecoder().feed(data)
    assert decoded == messages
    # Objects the messages shared travel once and stay shared (pickle's memo).
    assert decoded[0][1][3] is decoded[49][1][3]


def _done(task_id: int, outcome: object, times: tuple = (1.0, 2.0, 3.0, 4.0, 0.5)) -> tuple:
    return (p.DONE, task_id, outcome, times)


def _types(value: object) -> object:
    if isinstance(value, (tuple, list)):
        return (type(value), [_types(item) for item in value])
    if isinstance(value, Stored):
        return (Stored, [_types(getattr(value, name)) for name in Stored.__slots__])
    return type(value)


def test_every_message_decodes_to_what_was_sent_type_for_type_alone_or_in_a_batch() -> None:
    bare = b"\x80\x05N."  # a value's pickle alone (serialization.bare)
    task = _task(7, bare)[1]
    messages = [
        _task(7, bare),
        # An actor method's name is the key; names in any script, the arguments empty.
        (p.TASK, (2**40 + 3, "m\u00e9thode", "Actor.m\u00e9thode", b"", (), (2**40 + 4,), (),
                  ())),
        (p.TASK, (*task[:4], (Stored(b"d", (), None, 1, ()),), *task[5:])),  # a dependency
        (p.TASK, (*task[:5], (8, 9), *task[6:])),  # two returns
        (p.TASK, (*task[:7], (0,))),  # a GPU
        (p.TASK, (*task[:3], Stored(b"a", (b"buffer",), None, 7, ()), *task[4:])),
        (p.TASK, (*task[:3], Stored(b"", (), "/dev/shm/segment", 9, ()), *task[4:])),
        (p.TASK, (*task[:3], Stored(b"a", (), None, 1, (5,)), *task[4:])),  # a ref inside
        _done(7, [b"x"]),
        _done(2**40 + 5, [b"y" * 300], (1e9 + 0.123456789, -0.0, float("inf"), 5e-324, 0.0)),
        _done(7, "cancelled"),
        _done(7, ("error", Stored(b"e", (), None, 1, ()))),
        _done(7, [bare, Stored(b"a", (), None, 1, (5,))]),
        _done(7, [Stored(b"", (), "/dev/shm/segment", 9, ())]),
        (p.REPLY, 1, "one"),
    ]
    for message in messages:
        data = p.encode_many([message])
        assert data == p.encode(message)
        (length,) = p._LENGTH.unpack_from(data)
        assert length == len(data) - 4
        [decoded] = p.FrameDecoder().feed(data)
        assert decoded == message
        assert _types(decoded) == _types(message)  # bytes stay bytes, a () stays a ()
    batch = p.FrameDecoder().feed(p.encode_many(messages))
    assert batch == messages
    assert [_types(m) for m in batch] == [_types(m) for m in messages]


def test_frames_split_anywhere_decode_once_whole() -> None:
    shared = Stored(b"\x80\x05N.", (), None, 4, ())
    done = _done(5, [Stored(b"x", (), None, 1, ())])
    stream = (p.encode((p.REPLY, 1, "one")) + p.encode_many([_task(i, shared) for i in range(3)])
              + p.encode(_task(4, shared)) + p.encode(done) + p.encode((p.EXIT,)))
    expected = [(p.REPLY, 1, "one"), *[_task(i, shared) for i in range(3)], _task(4, shared),
                done, (p.EXIT,)]
    for cut in range(len(stream) + 1):
        decoder = p.FrameDecoder()
        first = decoder.feed(stream[:cut])
        rest = decoder.feed(stream[cut:])
        assert first + rest == expected, cut
        # Nothing is yielded before its frame is whole.
        assert len(first) <= len(expected)


def test_a_batch_larger_than_one_recv_crosses_the_socket_intact() -> None:
    ours, theirs = socket.socketpair()
    shared = Stored(b"\x80\x05N.", (), None, 4, ())
    messages = [(*_task(i, shared)[:1], (i, b"v" * 3000)) for i in range(400)]  # ~1.2 MB
    sender = threading.Thread(target=lambda: ours.sendall(p.encode_many(messages)))
    sender.start()
    connection = p.BlockingConnection(theirs)
    received = [connection.recv() for _ in messages]
    sender.join(timeout=10)
    assert received == messages
    ours.close()
    assert connection.recv() is None  # the other side closed: None, not an exception
    theirs.close()


def test_a_value_travels_bare_only_when_its_pickle_is_all_it_is() -> None:
    """Frames carry a task's arguments and results as their pickle alone when that is all
    they are; a value with buffers, a segment or refs inside keeps its ``Stored``."""
    plain = serialization.serialize(("a", [1, 2]), None)
    assert serialization.bare(plain) == plain.data
    assert type(serialization.bare(plain)) is bytes
    assert serialization.unbare(serialization.bare(plain)) == plain
    assert serialization.loads(serialization.bare(plain)) == ("a", [1, 2])
    kept = [
        Stored(b"a", (b"buffer",), None, 7, ()),
        Stored(b"", (), "/dev/shm/segment", 9, ()),
        Stored(b"a", (), None, 1, (5,)),
    ]
    for stored in kept:
        assert serialization.bare(stored) is stored
        assert serialization.unbare(stored) is stored

"""Frames between the driver and its workers (protocol.py): one message or a batch."""

from __future__ import annotations

import pickle
import socket
import threading

from lightwork._runtime import protocol as p
from lightwork._runtime.serialization import Stored


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


def _decoded_alone(message: tuple) -> tuple[bool, tuple]:
    """(whether ``message`` went as a pickle, what a decoder makes of its frame)."""
    data = p.encode_many([message])
    assert data == p.encode(message)
    (length,) = p._LENGTH.unpack_from(data)
    assert length == len(data) - 4
    [decoded] = p.FrameDecoder().feed(data)
    return data[4] == p._PICKLE_TAG, decoded


def test_a_lone_task_or_result_of_the_common_shape_is_a_fixed_layout_equal_to_its_pickle() -> None:
    """A sync call's TASK and DONE skip pickle (half the bytes, about half the
    time); what the other side decodes is what it would have unpickled."""
    common = [
        _task(7, Stored(b"\x80\x05N.", (), None, 4, ())),
        # An actor method's name is the key; names in any script, the arguments empty.
        (p.TASK, (2**40 + 3, "m\u00e9thode", "Actor.m\u00e9thode", Stored(b"", (), None, 0, ()),
                  (), (2**40 + 4,), (), ())),
        (p.TASK, (9, b"\x00" * 16, "odd \udcff name", Stored(b"a" * p._FAST_DATA_MAX,
                  (), None, p._FAST_DATA_MAX, ()), (), (10,), (("CPU", 1.0),), ())),
        _done(7, [Stored(b"x", (), None, 1, ())]),
        _done(2**40 + 5, [Stored(b"y" * 300, (), None, 300, ())],
              (1e9 + 0.123456789, -0.0, float("inf"), 5e-324, 0.0)),
    ]
    for message in common:
        pickled, decoded = _decoded_alone(message)
        assert not pickled, message
        assert decoded == message == pickle.loads(pickle.dumps(message, protocol=5))
        assert _types(decoded) == _types(message)  # a () stays a (), a str a str
    assert len(p.encode(common[0])) < len(pickle.dumps(common[0], protocol=5)) / 1.5


def test_every_other_task_or_result_goes_as_its_pickle() -> None:
    plain = Stored(b"\x80\x05N.", (), None, 4, ())
    task = _task(7, plain)[1]
    other = [
        (p.TASK, (*task[:4], (Stored(b"d", (), None, 1, ()),), *task[5:])),  # a dependency
        (p.TASK, (*task[:4], [], *task[5:])),  # not the () a fixed layout stands for
        (p.TASK, (*task[:5], (8, 9), *task[6:])),  # two returns
        (p.TASK, (*task[:6], (("CPU", 2.0),), ())),  # another shape
        (p.TASK, (*task[:7], (0,))),  # a GPU
        (p.TASK, (*task[:3], Stored(b"a", (b"buffer",), None, 7, ()), *task[4:])),
        (p.TASK, (*task[:3], Stored(b"", (), "/dev/shm/segment", 9, ()), *task[4:])),
        (p.TASK, (*task[:3], Stored(b"a", (), None, 1, (5,)), *task[4:])),  # a ref inside
        (p.TASK, (*task[:3], Stored(b"a" * (p._FAST_DATA_MAX + 1), (), None, 1, ()), *task[4:])),
        (p.TASK, (task[0], b"k" * 256, *task[2:])),  # a key too long for its byte
        (p.TASK, (task[0], None, *task[2:])),
        (p.TASK, (-1, *task[1:])),
        (p.TASK, task[:7]),
        _done(7, "cancelled"),
        _done(7, ("error", plain)),
        _done(7, [plain, plain]),
        _done(7, (plain,)),
        _done(7, [Stored(b"a", (), None, 1, (5,))]),
        _done(7, [plain], (1.0, 2.0, 3.0, 4.0)),
        _done(7, [plain], (1.0, 2.0, 3.0, 4.0, None)),
        (p.REPLY, 1, "one"),
    ]
    for message in other:
        pickled, decoded = _decoded_alone(message)
        assert pickled, message
        assert decoded == message
    # In a batch, the messages of the common shape are pickled with the rest.
    data = p.encode_many([_task(1, plain), _done(2, [plain])])
    assert data[4] == p._PICKLE_TAG


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

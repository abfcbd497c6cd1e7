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


def test_a_single_message_is_a_frame_of_its_own_pickle() -> None:
    message = (p.DONE, 7, [Stored(b"x", (), None, 1, ())], (1.0, 2.0, 3.0, 4.0, 0.5))
    data = p.encode_many([message])
    assert data == p.encode(message)
    assert pickle.loads(data[4:]) == message
    assert p.FrameDecoder().feed(data) == [message]


def test_frames_split_anywhere_decode_once_whole() -> None:
    shared = Stored(b"\x80\x05N.", (), None, 4, ())
    stream = (p.encode((p.REPLY, 1, "one")) + p.encode_many([_task(i, shared) for i in range(3)])
              + p.encode((p.EXIT,)))
    expected = [(p.REPLY, 1, "one"), *[_task(i, shared) for i in range(3)], (p.EXIT,)]
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

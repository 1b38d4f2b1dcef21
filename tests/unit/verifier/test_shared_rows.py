"""Large arrays from an engine host to its client through shared memory
(`edgekit.verifier.engine._shared_rows`): what comes out is what went in, one answer in the file at
a time, the file's descriptor passed over the connection once, and where the file cannot be had the
arrays go in the pickle, never lost."""

from __future__ import annotations

import errno
import os
import threading
from multiprocessing.connection import Pipe

import numpy as np
import pytest

from edgekit.verifier.engine._shared_rows import RowReader, RowWriter, available, receive, send

pytestmark = pytest.mark.skipif(not available(), reason="no memfd_create: arrays stay in the pickle")

RNG = np.random.default_rng(0)
PAIR = np.dtype([("token", "<i4"), ("logit", "<f4")])


def _message(rows: int = 3, vocab: int = 40_000) -> tuple:
    whole = RNG.standard_normal((rows, vocab)).astype(np.float32)
    pairs = np.zeros(vocab, PAIR)
    pairs["token"] = np.arange(vocab)
    return (7, "ok", [whole, (whole[:, ::2], np.arange(5)), np.array(["an", "object"], dtype=object),
                      np.empty((0, 0), np.float32), pairs, whole])


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _exchange(host, client, writer, reader, message):
    """`message` from the writer's end to the reader's: sent on a thread of its own, as the host's
    answers are (one in the pickle is megabytes, more than the connection holds unread)."""
    sender = threading.Thread(target=lambda: send(host, writer, writer.dumps(message)))
    sender.start()
    try:
        return receive(client, reader)
    finally:
        sender.join()


@pytest.fixture
def link():
    """A writer at one end of a connection and a reader at the other, as a host and its client."""
    host, client = Pipe()
    writer, reader = RowWriter(), RowReader()
    yield writer, reader, host, client
    writer.close()
    reader.close()
    host.close()
    client.close()


def test_arrays_come_out_as_they_went_in_and_the_file_takes_one_answer_at_a_time(link):
    writer, reader, host, client = link

    def exchange(message):
        return _exchange(host, client, writer, reader, message)

    first, second = _message(), _message(rows=2)
    got, generation = exchange(first)
    assert _same(got, first) and generation == 1 and writer.shared == 1
    assert got[2][5] is got[2][0]  # an array met twice in an answer comes back as one
    # not freed yet: the next answer's arrays go in the pickle, and come out the same
    got, none = exchange(second)
    assert _same(got, second) and none is None and writer.inline == 1
    writer.freed(generation)
    bigger = _message(rows=9)  # more than the file holds: it grows, and the reader maps it again
    got, generation = exchange(bigger)
    assert _same(got, bigger) and generation == 2
    writer.freed(1)  # an old generation frees nothing
    assert exchange(first)[1] is None
    writer.freed(2)  # a message without large arrays never touches the file
    small, generation = exchange((1, "ok", np.arange(10)))
    assert np.array_equal(small[2], np.arange(10)) and generation is None and writer.shared == 2
    writer.close()
    assert writer._fd == -1
    assert _same(got, bigger)  # what the client copied out stays


def test_the_files_descriptor_crosses_once_with_the_first_answer_that_uses_it(link):
    writer, reader, host, client = link
    sends = []
    real = writer.new_file
    writer.new_file = lambda: sends.append(real()) or sends[-1]
    for _ in range(3):
        _, generation = _exchange(host, client, writer, reader, _message())
        writer.freed(generation)
    assert [fd is not None for fd in sends] == [True, False, False] and reader._fd >= 0


def test_a_shortage_of_memory_sends_the_arrays_in_the_pickle(link, monkeypatch):
    writer, reader, host, client = link

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    message = _message()
    got, generation = _exchange(host, client, writer, reader, message)
    assert _same(got, message) and generation is None and (writer.shared, writer.inline) == (0, 1)


def test_a_writer_that_shares_nothing_pickles_everything(link):
    _, reader, host, client = link
    writer = RowWriter(min_bytes=None)
    message = _message()
    got, generation = _exchange(host, client, writer, reader, message)
    assert _same(got, message) and generation is None and writer.shared == 0 and writer._fd == -1


def test_the_connection_stays_blocking_under_a_process_wide_socket_timeout(link):
    """socket.setdefaulttimeout makes a socket object made on a descriptor non-blocking, which would
    make the Connection's next read fail at once."""
    import socket

    writer, reader, host, client = link
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(5.0)
    try:
        _exchange(host, client, writer, reader, _message())
        assert os.get_blocking(host.fileno()) and os.get_blocking(client.fileno())
        threading.Timer(0.05, lambda: host.send_bytes(writer.dumps((2, "ok", None)))).start()
        assert receive(client, reader) == ((2, "ok", None), None)  # waited for, not BlockingIOError
    finally:
        socket.setdefaulttimeout(old)

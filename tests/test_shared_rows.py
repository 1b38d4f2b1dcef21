"""Large arrays from an engine host to its client through a file in shared memory
(`edgekit.verifier.engine._shared_rows`): what comes out is what went in, one answer in the file at
a time, and where the file cannot be had the arrays go in the pickle, never lost."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from edgekit.verifier.engine._shared_rows import RowReader, RowWriter, shared_memory_dir

pytestmark = pytest.mark.skipif(shared_memory_dir() is None, reason="no posix_fallocate: arrays stay in the pickle")

RNG = np.random.default_rng(0)


def _message(rows: int = 3, vocab: int = 40_000) -> tuple:
    whole = RNG.standard_normal((rows, vocab)).astype(np.float32)
    return (7, "ok", [whole, (whole[:, ::2], np.arange(5)), np.array(["an", "object"], dtype=object),
                      np.empty((0, 0), np.float32)])


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_arrays_come_out_as_they_went_in_and_the_file_takes_one_answer_at_a_time(tmp_path):
    writer, reader = RowWriter(min_bytes=64 * 1024, directory=str(tmp_path)), RowReader()
    first, second = _message(), _message(rows=2)
    got, generation = reader.loads(writer.dumps(first))
    assert _same(got, first) and generation == 1 and writer.shared == 1
    # not freed yet: the next answer's arrays go in the pickle, and come out the same
    got, none = reader.loads(writer.dumps(second))
    assert _same(got, second) and none is None and writer.inline == 1
    writer.freed(generation)
    bigger = _message(rows=9)  # more than the file holds: it grows, and the reader maps it again
    got, generation = reader.loads(writer.dumps(bigger))
    assert _same(got, bigger) and generation == 2
    writer.freed(1)  # an old generation frees nothing
    assert reader.loads(writer.dumps(first))[1] is None
    # a message without large arrays never touches the file
    writer.freed(2)
    small, generation = reader.loads(writer.dumps((1, "ok", np.arange(10))))
    assert np.array_equal(small[2], np.arange(10)) and generation is None
    (folder,) = tmp_path.iterdir()
    writer.close()
    assert not folder.exists()  # the file and its private folder go with the writer
    assert _same(got, bigger)  # what the client copied out stays


def test_a_full_shared_memory_sends_the_arrays_in_the_pickle(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    writer, reader = RowWriter(directory=str(tmp_path)), RowReader()
    message = _message()
    got, generation = reader.loads(writer.dumps(message))
    assert _same(got, message) and generation is None and (writer.shared, writer.inline) == (0, 1)
    writer.close()
    assert not [p for p in Path(tmp_path).rglob("rows")]


def test_a_writer_that_shares_nothing_pickles_everything(tmp_path):
    writer, reader = RowWriter(min_bytes=None, directory=str(tmp_path)), RowReader()
    message = _message()
    got, generation = reader.loads(writer.dumps(message))
    assert _same(got, message) and generation is None and writer.shared == 0
    assert not list(tmp_path.iterdir())

"""Large arrays between an engine host and its client through shared memory, not the socket.

Whole logit rows are 128 KB to 1 MB each (32,000 to 262,144 tokens); pickled through a Unix socket
they cost 0.1-0.4 ms each (0.3-1 GB/s, `benchmarks/engine_host.py`). `RowWriter` (the host's, one per
client) pickles an answer with every array of at least `min_bytes` written into a memory file of
its own (`memfd_create`: no name, so nothing is left behind when either process dies) and named in
the pickle by where it lies; the file's descriptor goes to the client over the socket once
(SCM_RIGHTS), and `RowReader` (the client's) copies each array back out as it unpickles. One answer
at a time uses the file: the client says when it has copied one out (`freed`), and an answer made
before that carries its arrays in the pickle, as one does where the file cannot be had (not Linux;
memory that cannot be reserved: space is reserved with `posix_fallocate` before it is written, so a
shortage is an error here, never a SIGBUS later).

`send` and `receive` carry the messages, and the descriptor when it is new, over a
`multiprocessing.connection.Connection`.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle
import socket
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

__all__ = ["RowReader", "RowWriter", "available", "receive", "send", "socket_of"]

_ALIGN = 64
MAX_BYTES = 4 << 30  # a file no larger: an answer past it goes in the pickle
_ROWS = "edgekit-shared-rows"  # an answer whose arrays lie in the file: (_ROWS, generation, its pickle)
_FILE = "edgekit-rows-file"  # (_FILE,): the file's descriptor follows, alone, as SCM_RIGHTS


def available() -> bool:
    """Whether arrays can go through shared memory here (Linux: memfd_create, posix_fallocate and
    descriptors passed over Unix sockets)."""
    return all(hasattr(m, f) for m, f in ((os, "memfd_create"), (os, "posix_fallocate"), (socket, "send_fds")))


class _File:
    """A memory file's descriptor and its mapping, held by one side."""

    def __init__(self) -> None:
        self._fd = -1
        self._map: mmap.mmap | None = None

    def _release(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RowWriter(_File):
    """The host's side for one client: `dumps` pickles a message, its large arrays in the file while
    the client has freed the last answer that used it. `min_bytes`: the least an array that goes
    through the file (None: none does)."""

    def __init__(self, *, min_bytes: int | None = 64 * 1024) -> None:
        super().__init__()
        self.min_bytes = min_bytes if available() else None
        self._lock = threading.Lock()  # `_busy` and `_generation` (`freed` comes from another thread)
        self._generation = 0  # of the last answer that used the file
        self._busy = False  # until the client frees it
        self._unsent = False  # the file is new: its descriptor goes to the client before the answer
        self._closed = False
        self.shared = 0  # answers whose arrays went through the file
        self.inline = 0  # answers with an array of min_bytes or more that went in the pickle

    def dumps(self, message: Any) -> bytes:
        with self._lock:
            free = not self._busy and not self._closed and self.min_bytes is not None
        out = io.BytesIO()
        pickler = _Pickler(out, self, free)
        pickler.dump(message)
        if pickler.placed:
            with self._lock:
                self._generation += 1
                self._busy = True
                self.shared += 1
                generation = self._generation
            return pickle.dumps((_ROWS, generation, out.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
        if pickler.big:
            self.inline += 1
        return out.getvalue()

    def new_file(self) -> int | None:
        """The file's descriptor where the client has not been given it yet (once), else None."""
        if not self._unsent:
            return None
        self._unsent = False
        return self._fd

    def freed(self, generation: int) -> None:
        """The client has copied out the answer of `generation`: the file may take the next one."""
        with self._lock:
            if generation == self._generation:
                self._busy = False

    def close(self) -> None:
        """Lets go of the file (the thread that calls `dumps` calls it, or no thread does any more)."""
        with self._lock:
            self._closed = True
        self._release()

    def _room(self, size: int) -> mmap.mmap | None:
        """The file mapped, at least `size` bytes (grown as needed); None where it cannot be had."""
        if self._map is not None and len(self._map) >= size:
            return self._map
        if size > MAX_BYTES:
            return None
        grown = max(size, 2 * len(self._map) if self._map is not None else size)
        grown = min(-(-grown // mmap.PAGESIZE) * mmap.PAGESIZE, MAX_BYTES)
        try:
            if self._fd < 0:
                self._fd = os.memfd_create("edgekit-rows", os.MFD_CLOEXEC)
                self._unsent = True
            for want in dict.fromkeys((grown, size)):  # twice what it held, else just what this needs
                try:
                    os.posix_fallocate(self._fd, 0, want)  # reserved now: a shortage fails here, not as a SIGBUS
                    break
                except OSError:
                    if want == size:
                        raise
        except OSError:  # no room: this answer's arrays, from here, go in the pickle
            return None
        if self._map is not None:
            self._map.close()
            self._map = None
        try:
            self._map = mmap.mmap(self._fd, os.fstat(self._fd).st_size)
        except OSError:
            return None
        return self._map

    def _place(self, array: np.ndarray, offset: int) -> tuple[Any, ...] | None:
        room = self._room(offset + array.nbytes)
        if room is None:
            return None
        np.ndarray(array.shape, array.dtype, buffer=room, offset=offset)[...] = array
        return (_ROWS, offset, array.shape, array.dtype)


class _Pickler(pickle.Pickler):
    def __init__(self, out: io.BytesIO, writer: RowWriter, free: bool) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer, self.free = writer, free
        self.offset = 0
        self.placed = False
        self.big = False
        self._seen: dict[int, tuple[np.ndarray, tuple[Any, ...]]] = {}  # an array met twice is placed once

    def persistent_id(self, obj: Any) -> Any:
        least = self.writer.min_bytes
        if least is None or type(obj) is not np.ndarray or obj.nbytes < least or obj.dtype.hasobject:
            return None
        self.big = True
        if not self.free:
            return None
        seen = self._seen.get(id(obj))
        if seen is not None:
            return seen[1]
        where = self.writer._place(np.ascontiguousarray(obj), self.offset)
        if where is None:
            self.free = False  # the rest of this answer goes in the pickle too
            return None
        self._seen[id(obj)] = (obj, where)  # (held, so that its id is not reused within the answer)
        self.placed = True
        self.offset = -(-(self.offset + obj.nbytes) // _ALIGN) * _ALIGN
        return where


class RowReader(_File):
    """The client's side: `loads` unpickles a message, copying its arrays out of the host's file
    (`adopt` takes the file's descriptor)."""

    def adopt(self, fd: int) -> None:
        self._release()
        self._fd = fd

    def loads(self, data: bytes) -> tuple[Any, int | None]:
        """The message, and the generation to free (None where the message used no file)."""
        outer = pickle.loads(data)
        if not (isinstance(outer, tuple) and len(outer) == 3 and outer[0] == _ROWS):
            return outer, None
        _, generation, inner = outer
        return _Unpickler(io.BytesIO(inner), self).load(), generation

    def close(self) -> None:
        self._release()

    def _array(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        end = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._map is None or len(self._map) < end:  # the first, or the host grew the file
            if self._fd < 0:
                raise pickle.UnpicklingError("an answer in shared memory, and no file from the host")
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self._fd, os.fstat(self._fd).st_size, prot=mmap.PROT_READ)
        return np.ndarray(shape, dtype, buffer=self._map, offset=offset).copy()


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, reader: RowReader) -> None:
        super().__init__(data)
        self.reader = reader
        self._loaded: dict[int, np.ndarray] = {}  # by offset: an array the answer held twice comes back once

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 4 and pid[0] == _ROWS):
            raise pickle.UnpicklingError(f"not an array in shared memory: {pid!r}")
        offset = pid[1]
        if offset not in self._loaded:
            self._loaded[offset] = self.reader._array(*pid[1:])
        return self._loaded[offset]


def send(conn: Connection, writer: RowWriter, data: bytes) -> None:
    """A message `writer.dumps` made, on `conn`, after the file's descriptor where it is new to the
    client. Raises OSError or ValueError where `conn` is gone."""
    fd = writer.new_file()
    if fd is not None:
        conn.send_bytes(_FILE_NOTICE)
        with socket_of(conn) as s:
            socket.send_fds(s, [b"F"], [fd])
    conn.send_bytes(data)


def receive(conn: Connection, reader: RowReader) -> tuple[Any, int | None]:
    """The next message on `conn` (`reader.loads`'), taking the host's file on the way where it comes."""
    while True:
        data = conn.recv_bytes()
        if data == _FILE_NOTICE:
            with socket_of(conn) as s:
                _, fds, _, _ = socket.recv_fds(s, 1, 1)
            if len(fds) != 1:
                raise OSError("the engine host's shared memory did not arrive")
            reader.adopt(fds[0])
            continue
        return reader.loads(data)


_FILE_NOTICE = pickle.dumps((_FILE,), protocol=4)


@contextlib.contextmanager
def socket_of(conn: Connection) -> Iterator[socket.socket]:
    """`conn`'s socket as a socket object (on a duplicate of its descriptor: options and shutdown act
    on the one socket), left blocking (a process-wide default timeout would make the shared
    descriptor non-blocking under the Connection's feet)."""
    s = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        s.setblocking(True)
        yield s
    finally:
        s.close()

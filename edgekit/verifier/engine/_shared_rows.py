"""Large arrays between an engine host and its client through shared memory, not the socket.

Whole logit rows are 128 KB to 1 MB each (32,000 to 262,144 tokens); pickled through a Unix socket
they cost 0.15-0.4 ms each (0.3-0.9 GB/s, `benchmarks/engine_host.py`). `RowWriter` (the host's, one
per client) pickles an answer with every array of at least `min_bytes` written into a file in
shared memory (`/dev/shm` where there is one) and named in the pickle by where it lies; `RowReader`
(the client's) copies each back out as it unpickles. One answer at a time uses the file: the client
says when it has copied one out (`freed`), and an answer made before that carries its arrays in the
pickle, as one does when the file cannot be had at all (no `posix_fallocate`, a full tmpfs: space is
reserved before it is written, so a full one is an error here, never a SIGBUS).

The file lives in a directory only its owner may read (`tempfile.mkdtemp`), and goes with the writer.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RowReader", "RowWriter", "shared_memory_dir"]

_ALIGN = 64
_MARK = "edgekit-shared-rows"  # an answer whose arrays lie in the file: (_MARK, generation, its pickle)
MAX_BYTES = 4 << 30  # a file no larger: an answer past it goes in the pickle


def shared_memory_dir() -> str | None:
    """Where the files go: /dev/shm on Linux, else the temporary directory; None where space cannot be
    reserved before it is written (no `posix_fallocate`): there, arrays stay in the pickle."""
    if not hasattr(os, "posix_fallocate"):
        return None
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class RowWriter:
    """The host's side for one client: `dumps` pickles a message, its large arrays in the file while
    the client has freed the last answer that used it."""

    def __init__(self, *, min_bytes: int | None = 64 * 1024, directory: str | None = None) -> None:
        """`min_bytes`: the least an array that goes through the file (None: none does); `directory`:
        where the file goes (None: `shared_memory_dir()`)."""
        self.min_bytes = min_bytes
        self._where = None if min_bytes is None else directory or shared_memory_dir()
        self._path: str | None = None
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()
        self._generation = 0  # of the last answer that used the file
        self._busy = False  # until the client frees it
        self.shared = 0  # answers whose arrays went through the file
        self.inline = 0  # answers with an array of min_bytes or more that went in the pickle

    def dumps(self, message: Any) -> bytes:
        with self._lock:
            free = not self._busy and self._where is not None
        out = io.BytesIO()
        pickler = _Pickler(out, self, free)
        pickler.dump(message)
        if pickler.placed:
            with self._lock:
                self._busy = True
                self.shared += 1
            return pickle.dumps((_MARK, self._generation, out.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
        if pickler.big:
            self.inline += 1
        return out.getvalue()

    def freed(self, generation: int) -> None:
        """The client has copied out the answer of `generation`: the file may take the next one."""
        with self._lock:
            if generation == self._generation:
                self._busy = False

    def close(self) -> None:
        with self._lock:
            self._where = None  # nothing more goes in
            if self._map is not None:
                self._map.close()
                self._map = None
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._path is not None:
                Path(self._path).unlink(missing_ok=True)
                Path(self._path).parent.rmdir()
                self._path = None

    def _room(self, size: int) -> mmap.mmap | None:
        """The file mapped, at least `size` bytes (grown as needed); None where it cannot be had."""
        if self._map is not None and len(self._map) >= size:
            return self._map
        if size > MAX_BYTES or self._where is None:
            return None
        try:
            if self._path is None:
                self._path = str(Path(tempfile.mkdtemp(prefix="edgekit-rows-", dir=self._where)) / "rows")
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            grown = max(size, 2 * len(self._map) if self._map is not None else size)
            grown = min(-(-grown // mmap.PAGESIZE) * mmap.PAGESIZE, MAX_BYTES)
            os.posix_fallocate(self._fd, 0, grown)  # reserved now: a full tmpfs fails here, not as a SIGBUS later
        except OSError:  # no room: this answer, and any later one that needs more, go in the pickle
            return None
        if self._map is not None:
            self._map.close()
            self._map = None
        try:
            self._map = mmap.mmap(self._fd, grown)
        except OSError:
            return None
        return self._map

    def _place(self, array: np.ndarray, offset: int) -> tuple[Any, ...] | None:
        end = offset + array.nbytes
        room = self._room(end)
        if room is None:
            return None
        np.ndarray(array.shape, array.dtype, buffer=room, offset=offset)[...] = array
        assert self._path is not None
        return ("rows", self._path, offset, array.shape, array.dtype.str)


class _Pickler(pickle.Pickler):
    def __init__(self, out: io.BytesIO, writer: RowWriter, free: bool) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer, self.free = writer, free
        self.offset = 0
        self.placed = False
        self.big = False

    def persistent_id(self, obj: Any) -> Any:
        least = self.writer.min_bytes
        if least is None or type(obj) is not np.ndarray or obj.nbytes < least or obj.dtype.hasobject:
            return None
        self.big = True
        if not self.free:
            return None
        if not self.placed:
            self.writer._generation += 1
        where = self.writer._place(np.ascontiguousarray(obj), self.offset)
        if where is None:
            self.free = False  # the rest of this answer goes in the pickle too
            return None
        self.placed = True
        self.offset = -(-(self.offset + obj.nbytes) // _ALIGN) * _ALIGN
        return where


class RowReader:
    """The client's side: `loads` unpickles a message, copying its arrays out of the host's file;
    `freed_generation` says, after it, which answer to free (None: it used no file)."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._map: mmap.mmap | None = None

    def loads(self, data: bytes) -> tuple[Any, int | None]:
        """The message, and the generation to free (None where the message used no file)."""
        outer = pickle.loads(data)
        if not (isinstance(outer, tuple) and len(outer) == 3 and outer[0] == _MARK):
            return outer, None
        _, generation, inner = outer
        return _Unpickler(io.BytesIO(inner), self).load(), generation

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def _array(self, path: str, offset: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        kind = np.dtype(dtype)
        end = offset + int(np.prod(shape, dtype=np.int64)) * kind.itemsize
        if self._map is None or path != self._path or len(self._map) < end:
            self.close()
            with open(path, "rb") as f:  # the host grew it, or it is the first
                self._map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            self._path = path
        return np.ndarray(shape, kind, buffer=self._map, offset=offset).copy()


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, reader: RowReader) -> None:
        super().__init__(data)
        self.reader = reader

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "rows"):
            raise pickle.UnpicklingError(f"not an array in shared memory: {pid!r}")
        return self.reader._array(*pid[1:])

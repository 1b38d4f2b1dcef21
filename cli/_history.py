"""Chat history in the per-user data directory (EDGEKIT_DATA_DIR, XDG_DATA_HOME, ~/.local/share).

What people typed to a model is private: the directory is made 0700 and the files 0600 whatever
the umask (a shared device's default of 022 would let every user read them). A record is one
line written with one write on an O_APPEND descriptor and fsync'd, so concurrent chats never
interleave and a power cut tears at most the last line, which `read_history` skips and the next
write starts a fresh line after. History is a convenience: when it cannot be written (a full or
read-only disk) the chat says so once and goes on without it.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._common import note

_PRIVATE_DIR, _PRIVATE_FILE = 0o700, 0o600
_BINARY = getattr(os, "O_BINARY", 0)  # Windows would write "\r\n"


def data_dir() -> Path:
    env = os.environ.get("EDGEKIT_DATA_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "edgekit"


def history_disabled() -> bool:
    return os.environ.get("EDGEKIT_NO_HISTORY", "").lower() in ("1", "true", "yes")


def read_history(path: Path) -> list[dict[str, Any]]:
    """The records of a chat_history.jsonl; a line that is no record (torn by a crash) is skipped."""
    records = []
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


class History:
    """Appends each turn as a JSON line to chat_history.jsonl; keeps readline's input history.
    `warn` gets the one message saying history is off after a write failed."""

    def __init__(self, enabled: bool, pair: str, *, warn: Callable[[str], None] = note) -> None:
        self.enabled = enabled and not history_disabled()
        self.pair = pair
        self.conversation = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.path = data_dir() / "chat_history.jsonl"
        self.input_path = data_dir() / "input_history"
        self._warn = warn

    def add(self, role: str, content: str) -> None:
        if not self.enabled:
            return
        record = {
            "time": time.time(), "conversation": self.conversation, "pair": self.pair, "role": role, "content": content
        }
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            _private_dir(self.path.parent)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _BINARY, _PRIVATE_FILE)
            try:
                _private_file(fd)
                if _ends_torn(fd):
                    line = b"\n" + line  # the torn record stays a line of its own, skipped by readers
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(f"only {written} of {len(line)} bytes written")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self._off(self.path, exc)

    def load_input_history(self) -> None:
        if not self.enabled:
            return
        try:
            import readline

            if self.input_path.exists():
                readline.read_history_file(str(self.input_path))
        except (ImportError, OSError):
            pass

    def save_input_history(self) -> None:
        if not self.enabled:
            return
        try:
            import readline
        except ImportError:
            return
        try:
            _private_dir(self.input_path.parent)
            # readline writes in place with the umask's mode (or keeps a looser one): write a
            # private file beside it and rename it over the old one.
            fd, tmp = tempfile.mkstemp(prefix=".input_history.", dir=self.input_path.parent)
            os.close(fd)
            try:
                readline.set_history_length(2000)
                readline.write_history_file(tmp)
                os.replace(tmp, self.input_path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            self._off(self.input_path, exc)

    def _off(self, path: Path, exc: OSError) -> None:
        self.enabled = False
        self._warn(f"chat history is off for this chat: {path} could not be written ({exc.strerror or exc})")


def _private_dir(path: Path) -> None:
    """Make the data directory 0700; tighten it where it is edgekit's own and looser (as ssh wants
    ~/.ssh). A directory the user named in EDGEKIT_DATA_DIR that exists already is theirs to set:
    the files in it are private either way."""
    if not path.is_dir():
        path.mkdir(mode=_PRIVATE_DIR, parents=True, exist_ok=True)
        os.chmod(path, _PRIVATE_DIR)  # mkdir's mode passes through the umask
        return
    if os.environ.get("EDGEKIT_DATA_DIR") or os.name != "posix":
        return
    st = os.stat(path)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, _PRIVATE_DIR)


def _ends_torn(fd: int) -> bool:
    """Whether the file ends inside a record: a crash cut its last write short."""
    size = os.fstat(fd).st_size
    if not size:
        return False
    os.lseek(fd, size - 1, os.SEEK_SET)
    return os.read(fd, 1) != b"\n"


def _private_file(fd: int) -> None:
    """An existing history file of ours that others can read (written before edgekit made it private)."""
    if os.name != "posix":  # no modes to tighten
        return
    st = os.fstat(fd)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, _PRIVATE_FILE)

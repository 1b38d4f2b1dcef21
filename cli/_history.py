"""Chat history in the per-user data directory (EDGEKIT_DATA_DIR, XDG_DATA_HOME, ~/.local/share)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def data_dir() -> Path:
    env = os.environ.get("EDGEKIT_DATA_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "edgekit"


def history_disabled() -> bool:
    return os.environ.get("EDGEKIT_NO_HISTORY", "").lower() in ("1", "true", "yes")


class History:
    """Appends each turn as a JSON line to chat_history.jsonl; keeps readline's input history."""

    def __init__(self, enabled: bool, pair: str) -> None:
        self.enabled = enabled and not history_disabled()
        self.pair = pair
        self.conversation = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.path = data_dir() / "chat_history.jsonl"
        self.input_path = data_dir() / "input_history"

    def add(self, role: str, content: str) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "time": time.time(), "conversation": self.conversation, "pair": self.pair, "role": role, "content": content
        }
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

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

            self.input_path.parent.mkdir(parents=True, exist_ok=True)
            readline.set_history_length(2000)
            readline.write_history_file(str(self.input_path))
        except (ImportError, OSError):
            pass

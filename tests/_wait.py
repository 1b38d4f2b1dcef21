"""Waiting for an event in a test: the condition itself, polled, never a sleep long enough."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Returns once `condition()` holds; after `timeout` s the test fails, naming `what`
    (`pytest.fail`: also an error a draft pool passes on to every task, not one it retries)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.002)

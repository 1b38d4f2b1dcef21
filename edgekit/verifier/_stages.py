"""`StageTimes`: where the verifier's time goes, stage by stage.

A call (one RPC through `VerifierService.call`) is timed on the thread that serves it: it
begins, the code it passes through ends each stage with `mark`, and what is left when it
ends goes to its last stage. A verify round passes through:

    decode   the request parsed and converted (protobuf in)
    checks   the session found and locked, the block checked, the round's objective
    submit   the scheduler's admission (`Scheduler.submit`) and the engine thread woken
    queue    waiting for a batch to take it, until that batch is dispatched
    engine   the batch it ran in, on the engine (`Engine.run_batch`)
    handoff  the rest of the wait: the engine thread's work around the run (its forecast,
             the statistics, the scheduler's update) and the switch back to this thread
    accept   the verdict: acceptance, the session's tokens, budgets, serving statistics
    answer   the answer converted (protobuf out); for a call that never reaches the
             engine, everything after `decode`

What gRPC takes around a call (the handler's thread, reading the request, writing the
answer) is outside it: a client sees that as its round trip less the call's time.

The engine core's thread counts its own loop too, a "step" per batch: idle (waiting for
work), schedule (`Scheduler.schedule`), plan (the batch's features and forecast), run,
record (statistics, estimator) and update (`Scheduler.update`, which wakes the callers).

Each thread adds to a table of its own, without a lock (a call costs a few
`perf_counter` reads and dict updates, ~2 us); `totals` sums the tables. Nothing here
changes what a call does: it is for operators and benchmarks (`benchmarks/serve_load.py`)
to see which stage sets the pace.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from time import perf_counter

__all__ = ["ENGINE_STEP", "StageTimes", "mark", "mark_wait"]

ENGINE_STEP = "engine step"  # what the engine core's loop is counted under, a call per batch

_current = threading.local()  # the call this thread is serving, if it is timed


class _Call:
    __slots__ = ("last", "previous", "seconds")

    def __init__(self, seconds: dict[str, float], previous: _Call | None) -> None:
        self.seconds = seconds  # its method's, on this thread: stage -> seconds, "" -> calls
        self.previous = previous
        self.last = perf_counter()

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def end(self, rest: str = "answer") -> None:
        """The call is over: the time since its last mark goes to `rest`."""
        mark(rest)
        self.add("", 1)
        _current.call = self.previous


def mark(stage: str) -> None:
    """Ends a stage of the call this thread serves: the time since its last mark goes to
    `stage`. Nothing where no call is timed (the engine thread, a test calling a part alone)."""
    call: _Call | None = getattr(_current, "call", None)
    if call is None:
        return
    now = perf_counter()
    call.add(stage, now - call.last)
    call.last = now


def mark_wait(dispatched: float, run_s: float) -> None:
    """Ends the wait for the engine, split: until `dispatched` (`perf_counter`, when its
    batch was dispatched) "queue", then `run_s` seconds "engine", the rest "handoff"."""
    call: _Call | None = getattr(_current, "call", None)
    if call is None:
        return
    now = perf_counter()
    waited = now - call.last
    queue = min(max(dispatched - call.last, 0.0), waited)
    engine = min(run_s, waited - queue)
    call.add("queue", queue)
    call.add("engine", engine)
    call.add("handoff", waited - queue - engine)
    call.last = now


class StageTimes:
    """Seconds per (call, stage) and calls per method, summed over the threads that served them."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._tables: list[dict[str, dict[str, float]]] = []  # a thread's: method -> stage -> seconds
        self._lock = threading.Lock()  # only a new thread's table is added under it

    def _seconds(self, method: str) -> dict[str, float]:
        table = getattr(self._local, "table", None)
        if table is None:
            table = self._local.table = {}
            with self._lock:
                self._tables.append(table)
        seconds = table.get(method)
        if seconds is None:
            seconds = table[method] = {}
        return seconds

    def begin(self, method: str) -> _Call:
        """Starts timing a call of `method` on this thread; end it with `.end()`."""
        call = _Call(self._seconds(method), getattr(_current, "call", None))
        _current.call = call
        return call

    def add(self, method: str, seconds: Mapping[str, float]) -> None:
        """Counts one call of `method` that took `seconds` by stage (the engine core's step)."""
        table = self._seconds(method)
        for stage, s in seconds.items():
            table[stage] = table.get(stage, 0.0) + s
        table[""] = table.get("", 0.0) + 1

    def totals(self) -> dict[str, dict[str, float]]:
        """{method: {"calls": n, stage: seconds, ...}}, summed over every thread so far."""
        with self._lock:
            tables = list(self._tables)
        out: dict[str, dict[str, float]] = {}
        for table in tables:
            for method, seconds in list(table.items()):  # copies: the thread may add a method or a stage
                per = out.setdefault(method, {"calls": 0.0})
                for stage, value in list(seconds.items()):
                    name = stage or "calls"
                    per[name] = per.get(name, 0.0) + value
        return out

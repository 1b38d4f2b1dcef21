"""More sessions than a llama.cpp context holds sequences: the rest parked, their KV kept aside.

A context holds at most a few hundred sequences (llama.cpp's `LLAMA_MAX_SEQ`, 256 in the vendored
version), and each costs `max_context` cells of KV memory whether its session is drafting or
idle. `SequenceSlots` maps the engine's sequences (one per session slot: as many as the verifier
has sessions) onto the context's (the resident ones): a batch's sequences are placed first, the
least recently used resident sequence not in the batch parked to make room, that is its KV
copied out of the context (llama.cpp's per-sequence state, a few hundred kB per hundred tokens on
a small model) and its cells freed; a parked sequence named again is loaded back into whichever
context sequence is free. Each context sequence is a stream of its own, its cells in position
order, so a sequence loaded back computes what it would have computed had it never left: the
verifier's exact numerics hold across parking (tested against the real target).

Up to a point, which the caller settles. A round's feed leaves the rows its verdict rejected in
the sequence, to be cut by the session's next feed; and llama.cpp writes a sequence's state
without the cells that its sliding-window layers no longer see from the last position (gemma 3:
five layers in six, a window of 512). A sequence parked holding rejected rows and cut back after
loading would miss that many cells at the far end of its window: past the window, the next logits
move (measured: by up to 2.9 on gemma at 1,500 tokens). So the caller says, once a verdict is
applied, where the sequence's next feed will start (`settle`); a sequence is cut there before it
is parked, and the least recently used *settled* sequence is parked first. A prompt or a turn (a
feed without outputs) settles itself at its end. Only where every candidate ran a round whose
verdict is not yet applied is one parked unsettled.

Rebuilding from the session's tokens would need no memory aside, and is bit-exact only when done
span by span as the session was built (`rebuild_feeds`, what a reopened session gets), but costs a
forward pass over the whole context per restore (hundreds of times the copy on a CPU: see the
serving-stack results), so parked KV is kept; its memory is what `max_sessions` x `max_context`
promised, held in the host's memory instead of the context's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

__all__ = ["SequenceSlots"]


@dataclass
class _Parked:
    state: np.ndarray | None  # the sequence's KV as llama.cpp serialises it (None: it held nothing)
    length: int  # tokens it holds once loaded back (a truncation while parked lowers it)


class SequenceSlots:
    """`n_seq` engine sequences over `resident` context sequences. The callbacks act on the
    context: `save(ctx_seq)` its state (None when empty), `load(state, ctx_seq)`, `remove(ctx_seq)`,
    `truncate(ctx_seq, length)`, `length(ctx_seq)`. With `resident >= n_seq` nothing is ever parked
    and sequence i is context sequence i."""

    def __init__(
        self,
        n_seq: int,
        resident: int,
        *,
        save: Callable[[int], np.ndarray | None],
        load: Callable[[np.ndarray, int], None],
        remove: Callable[[int], None],
        truncate: Callable[[int, int], None],
        length: Callable[[int], int],
    ) -> None:
        if n_seq < 1 or resident < 1:
            raise ValueError("an engine needs at least one sequence and one resident sequence")
        self.n_seq = n_seq
        self.resident = min(resident, n_seq)
        self._save, self._load, self._remove = save, load, remove
        self._truncate, self._length = truncate, length
        # engine sequence -> context sequence, least recently used first
        self._placed: OrderedDict[int, int] = OrderedDict()
        if self.resident == n_seq:
            self._placed.update((i, i) for i in range(n_seq))
        self._free = [] if self.resident == n_seq else list(range(self.resident - 1, -1, -1))
        self._parked: dict[int, _Parked] = {}
        self._settled: dict[int, int] = {}  # engine sequence -> where its next feed starts, as told
        self.parks = 0  # sequences parked so far
        self.loads = 0  # and loaded back
        self.parked_bytes = 0  # held aside now

    @property
    def parking(self) -> bool:
        """Whether sequences can be parked (more of them than the context holds)."""
        return self.resident < self.n_seq

    def groups(self, seqs: list[int]) -> list[list[int]]:
        """Indices into `seqs` (a batch's sequences, in order) cut into runs that name at most
        `resident` distinct sequences each: what one placement can hold at once."""
        out: list[list[int]] = []
        names: set[int] = set()
        for i, seq in enumerate(seqs):
            if not out or (seq not in names and len(names) == self.resident):
                out.append([])
                names = set()
            out[-1].append(i)
            names.add(seq)
        return out

    def place(self, seqs: Collection[int]) -> dict[int, int]:
        """Makes `seqs` (at most `resident` of them) resident, parking the least recently used
        others; their context sequences."""
        for seq in seqs:
            self._check(seq)
        if len(set(seqs)) > self.resident:
            raise ValueError(f"{len(set(seqs))} sequences at once; the context holds {self.resident}")
        for seq in seqs:
            if seq in self._placed:
                self._placed.move_to_end(seq)
        for seq in seqs:
            if seq in self._placed:
                continue
            ctx_seq = self._free.pop() if self._free else self._park_one(keep=seqs)
            parked = self._parked.pop(seq, None)
            if parked is not None and parked.state is not None:
                self.parked_bytes -= parked.state.nbytes
                self._load(parked.state, ctx_seq)
                self.loads += 1
                if self._length(ctx_seq) > parked.length:
                    self._truncate(ctx_seq, parked.length)
            self._placed[seq] = ctx_seq
        return {seq: self._placed[seq] for seq in seqs}

    def ran(self, seq: int, settles_at: int | None) -> None:
        """A feed ran on `seq`: it is settled at `settles_at` (a prompt's end), or unsettled until
        `settle` is called (a round's rows wait for their verdict)."""
        if settles_at is None:
            self._settled.pop(seq, None)
        else:
            self._settled[seq] = settles_at

    def settle(self, seq: int, length: int) -> None:
        """The sequence's next feed starts at `length`: cells past it are never read again. Safe
        from any thread (one assignment)."""
        self._settled[seq] = length

    def _park_one(self, keep: Collection[int]) -> int:
        candidates = [s for s in self._placed if s not in keep]  # least recently used first
        victim = next((s for s in candidates if s in self._settled), candidates[0])
        ctx_seq = self._placed.pop(victim)
        held = self._length(ctx_seq)
        settled = self._settled.get(victim)
        if settled is not None and settled < held:  # the rows its verdict rejected go first
            self._truncate(ctx_seq, settled)
            held = settled
        state = self._save(ctx_seq) if held else None
        self._remove(ctx_seq)
        if state is not None:
            self._parked[victim] = _Parked(state, held)
            self.parked_bytes += state.nbytes
            self.parks += 1
        return ctx_seq

    def length(self, seq: int) -> int:
        """Tokens the sequence holds, resident or parked."""
        self._check(seq)
        if seq in self._placed:
            return self._length(self._placed[seq])
        parked = self._parked.get(seq)
        return parked.length if parked is not None else 0

    def truncate(self, seq: int, length: int) -> None:
        self._check(seq)
        if seq in self._placed:
            self._truncate(self._placed[seq], length)
        elif seq in self._parked:
            parked = self._parked[seq]
            parked.length = min(parked.length, length)

    def release(self, seq: int) -> None:
        """Empties the sequence, resident or parked."""
        self._check(seq)
        self._settled.pop(seq, None)
        if seq in self._placed:
            self._remove(self._placed[seq])
        parked = self._parked.pop(seq, None)
        if parked is not None and parked.state is not None:
            self.parked_bytes -= parked.state.nbytes

    def _check(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq:
            raise ValueError(f"sequence {seq} is not one of the engine's {self.n_seq}")

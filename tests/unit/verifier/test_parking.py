"""More sessions than the target's context holds: `SequenceSlots` parks the least recently used
sequences and loads them back. Its bookkeeping over a fake context here; the real context's state,
bit for bit, in tests/integration/test_gemma_lossless.py (`test_sessions_parked_out_of_the_context_...`)."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.verifier.engine._parking import SequenceSlots


class FakeContext:
    """Context sequences as lists of tokens; a state is the list, serialised."""

    def __init__(self) -> None:
        self.cells: dict[int, list[int]] = {}

    def save(self, seq: int) -> np.ndarray:
        return np.array(self.cells.get(seq, []), dtype=np.uint8)

    def load(self, state: np.ndarray, seq: int) -> None:
        assert not self.cells.get(seq), "loaded into a sequence that holds cells"
        self.cells[seq] = state.tolist()

    def remove(self, seq: int) -> None:
        self.cells.pop(seq, None)

    def truncate(self, seq: int, length: int) -> None:
        self.cells[seq] = self.cells.get(seq, [])[:length]

    def length(self, seq: int) -> int:
        return len(self.cells.get(seq, []))


def _slots(n_seq: int, resident: int) -> tuple[SequenceSlots, FakeContext]:
    ctx = FakeContext()
    return SequenceSlots(n_seq, resident, save=ctx.save, load=ctx.load, remove=ctx.remove,
                         truncate=ctx.truncate, length=ctx.length), ctx


def _fill(slots: SequenceSlots, ctx: FakeContext, seq: int, tokens: list[int]) -> None:
    ctx.cells[slots.place([seq])[seq]] = list(tokens)


def test_with_room_for_every_sequence_nothing_moves():
    slots, _ = _slots(4, 8)
    assert not slots.parking and slots.resident == 4
    assert slots.place([3, 1]) == {3: 3, 1: 1}
    assert slots.parks == 0


def test_the_least_recently_used_sequence_is_parked_and_comes_back_whole():
    slots, ctx = _slots(5, 2)
    _fill(slots, ctx, 0, [1, 2, 3])
    _fill(slots, ctx, 1, [4, 5])
    slots.place([0])  # 0 used more recently than 1
    _fill(slots, ctx, 2, [6])  # parks 1, the least recently used
    assert (slots.parks, slots.loads) == (1, 0) and slots.parked_bytes == 2
    assert slots.length(1) == 2 and slots.length(0) == 3 and slots.length(4) == 0
    placed = slots.place([1, 2])  # 1 comes back into 0's sequence; 0 is parked in turn
    assert ctx.cells[placed[1]] == [4, 5] and ctx.cells[placed[2]] == [6]
    assert (slots.parks, slots.loads) == (2, 1) and slots.length(0) == 3
    assert ctx.cells[slots.place([0, 2])[0]] == [1, 2, 3]


def test_a_truncation_or_release_while_parked_holds_when_it_comes_back():
    slots, ctx = _slots(3, 1)
    _fill(slots, ctx, 0, [1, 2, 3, 4])
    _fill(slots, ctx, 1, [5, 6])  # parks 0
    slots.truncate(0, 2)
    assert slots.length(0) == 2
    assert ctx.cells[slots.place([0])[0]] == [1, 2]  # parks 1
    slots.release(1)
    assert slots.length(1) == 0 and slots.parked_bytes == 0
    assert ctx.cells.get(slots.place([1])[1], []) == []  # nothing to load back
    slots.release(1)  # resident and empty: nothing to do
    _fill(slots, ctx, 2, [])
    assert slots.length(0) == 2  # an empty sequence's place is taken without parking anything


def test_a_batch_is_cut_into_runs_the_context_can_hold_and_more_at_once_is_refused():
    slots, _ = _slots(6, 2)
    assert slots.groups([0, 1, 0, 2, 3, 3, 4]) == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError, match="holds 2"):
        slots.place([0, 1, 2])
    with pytest.raises(ValueError, match="not one of"):
        slots.place([6])
    with pytest.raises(ValueError):
        SequenceSlots(0, 1, save=None, load=None, remove=None, truncate=None, length=None)  # type: ignore[arg-type]


def test_the_config_refuses_a_negative_resident_count():
    from edgekit import ConfigError, ServerConfig

    assert ServerConfig().resident_sessions == 0  # all of max_sessions, up to what a context holds
    with pytest.raises(ConfigError, match="resident_sessions"):
        ServerConfig(resident_sessions=-1)


def test_the_least_recently_used_settled_sequence_goes_first_and_is_cut_where_it_settled():
    slots, ctx = _slots(4, 2)
    _fill(slots, ctx, 0, [1, 2, 3, 4, 5])  # a round ran: its verdict not yet applied
    _fill(slots, ctx, 1, [6, 7])
    slots.settle(1, 1)  # 1's next feed starts at 1: its second cell was a rejected row
    slots.place([0])
    slots.place([1])  # 0 is now the least recently used, but unsettled: 1 is parked, cut first
    _fill(slots, ctx, 2, [8])
    assert slots.length(1) == 1 and slots.length(0) == 5
    slots.ran(0, None)
    _fill(slots, ctx, 3, [9])  # no candidate settled: the least recently used goes
    assert slots.parks == 2

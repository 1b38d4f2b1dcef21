"""Device awareness: psutil readings, the GGUF sizing, the memory check before a load
(with fake memory readings), threads from physical cores, and the load in the stats."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import edgekit.runtime._device as device_mod
from edgekit.errors import ModelLoadError
from edgekit.runtime import (
    GGUFArray,
    default_threads,
    device_state,
    read_metadata,
)
from edgekit.testing import ToyLanguageModel, toy_client


def _gguf(kvs: list[tuple[str, int, bytes]]) -> bytes:
    """A GGUF header: version 3, no tensors, the given (key, type, encoded value) pairs."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, value in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    return out


def _str(s: str) -> bytes:
    return struct.pack("<Q", len(s)) + s.encode()


def test_the_device_state_reads_real_figures():
    state = device_state()
    assert 1 <= state.cores_physical <= state.cores_logical
    assert 1 <= state.cores_usable <= state.cores_logical
    assert 0 < state.memory_available_mb <= state.memory_total_mb
    assert state.process_rss_mb > 10  # this interpreter with numpy loaded
    assert set(state.as_dict()) >= {"temperature_c", "throttled", "battery_percent", "memory_limit_mb"}


def _topology(root, cpus: dict[int, tuple[int, int]]) -> None:
    for cpu, (package, core) in cpus.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")


def test_drafting_threads_follow_the_physical_cores_of_the_affinity(monkeypatch, tmp_path):
    monkeypatch.delenv("EDGEKIT_THREADS", raising=False)
    # 4 cores, 8 CPUs: CPU i and i + 4 are one core's two hyperthreads (as Linux numbers them)
    _topology(tmp_path, {i: (0, i % 4) for i in range(8)})
    monkeypatch.setattr(device_mod, "_CPU_SYS", tmp_path)
    monkeypatch.setattr(device_mod, "_affinity", lambda: list(range(8)))
    assert default_threads() == 4  # hyperthreads not counted
    monkeypatch.setattr(device_mod, "_affinity", lambda: [0, 1])
    assert default_threads() == 2  # two CPUs of two cores
    monkeypatch.setattr(device_mod, "_affinity", lambda: [0, 4])
    assert default_threads() == 1  # one core's two hyperthreads
    monkeypatch.setattr(device_mod, "_CPU_SYS", tmp_path / "nothing")  # no topology: psutil's counts
    monkeypatch.setattr(device_mod.psutil, "cpu_count", lambda logical=True: 8 if logical else 4)
    monkeypatch.setattr(device_mod, "_affinity", lambda: list(range(8)))
    assert default_threads() == 4
    monkeypatch.setenv("EDGEKIT_THREADS", "3")
    assert default_threads() == 3


def test_a_cgroup_limit_caps_the_memory_available(monkeypatch):
    monkeypatch.setattr(device_mod, "_cgroup_headroom", lambda: (124.0 * (1 << 20), 1024.0 * (1 << 20)))
    state = device_state()
    assert state.memory_limit_mb == pytest.approx(1024)
    assert state.memory_available_mb == pytest.approx(124)


def test_cgroup_headroom_counts_parents_and_not_the_page_cache(tmp_path):
    mb = 1 << 20
    parent, leaf = tmp_path / "slice", tmp_path / "slice" / "app"
    leaf.mkdir(parents=True)
    (tmp_path / "memory.max").write_text("max\n")
    (parent / "memory.max").write_text(f"{1024 * mb}\n")
    (parent / "memory.current").write_text(f"{900 * mb}\n")
    (parent / "memory.stat").write_text(f"anon 1\ninactive_file {300 * mb}\n")
    (leaf / "memory.max").write_text("max\n")
    (leaf / "memory.current").write_text(f"{500 * mb}\n")
    room, limit = device_mod._headroom(tmp_path, "/slice/app", "memory.max", "memory.current", "inactive_file")
    assert limit == 1024 * mb and room == (1024 - (900 - 300)) * mb  # the slice's limit, its droppable cache freed


def test_the_gguf_reader_reads_scalars_strings_and_array_lengths_and_stops_where_told(tmp_path):
    kvs = [
        ("general.architecture", 8, _str("toy")),
        ("toy.block_count", 4, struct.pack("<I", 6)),
        ("toy.rope.freq_base", 6, struct.pack("<f", 0.5)),
        ("toy.flag", 7, b"\x01"),
        ("toy.sizes", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 2, 3)),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + _str("a") + _str("bc")),
        ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 2)),
    ]
    path = tmp_path / "toy.gguf"
    path.write_bytes(_gguf(kvs))
    meta = read_metadata(path)
    assert meta == {"general.architecture": "toy", "toy.block_count": 6, "toy.rope.freq_base": 0.5, "toy.flag": True,
                    "toy.sizes": GGUFArray(5, 3), "tokenizer.ggml.tokens": GGUFArray(8, 2),
                    "tokenizer.ggml.bos_token_id": 2}
    assert list(read_metadata(path, until="tokenizer.")) == list(meta)[:5]
    assert read_metadata(path, {"toy.block_count"}) == {"toy.block_count": 6}
    path.write_bytes(_gguf(kvs)[:-3])  # cut short
    with pytest.raises(ModelLoadError, match="damaged"):
        read_metadata(path)
    path.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        read_metadata(path)


def test_the_gguf_reader_reads_the_items_of_the_arrays_it_is_asked_for(tmp_path):
    kvs = [
        ("toy.sizes", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3)),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + _str("a") + _str("bc")),
        ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + _str("a b")),
    ]
    path = tmp_path / "toy.gguf"
    path.write_bytes(_gguf(kvs))
    meta = read_metadata(path, items=("toy.sizes", "tokenizer.ggml.tokens"))
    assert meta["tokenizer.ggml.tokens"] == (b"a", b"bc") and meta["tokenizer.ggml.merges"] == GGUFArray(8, 1)
    assert meta["toy.sizes"].dtype == np.int32 and meta["toy.sizes"].tolist() == [1, -2, 3]
    path.write_bytes(_gguf(kvs)[:-6])  # the last string runs past the end
    with pytest.raises(ModelLoadError, match="damaged"):
        read_metadata(path, items=("tokenizer.ggml.merges",))


def test_the_stats_carry_the_device_load():
    with toy_client(ToyLanguageModel(seed=3, eos_bias=-8.0), max_tokens=16) as client:
        for stream in (client.generate([1, 2, 3]), client.generate_target_only([1, 2, 3])):
            device = stream.until_done().stats.to_dict()["device"]
            assert device["process_rss_mb"] > 10 and device["memory_available_mb"] > 0
            assert device["cpu_percent"] is not None and device["cpu_percent"] >= 0

"""Device awareness: psutil readings, the GGUF sizing, the memory check before a load
(with fake memory readings), threads from physical cores, and the load in the stats."""

from __future__ import annotations

import json
import struct
from collections import namedtuple
from textwrap import dedent

import numpy as np
import psutil
import pytest
from _transcript import normalise_json
from typer.testing import CliRunner

import edgekit.runtime._device as device_mod
from edgekit.cli.app import app
from edgekit.errors import InsufficientMemoryError, ModelLoadError
from edgekit.runtime import (
    KERNEL,
    DeviceState,
    LlamaDraftModel,
    LlamaPoolBackend,
    available_kernels,
    default_threads,
    device_state,
    model_memory_need,
)
from edgekit.runtime._gguf import GGUFArray, read_metadata
from edgekit.testing import ToyLanguageModel, toy_client

_Mem = namedtuple("_Mem", "total available percent used free")


def _fake_memory(monkeypatch, available_mb: float) -> None:
    real = psutil.virtual_memory()
    fake = _Mem(real.total, int(available_mb * (1 << 20)), 0.0, 0, 0)
    monkeypatch.setattr(device_mod.psutil, "virtual_memory", lambda: fake)


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


def test_a_draft_is_sized_from_its_file(gemma_paths, tmp_path):
    need = model_memory_need(gemma_paths[0], 4096, "gemma")
    assert need is not None
    # gemma-3-270m: 18 layers, 1 KV head of 256 for keys and values, fp16
    assert need.kv_bytes_per_token == 18 * 2 * 256 * 2
    assert need.weights == gemma_paths[0].stat().st_size
    (tmp_path / "junk.gguf").write_bytes(b"junk")
    assert model_memory_need(tmp_path / "junk.gguf", 4096, "junk") is None  # llama.cpp says what is wrong
    # a split GGUF weighs all its parts (the first holds the metadata; here a copy, and a 1 GB sparse part)
    first, second = tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"
    first.write_bytes(gemma_paths[0].read_bytes())
    with open(second, "wb") as f:
        f.truncate(1 << 30)
    assert model_memory_need(first, 4096, "split").weights == first.stat().st_size + (1 << 30)


def test_a_draft_that_does_not_fit_is_refused_before_loading(gemma_paths, monkeypatch):
    loads = []

    class Loaded(Exception):
        pass

    def load(*args, **kwargs):
        loads.append(args)
        raise Loaded

    monkeypatch.setattr("edgekit.runtime._draft.LlamaModel", load)
    monkeypatch.setattr("edgekit.runtime._pool.LlamaModel", load)
    _fake_memory(monkeypatch, 100)
    with pytest.raises(InsufficientMemoryError, match=r"needs about \d+ MB .* but 100 MB is available; free memory"):
        LlamaDraftModel(gemma_paths[0], name="gemma", n_ctx=4096)
    with pytest.raises(InsufficientMemoryError):
        LlamaPoolBackend(gemma_paths[0], slots=4, n_ctx_seq=1024)
    _fake_memory(monkeypatch, 250)  # the weights and buffers fit, and about 2,000 tokens of KV cache
    with pytest.raises(InsufficientMemoryError, match=r"a context of up to (\d+) tokens would fit") as info:
        LlamaDraftModel(gemma_paths[0], name="gemma", n_ctx=8192)
    fits = int(info.value.args[0].split("up to ")[1].split(" tokens")[0])
    assert 1500 < fits < 2500 and fits % 256 == 0
    with pytest.raises(InsufficientMemoryError, match=r"up to (\d+) tokens per sequence") as info:
        LlamaPoolBackend(gemma_paths[0], slots=4, n_ctx_seq=4096)
    per_slot = int(info.value.args[0].split("up to ")[1].split(" tokens")[0])
    assert per_slot == fits // 4 // 256 * 256 or abs(per_slot - fits / 4) <= 256  # the room shared by 4 slots
    assert loads == []  # llama.cpp was never asked
    monkeypatch.setenv("EDGEKIT_MEMORY_CHECK", "0")
    with pytest.raises(Loaded):
        LlamaDraftModel(gemma_paths[0], name="gemma", n_ctx=8192)  # the check skipped: the (stubbed) load runs
    assert len(loads) == 1


def test_the_stats_carry_the_device_load():
    with toy_client(ToyLanguageModel(seed=3, eos_bias=-8.0), max_tokens=16) as client:
        for stream in (client.generate([1, 2, 3]), client.generate_target_only([1, 2, 3])):
            device = stream.until_done().stats.to_dict()["device"]
            assert device["process_rss_mb"] > 10 and device["memory_available_mb"] > 0
            assert device["cpu_percent"] is not None and device["cpu_percent"] >= 0


@pytest.fixture()
def gemma_draft_only(gemma_paths, tmp_path, monkeypatch):
    """A model cache that holds the gemma pair's draft and nothing else, so which drafts it holds is known."""
    cache = tmp_path / "models"
    cache.mkdir()
    for path in (gemma_paths[0], gemma_paths[0].with_name(gemma_paths[0].name + ".json")):
        (cache / path.name).symlink_to(path)
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(cache))


def test_edgekit_device_prints_what_the_device_has(gemma_draft_only):
    result = CliRunner().invoke(app, ["device", "--json", "--context", "2048"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    # what this machine has, and whether the draft fits in the memory it has free now
    varying = {
        **dict.fromkeys(("cores_physical", "cores_logical", "cores_usable", "draft_threads", "context_that_fits"),
                        "<n>"),
        **dict.fromkeys(("memory_total_mb", "memory_available_mb", "memory_limit_mb", "process_rss_mb"), "<MB>"),
        **dict.fromkeys(("cpu_freq_mhz", "cpu_freq_max_mhz"), "<MHz>"),
        "load_1m": "<load>", "temperature_c": "<C>", "throttled": "<bool>", "battery_percent": "<%>",
        "on_battery": "<bool>", "logit_kernel": "<kernel>", "logit_kernels": "<kernels>", "fits": "<bool>",
    }
    assert normalise_json(result.stdout, varying) == dedent("""\
        {
          "cores_physical": "<n>",
          "cores_logical": "<n>",
          "cores_usable": "<n>",
          "memory_total_mb": "<MB>",
          "memory_available_mb": "<MB>",
          "memory_limit_mb": "<MB>",
          "cpu_freq_mhz": "<MHz>",
          "cpu_freq_max_mhz": "<MHz>",
          "load_1m": "<load>",
          "temperature_c": "<C>",
          "throttled": "<bool>",
          "battery_percent": "<%>",
          "on_battery": "<bool>",
          "process_rss_mb": "<MB>",
          "draft_threads": "<n>",
          "logit_kernel": "<kernel>",
          "logit_kernels": "<kernels>",
          "context": 2048,
          "drafts": [
            {
              "pair": "gemma-270m",
              "draft": "gemma-3-270m-q4_0",
              "in_cache": true,
              "needs_mb": 250.22528076171875,
              "fits": "<bool>",
              "context_that_fits": "<n>"
            },
            {
              "pair": "qwen-coder",
              "draft": "qwen2.5-coder-0.5b-instruct",
              "in_cache": false,
              "needs_mb": null,
              "fits": "<bool>",
              "context_that_fits": "<n>"
            }
          ]
        }
        """)
    out = json.loads(result.stdout)
    assert out["cores_physical"] >= 1 and out["draft_threads"] >= 1
    assert isinstance(out["drafts"][0]["fits"], bool) and out["drafts"][1]["fits"] is None


def test_edgekit_device_says_what_a_device_has(gemma_draft_only, monkeypatch):
    import edgekit.runtime

    snapshot = DeviceState(
        cores_physical=4, cores_logical=8, cores_usable=6, memory_total_mb=7820.4, memory_available_mb=5120.6,
        memory_limit_mb=6144.0, cpu_freq_mhz=1800.0, cpu_freq_max_mhz=2400.0, load_1m=1.254, temperature_c=61.34,
        throttled=False, battery_percent=83.0, on_battery=True, process_rss_mb=96.4,
    )
    monkeypatch.setattr(edgekit.runtime, "device_state", lambda: snapshot)
    monkeypatch.setenv("EDGEKIT_THREADS", "3")
    result = CliRunner().invoke(app, ["device"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    kernels = ", ".join(available_kernels()) or "numpy only, no compiled kernel"
    assert result.stdout == (
        "  cores          4 physical, 8 logical, 6 usable\n"
        "  memory         5121 MB available of 7820 MB (cgroup limit 6144 MB)\n"
        "  clock          1800 MHz (max 2400 MHz)\n"
        "  load (1 min)   1.25\n"
        "  temperature    61.3 C\n"
        "  throttled      no\n"
        "  battery        83%, on battery\n"
        "  this process   96 MB resident\n"
        "  draft threads  3 (EDGEKIT_THREADS overrides)\n"
        f"  logit kernel   {KERNEL} (this CPU runs: {kernels})\n"
        "  drafts at a 4096-token context:\n"
        "    gemma-270m   gemma-3-270m-q4_0              needs ~286 MB: fits\n"
        "    qwen-coder   qwen2.5-coder-0.5b-instruct    not in the cache (edgekit models pull qwen-coder)\n"
    )

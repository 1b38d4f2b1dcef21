"""Device awareness: psutil readings, the GGUF sizing, the memory check before a load
(with fake memory readings), threads from physical cores, and the load in the stats."""

from __future__ import annotations

import json
from collections import namedtuple
from textwrap import dedent

import psutil
import pytest
from _transcript import normalise_json
from typer.testing import CliRunner

import edgekit.runtime._device as device_mod  # private: psutil's readings replaced where the sizing reads them
from edgekit.cli.app import app
from edgekit.errors import InsufficientMemoryError
from edgekit.runtime import (
    KERNEL,
    DeviceState,
    LlamaDraftModel,
    LlamaPoolBackend,
    available_kernels,
    model_memory_need,
)

_Mem = namedtuple("_Mem", "total available percent used free")


def _fake_memory(monkeypatch, available_mb: float) -> None:
    real = psutil.virtual_memory()
    fake = _Mem(real.total, int(available_mb * (1 << 20)), 0.0, 0, 0)
    monkeypatch.setattr(device_mod.psutil, "virtual_memory", lambda: fake)


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

    # private: loads counted where each module calls llama.cpp
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

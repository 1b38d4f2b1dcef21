"""What the device has and how it is doing: cores, memory, clock, heat, power, footprint.

Read with psutil where it reports a figure, and from the kernel where psutil does not:
the memory limit of the process's cgroup (a container or a systemd slice may allow far
less than the machine has), and a Raspberry Pi's firmware throttling flags. A figure the
OS does not report is None, never a guess.

`physical_cores()` is what llama.cpp should run on (a second hyperthread of a core adds
little to a memory-bound decode); `check_memory()` refuses a model that would not fit
before llama.cpp tries, naming what would.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import psutil

from ..errors import InsufficientMemoryError, ModelLoadError
from ._gguf import read_metadata, split_parts

__all__ = [
    "DeviceLoad",
    "DeviceState",
    "MemoryNeed",
    "check_memory",
    "device_load",
    "device_state",
    "ensure_fits",
    "model_memory_need",
    "physical_cores",
    "process_cpu_seconds",
]

T = TypeVar("T")
_MB = 1 << 20
# llama.cpp's compute and output buffers beside weights and KV cache: 40-43 MB measured for
# both drafts (gemma-3-270m q4_0, qwen2.5-coder-0.5b) at the batch sizes edgekit uses
_BUFFERS = 64 * _MB
_CPU_SYS = Path("/sys/devices/system/cpu")
_RPI_THROTTLED = Path("/sys/devices/platform/soc/soc:firmware/get_throttled")


@dataclass(frozen=True)
class DeviceState:
    """A snapshot of the device (`edgekit device`)."""

    cores_physical: int
    cores_logical: int
    cores_usable: int  # this process's CPU affinity
    memory_total_mb: float
    memory_available_mb: float  # the least of the system's and the cgroup's headroom
    memory_limit_mb: float | None  # the cgroup's limit, where one is set
    cpu_freq_mhz: float | None
    cpu_freq_max_mhz: float | None
    load_1m: float | None  # runnable processes, averaged over a minute
    temperature_c: float | None  # the hottest sensor
    throttled: bool | None  # the OS says the CPU is held back now (Raspberry Pi firmware)
    battery_percent: float | None
    on_battery: bool | None
    process_rss_mb: float

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DeviceLoad:
    """How busy the device was over a generation (in `GenerationStats.device`)."""

    cpu_percent: float | None  # this process's CPU time over the wall time, 100 = one core busy
    process_rss_mb: float
    memory_available_mb: float
    temperature_c: float | None
    throttled: bool | None

    def as_dict(self) -> dict:
        return asdict(self)


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on: distinct (package, core) pairs of
    its affinity in /sys's topology; elsewhere psutil's count, scaled to the affinity."""
    cpus = _affinity()
    cores: set[tuple[float, float]] = set()
    for cpu in cpus:
        topo = _CPU_SYS / f"cpu{cpu}" / "topology"
        package, core = _read_number(topo / "physical_package_id"), _read_number(topo / "core_id")
        if package is None or core is None:
            cores.clear()
            break
        cores.add((package, core))
    if cores:
        return len(cores)
    usable = len(cpus)
    physical = psutil.cpu_count(logical=False) or psutil.cpu_count() or usable
    logical = psutil.cpu_count() or usable
    return max(1, min(usable, math.ceil(physical * usable / logical)))


def device_state() -> DeviceState:
    mem = psutil.virtual_memory()
    available, limit = _available(mem.available)
    freq = _safe(psutil.cpu_freq)
    battery = _safe(psutil.sensors_battery)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return DeviceState(
        cores_physical=psutil.cpu_count(logical=False) or psutil.cpu_count() or 1,
        cores_logical=psutil.cpu_count() or 1,
        cores_usable=_usable_cores(),
        memory_total_mb=mem.total / _MB,
        memory_available_mb=available / _MB,
        memory_limit_mb=limit / _MB if limit is not None else None,
        cpu_freq_mhz=freq.current if freq and freq.current else None,
        cpu_freq_max_mhz=freq.max if freq and freq.max else None,
        load_1m=load,
        temperature_c=_temperature(),
        throttled=_throttled(),
        battery_percent=battery.percent if battery else None,
        on_battery=(not battery.power_plugged) if battery and battery.power_plugged is not None else None,
        process_rss_mb=psutil.Process().memory_info().rss / _MB,
    )


def device_load(cpu_at_start: float | None, wall_seconds: float) -> DeviceLoad:
    """The load over the last `wall_seconds`, which began when `process_cpu_seconds()` read
    `cpu_at_start`."""
    busy = None
    now = process_cpu_seconds()
    if cpu_at_start is not None and now is not None and wall_seconds > 0:
        busy = 100.0 * (now - cpu_at_start) / wall_seconds
    available, _ = _available(psutil.virtual_memory().available)
    rss = psutil.Process().memory_info().rss
    return DeviceLoad(busy, rss / _MB, available / _MB, _temperature(), _throttled())


def process_cpu_seconds() -> float | None:
    times = _safe(psutil.Process().cpu_times)
    return times.user + times.system if times else None


@dataclass(frozen=True)
class MemoryNeed:
    """What loading a draft model needs: weights, and KV cache of `context` tokens at
    `kv_bytes_per_token`, plus llama.cpp's working buffers."""

    what: str
    weights: int
    context: int  # tokens of KV cache in all
    kv_bytes_per_token: float
    buffers: int
    sequences: int = 1  # a pool's slots share `context` equally

    @property
    def total(self) -> int:
        return int(self.weights + self.context * self.kv_bytes_per_token + self.buffers)

    def context_that_fits(self, available: float) -> int:
        """The most tokens per sequence that would fit in `available` bytes, in llama.cpp's steps of 256."""
        room = available - self.weights - self.buffers
        if self.kv_bytes_per_token <= 0 or room <= 0:
            return 0
        return int(room / self.kv_bytes_per_token / self.sequences) // 256 * 256


def model_memory_need(
    path: str | os.PathLike[str], context: int, what: str, *, sequences: int = 1
) -> MemoryNeed | None:
    """What loading the GGUF at `path` with `context` tokens of fp16 KV cache needs (every layer
    holding the whole context, as edgekit's contexts do); None if the file cannot be sized
    (llama.cpp then says what is wrong with it)."""
    try:
        meta = read_metadata(path, until="tokenizer.")
        arch = str(meta["general.architecture"])

        def num(key: str, default: int | None = None) -> int:
            value = meta.get(f"{arch}.{key}", default)
            # absent, an array, or no size at all (a damaged header's NaN)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise KeyError(key)
            return int(value)

        layers, width, heads = num("block_count"), num("embedding_length"), num("attention.head_count")
        kv_heads = num("attention.head_count_kv", heads)
        key = num("attention.key_length", width // heads)
        value = num("attention.value_length", width // heads)
        weights = sum(os.path.getsize(p) for p in split_parts(path))  # every part of a split GGUF
    except (OSError, ModelLoadError, KeyError, ZeroDivisionError):
        return None
    return MemoryNeed(what, weights, context, 2.0 * layers * kv_heads * (key + value), _BUFFERS, sequences)


def check_memory(need: MemoryNeed, *, available_mb: float | None = None) -> None:
    """Raises InsufficientMemoryError if `need` does not fit in the memory available now
    (`available_mb` in place of the device's reading, for tests)."""
    free = available_mb * _MB if available_mb is not None else _available(psutil.virtual_memory().available)[0]
    if need.total <= free:
        return
    fits = need.context_that_fits(free)
    per = " per sequence" if need.sequences > 1 else ""
    hint = (
        f"a context of up to {fits} tokens{per} would fit (EdgeClient(draft_context={fits}))"
        if fits >= 256
        else "free memory, or use a smaller draft model"
    )
    raise InsufficientMemoryError(
        f"{need.what} needs about {need.total / _MB:.0f} MB (weights {need.weights / _MB:.0f} MB, KV cache "
        f"{need.context * need.kv_bytes_per_token / _MB:.0f} MB for {need.context} tokens, buffers "
        f"{need.buffers / _MB:.0f} MB) but {free / _MB:.0f} MB is available; {hint}"
    )


def ensure_fits(path: str | os.PathLike[str], context: int, what: str, *, sequences: int = 1) -> None:
    """`check_memory` for a GGUF about to be loaded with `context` tokens of KV cache
    (EDGEKIT_MEMORY_CHECK=0 skips it: the estimate is an upper bound, a swap file is not counted)."""
    if os.environ.get("EDGEKIT_MEMORY_CHECK", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    need = model_memory_need(path, context, what, sequences=sequences)
    if need is not None:
        check_memory(need)


# -- readings psutil does not make -------------------------------------------------


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(psutil.cpu_count() or 1))


def _usable_cores() -> int:
    return len(_affinity())


def _available(system_available: float) -> tuple[float, float | None]:
    """Bytes available to this process (the system's, within its cgroups' headroom), and the
    tightest cgroup limit."""
    headroom, limit = _cgroup_headroom()
    if headroom is None:
        return float(system_available), None
    return min(float(system_available), headroom), limit


def _cgroup_headroom() -> tuple[float | None, float | None]:
    """The least headroom (limit less usage, page cache that can be dropped not counted as used)
    over this process's memory cgroup and its parents, v1's controller or v2's; and the tightest
    limit. (None, None) where no limit is set."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    v1 = v2 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    if v1 is not None:
        return _headroom(Path("/sys/fs/cgroup/memory"), v1, "memory.limit_in_bytes", "memory.usage_in_bytes",
                         "total_inactive_file")
    if v2 is not None:
        return _headroom(Path("/sys/fs/cgroup"), v2, "memory.max", "memory.current", "inactive_file")
    return None, None


def _headroom(
    root: Path, path: str, limit_file: str, usage_file: str, cache_key: str
) -> tuple[float | None, float | None]:
    leaf = root / path.lstrip("/")
    if not (leaf / limit_file).is_file():  # a container sees its own cgroup at the root
        leaf = root
    headroom = limit = None
    node = leaf
    while True:
        cap = _read_limit(node / limit_file)
        if cap is not None:
            used = (_read_number(node / usage_file) or 0.0) - _stat(node / "memory.stat", cache_key)
            room = max(0.0, cap - max(0.0, used))
            headroom = room if headroom is None else min(headroom, room)
            limit = cap if limit is None else min(limit, cap)
        if node == root or root not in node.parents:
            break
        node = node.parent
    return headroom, limit


def _stat(path: Path, key: str) -> float:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return float(value)
    except OSError:
        pass
    return 0.0


def _read_limit(path: Path) -> float | None:
    value = _read_number(path)
    return value if value is not None and value < (1 << 60) else None  # "max", or v1's huge "unlimited"


def _read_number(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return float(text) if text.isdigit() else None


def _temperature() -> float | None:
    read = getattr(psutil, "sensors_temperatures", None)
    sensors = _safe(read) if read else None
    temps = [t.current for entries in (sensors or {}).values() for t in entries if t.current and t.current > 0]
    return max(temps) if temps else None


def _throttled() -> bool | None:
    """A Raspberry Pi's firmware flags: under-voltage, frequency capped or throttled, now."""
    try:
        flags = int(_RPI_THROTTLED.read_text().strip(), 16)
    except (OSError, ValueError):
        return None
    return bool(flags & 0x7)


def _safe(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except (OSError, RuntimeError, NotImplementedError, AttributeError):
        return None

"""What a result was measured on: the CPU, the cores this process may use, the software and its
commit, the load on the machine at the start and at the end."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except ImportError:
        return None
    return getattr(mod, "__version__", None)


def _loadavg() -> str | None:
    try:
        with open("/proc/loadavg", encoding="utf-8") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def _edgekit_source() -> dict[str, Any] | None:
    """The git commit of the edgekit checkout that is imported, and whether its code differs from it."""
    import subprocess

    try:
        import edgekit

        root = Path(edgekit.__file__).resolve().parent.parent
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "status",
                "--porcelain",
                "--",
                "edgekit",
                "models",
                "predictors",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    return {"commit": head or None, "code_modified": bool(dirty)}


START: dict[str, Any] = {}  # the machine as print_machine first saw it


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cores = (
        len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count()
    )
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "llama_cpp": _version("llama_cpp"),
        "edgekit": _version("edgekit"),
        "edgekit_source": _edgekit_source(),
        "numpy": _version("numpy"),
        "edgekit_threads_env": os.environ.get("EDGEKIT_THREADS"),
        "loadavg": _loadavg(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def gpu_name() -> str | None:
    """The GPU's name, memory and driver as nvidia-smi says them; None where there is none."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def print_machine() -> None:
    m = machine()
    START.setdefault("loadavg", m["loadavg"])
    START.setdefault("edgekit_source", m["edgekit_source"])
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, python {m['python']}, llama_cpp {m['llama_cpp']}, "
        f"edgekit {m['edgekit']}, load {m['loadavg']}, {m['date']}",
        flush=True,
    )

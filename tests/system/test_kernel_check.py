"""The logit-statistics kernels as C, against a scalar reference (tests/kernels/check.c):
natively for this machine's kernels, and cross-compiled for aarch64 and run under
user-mode emulation (qemu) for the NEON kernel and the portable one.

The aarch64 run needs Debian's gcc-aarch64-linux-gnu and qemu-user-static; CI installs
them (.ci/run) and sets EDGEKIT_REQUIRE_ARM64=1, so there a missing tool fails the test
instead of skipping it. Emulation checks what the code computes, not how fast a real
ARM core runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from _paths import ROOT

CHECK = ROOT / "tests" / "kernels" / "check.c"
FLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Werror", "-Wno-unused-function"]  # as setup.py


def _build(cc: str, out: Path) -> Path:
    subprocess.run([cc, *FLAGS, "-I", str(ROOT / "edgekit" / "runtime"), str(CHECK), "-lm", "-o", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    return out


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def test_every_native_kernel_matches_the_scalar_reference(tmp_path):
    cc = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        pytest.skip("no C compiler")
    out = _run([str(_build(cc.split()[0], tmp_path / "check"))])
    from edgekit.runtime import _logitstats  # private: the compiled kernel itself, against the C reference

    assert out.strip().endswith("; 0 failures")
    assert f"kernels: {' '.join(_logitstats.KERNELS)};" in out  # the same kernels Python runs


def test_the_check_finds_planted_errors(tmp_path):
    """A kernel whose sum is off by 1e-5, whose argmax takes the second of a tie and whose blocks'
    maxima miss the row's last value must fail."""
    cc = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        pytest.skip("no C compiler")
    out = _run([str(_build(cc.split()[0], tmp_path / "check")), "selftest"])
    assert "FAIL planted" in out and " sum " in out and " argmax " in out and " blocks " in out


def test_the_aarch64_kernels_match_the_scalar_reference_under_emulation(tmp_path):
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64-static") or shutil.which(
        "qemu-aarch64")
    if cc is None or qemu is None:
        if os.environ.get("EDGEKIT_REQUIRE_ARM64") == "1":
            pytest.fail("EDGEKIT_REQUIRE_ARM64=1 but gcc-aarch64-linux-gnu or qemu-user-static is missing")
        pytest.skip("no aarch64 cross compiler or qemu (apt install gcc-aarch64-linux-gnu qemu-user-static)")
    binary = _build(cc, tmp_path / "check-arm64")
    assert binary.read_bytes()[:4] == b"\x7fELF" and binary.read_bytes()[18] == 183  # e_machine EM_AARCH64
    out = _run([qemu, "-L", "/usr/aarch64-linux-gnu", str(binary)])
    assert "kernels: neon baseline; best neon; 0 failures" in out

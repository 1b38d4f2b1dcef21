"""`benchmarks/figures.py` redraws every figure the README shows from the stored results."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_figure_the_readme_shows_is_redrawn_from_stored_results(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "figures.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = set(re.findall(r"\]\(benchmarks/results/([\w.-]+\.png)\)", (ROOT / "README.md").read_text()))
    assert len(shown) >= 3
    drawn = {p.name for p in tmp_path.glob("*.png")}
    assert shown <= drawn, f"shown in the README but not redrawn: {shown - drawn}"
    for name in drawn:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # a real image, not an empty canvas

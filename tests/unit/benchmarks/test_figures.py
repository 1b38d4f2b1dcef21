"""The figures the README and the documentation site show: each is a PNG its benchmark drew beside the
JSON it stored, and `benchmarks/figures.py` redraws every one the README shows from that JSON.

A figure is any link to a `.png` in README.md or a page of docs/, resolved from the file that links it
as GitHub and the site resolve it (`docs/figures` is a link to `benchmarks/results`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from _paths import ROOT

RESULTS = ROOT / "benchmarks" / "results"
PNG_LINK = re.compile(r"\]\(([^)\s]+\.png)\)")


def shown_figures(pages: list[Path]) -> dict[str, list[str]]:
    """{figure, as a path under benchmarks/results: [the pages that link it]} for `pages`."""
    shown: dict[str, list[str]] = {}
    for page in pages:
        for link in PNG_LINK.findall(page.read_text()):
            figure = (page.parent / link).resolve()
            where = f"{page.relative_to(ROOT)} -> {link}"
            assert figure.is_relative_to(RESULTS), f"{where}: not a figure under benchmarks/results"
            shown.setdefault(figure.relative_to(RESULTS).as_posix(), []).append(where)
    return shown


README = shown_figures([ROOT / "README.md"])
SHOWN = shown_figures([ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


def _is_a_real_image(path: Path) -> bool:
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000  # not an empty canvas


def test_the_extraction_finds_the_figures():
    # an extraction that found nothing would pass every check below vacuously
    assert "side_by_side_gemma-270m.png" in README
    assert len(SHOWN) >= 30 and "gpu/gpu_suite_h200_run1.png" in SHOWN


def test_every_figure_shown_was_drawn_beside_its_stored_result():
    for figure, where in SHOWN.items():
        png = RESULTS / figure
        assert png.is_file(), f"{where}: no such figure"
        assert _is_a_real_image(png), f"{where}: not a drawn figure"
        assert png.with_suffix(".json").is_file(), f"{where}: no stored result beside it ({figure[:-4]}.json)"


def test_figures_py_redraws_every_figure_the_readme_shows(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks", "figures", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    drawn = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")}
    assert set(README) <= drawn, f"shown in the README but not redrawn: {set(README) - drawn}"
    # and figures.py redraws nothing that no page shows any more
    assert drawn <= set(SHOWN), f"redrawn but shown nowhere: {drawn - set(SHOWN)}"
    for name in drawn:
        assert _is_a_real_image(tmp_path / name), name

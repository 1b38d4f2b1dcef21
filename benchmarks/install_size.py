"""What `pip install edgekit` puts on a device, and what each extra adds (issue 19).

Each install goes into a fresh virtual environment from this source tree (not editable);
the size is that of its site-packages less an empty environment's. llama-cpp-python comes
from pip's cache where it was built before (its compile is not what is measured here).

    python -m benchmarks install_size
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness as C

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("", "server", "train", "bench", "test")


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / (1 << 20)


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def packages(venv: Path) -> dict[str, float]:
    """Installed size of each top-level distribution, by its RECORD (MB)."""
    sizes: dict[str, float] = {}
    for record in site_packages(venv).glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0]
        total = 0
        for line in record.read_text().splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[2].isdigit():
                total += int(parts[2])
        sizes[name] = total / (1 << 20)
    return sizes


def main() -> None:
    ap = C.arguments(__doc__, threads=None)
    ap.add_argument("--extras", default=",".join(EXTRAS), help="comma-separated; empty for the client alone")
    ap.add_argument("--plot-only", action="store_true", help="redraw the figure from the JSON of an earlier run")
    args = C.parse(ap, machine=False)  # the machine is printed below, when something is measured
    if args.plot_only:
        import json

        path = C.RESULTS_DIR / "install_size.json"
        plot(json.loads(path.read_text())["rows"], path.with_suffix(".png"))
        return
    C.print_machine()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base_venv = Path(tmp) / "empty"
        subprocess.run([sys.executable, "-m", "venv", str(base_venv)], check=True)
        empty = size_mb(site_packages(base_venv))
        for extra in args.extras.split(","):
            venv = Path(tmp) / (extra or "client")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            spec = f"{ROOT}[{extra}]" if extra else str(ROOT)
            t0 = time.perf_counter()
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", spec], check=True)
            seconds = time.perf_counter() - t0
            total = size_mb(site_packages(venv)) - empty
            biggest = sorted(packages(venv).items(), key=lambda kv: -kv[1])[:8]
            rows.append({"extra": extra or "(client)", "mb": total, "install_s": seconds,
                         "largest": {k: round(v, 1) for k, v in biggest}})
            C.progress(f"{extra or 'client'}: {total:.0f} MB in {seconds:.0f} s; largest {rows[-1]['largest']}")
    client = rows[0]["mb"] if rows and rows[0]["extra"] == "(client)" else None
    for r in rows:
        r["added_mb"] = r["mb"] - client if client is not None else None
    print(C.table(["install", "MB", "added to the client, MB", "seconds"],
                  [[r["extra"], r["mb"], r["added_mb"], r["install_s"]] for r in rows]))
    path = C.write_result("install_size", {"rows": rows, "empty_venv_mb": empty})
    plot(rows, path.with_suffix(".png"))


def plot(rows: list[dict], path: Path) -> None:
    fig, (ax,) = C.subplots(1, width=6.0)
    bars = ax.bar([r["extra"] for r in rows], [r["mb"] for r in rows], color="#47a")
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("site-packages (MB), less an empty venv")
    ax.set_title("pip install edgekit[extra]")
    print(f"figure: {C.save_figure(fig, path)}")


if __name__ == "__main__":
    main()

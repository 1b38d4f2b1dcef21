"""Instructions in the innermost loops of each logit kernel, from a disassembly.

    aarch64-linux-gnu-gcc -O3 -fno-math-errno -fno-trapping-math -I edgekit/runtime \\
        tests/kernels/check.c -lm -o check-arm64
    aarch64-linux-gnu-objdump -d --no-show-raw-insn check-arm64 > check-arm64.s
    python tests/kernels/inner_loops.py check-arm64.s kernel_neon kernel_base

A loop is a backward branch within a function; an innermost one holds no other. Only the
loops doing the kernels' arithmetic are printed (an fmla, fmax or fcmgt in them, and no
float-to-double widening, which is the per-chunk flush), with the logits each iteration
reads (U accumulator sets of 4 lanes: 16 in the first pass, 8 in the fused one).
Emulated time under qemu is no guide to a real core: qemu runs fmax and fmin through
soft-float helpers and compares and selects as host vector operations.
"""

from __future__ import annotations

import re
import sys


def functions(text: str) -> dict[str, list[tuple[int, str, str]]]:
    out: dict[str, list[tuple[int, str, str]]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^([0-9a-f]+) <(\w+)>:", line)
        if head:
            current = head.group(2)
            out[current] = []
            continue
        ins = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if ins and current:
            out[current].append((int(ins.group(1), 16), ins.group(2), ins.group(3)))
    return out


def inner_loops(code: list[tuple[int, str, str]]) -> list[list[tuple[int, str, str]]]:
    loops = []
    for addr, op, arg in code:
        target = re.search(r"\b([0-9a-f]+) <", arg)
        if op.startswith("b") and op not in ("bl", "blr", "br") and target:
            start = int(target.group(1), 16)
            if code[0][0] <= start < addr:
                loops.append((start, addr))
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    return [[i for i in code if a <= i[0] <= b] for a, b in inner]


def main() -> None:
    with open(sys.argv[1]) as f:
        code = functions(f.read())
    for name in sys.argv[2:]:
        print(name)
        for body in inner_loops(code[name]):
            ops: dict[str, int] = {}
            for _, op, _ in body:
                ops[op] = ops.get(op, 0) + 1
            if any(k in ops for k in ("fmla", "fmax", "fmaxnm", "fcmgt")) and "fcvtl" not in ops and len(body) > 10:
                kind = "fused" if "fmla" in ops else "first pass"
                spills = ops.get("ldr", 0) + ops.get("str", 0) + ops.get("ldp", 0) + ops.get("stp", 0)
                minmax = sum(ops.get(k, 0) for k in ("fmax", "fmin", "fmaxnm", "fminnm"))
                print(f"  {kind:<10} at {body[0][0]:x}: {len(body)} instructions, {ops.get('fmla', 0)} fmla, "
                      f"{minmax} fmax/fmin(nm), {ops.get('fcmgt', 0)} fcmgt, "
                      f"{ops.get('bsl', 0) + ops.get('bit', 0) + ops.get('bif', 0)} bsl/bit/bif, {spills} loads/stores")


if __name__ == "__main__":
    main()

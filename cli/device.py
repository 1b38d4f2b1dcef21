"""`edgekit device`: what this device has, how it is doing, and which drafts fit on it."""

from __future__ import annotations

import typer

from ._common import print_json


def device(
    context: int = typer.Option(4096, "--context", min=64, help="Draft context (tokens) to size the drafts for."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Cores, memory, clock, temperature, throttling, battery, the threads and logit kernel drafting
    will use, and whether each registered pair's draft fits in the memory available now."""
    from edgekit.models import is_present, list_pairs, model_path
    from edgekit.runtime import KERNEL, available_kernels, default_threads, device_state, model_memory_need

    state = device_state()
    kernels = list(available_kernels())
    drafts = []
    for pair in list_pairs():
        present = is_present(pair.draft)
        need = model_memory_need(model_path(pair.draft), context, pair.draft) if present else None
        drafts.append(
            {
                "pair": pair.name,
                "draft": pair.draft,
                "in_cache": present,
                "needs_mb": need.total / (1 << 20) if need else None,
                "fits": need.total / (1 << 20) <= state.memory_available_mb if need else None,
                "context_that_fits": need.context_that_fits(state.memory_available_mb * (1 << 20)) if need else None,
            }
        )
    out = {
        **state.as_dict(),
        "draft_threads": default_threads(),
        "logit_kernel": KERNEL,
        "logit_kernels": kernels,
        "context": context,
        "drafts": drafts,
    }
    if json_out:
        print_json(out)
        return
    unknown = "not reported"

    def fmt(value: object, unit: str = "", digits: int = 0) -> str:
        if value is None:
            return unknown
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:.{digits}f}{unit}"
        return f"{value}{unit}"

    limit = f" (cgroup limit {state.memory_limit_mb:.0f} MB)" if state.memory_limit_mb else ""
    rows = [
        ("cores", f"{state.cores_physical} physical, {state.cores_logical} logical, {state.cores_usable} usable"),
        ("memory", f"{state.memory_available_mb:.0f} MB available of {state.memory_total_mb:.0f} MB{limit}"),
        ("clock", f"{fmt(state.cpu_freq_mhz, ' MHz')} (max {fmt(state.cpu_freq_max_mhz, ' MHz')})"),
        ("load (1 min)", fmt(state.load_1m, "", 2)),
        ("temperature", fmt(state.temperature_c, " C", 1)),
        ("throttled", fmt(state.throttled)),
        ("battery", unknown if state.battery_percent is None else
         f"{state.battery_percent:.0f}%{', on battery' if state.on_battery else ', plugged in'}"),
        ("this process", f"{state.process_rss_mb:.0f} MB resident"),
        ("draft threads", f"{out['draft_threads']} (EDGEKIT_THREADS overrides)"),
        ("logit kernel", f"{KERNEL} (this CPU runs: {', '.join(kernels) or 'numpy only, no compiled kernel'})"),
    ]
    for name, value in rows:
        typer.echo(f"  {name:<14} {value}")
    typer.echo(f"  drafts at a {context}-token context:")
    for d in drafts:
        if not d["in_cache"]:
            status = f"not in the cache (edgekit models pull {d['pair']})"
        elif d["needs_mb"] is None:
            status = "cannot be sized"
        else:
            verdict = "fits" if d["fits"] else f"does NOT fit (a context of {d['context_that_fits']} tokens would)"
            status = f"needs ~{d['needs_mb']:.0f} MB: {verdict}"
        typer.echo(f"    {d['pair']:<12} {d['draft']:<30} {status}")

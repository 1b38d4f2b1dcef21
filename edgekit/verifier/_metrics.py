"""The verifier's Prometheus endpoint: `ServingStats` as Prometheus text over HTTP.

prometheus-client is optional (`pip install 'edgekit[server]'`) and imported
only when an endpoint is asked for. Each endpoint has a registry of its own,
holding one collector that reads a `StatsSnapshot` at scrape time, so nothing
lands in prometheus_client's global registry and two verifiers in one process
each export their own figures.

Names start with `edgekit:`. The speculative-decoding counters carry the names
vLLM gives them (`edgekit:spec_decode_num_drafts_total`, ...), so dashboards
built for vLLM read them; times are in seconds, as Prometheus has them.
prometheus_client appends `_total` to a counter family's name, so the families
below are named without it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from itertools import accumulate
from typing import TYPE_CHECKING

from ..errors import ConfigError, DependencyMissingError
from ._stats import Histogram, ServingStats

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import Metric

    from ._budgets import Budgets

__all__ = ["BATCH_ROWS_BUCKETS", "BATCH_SIZE_BUCKETS", "BUDGET_BUCKETS", "MetricsEndpoint", "StatsCollector",
           "check_installed"]

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # works per batch
BUDGET_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # draft tokens a session may send
BATCH_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)  # rows per batch


def check_installed() -> None:
    """Raises `DependencyMissingError` without prometheus-client."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise DependencyMissingError("prometheus-client", "server") from exc


class StatsCollector:
    """A prometheus_client collector over `stats`: every scrape reads a fresh snapshot. With
    `budgets` (a verifier that assigns draft budgets, GOODSPEED), their figures too."""

    def __init__(self, stats: ServingStats, budgets: Budgets | None = None) -> None:
        self.stats = stats
        self.budgets = budgets

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self.stats.snapshot()

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"edgekit:{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"edgekit:{name}", doc, value=value)

        yield gauge("queue_depth", "Works waiting for the engine.", s.queue_depth)
        yield gauge("sessions", "Sessions open (target-only generations included).", s.sessions)

        for name, doc, by, bounds in (
            ("batch_size", "Works per engine batch.", s.batch_sizes, BATCH_SIZE_BUCKETS),
            ("batch_rows", "Rows (tokens) per engine batch.", s.batch_rows, BATCH_ROWS_BUCKETS),
        ):
            h = HistogramMetricFamily(f"edgekit:{name}", doc)
            h.add_metric([], *_buckets(_binned(by, bounds)))
            yield h
        yield counter("engine_seconds", "Time the engine spent running batches.", s.engine_s)
        yield counter(
            "engine_estimated_batches", "Batches the verification-time estimator had a forecast for.",
            s.estimated_batches,
        )
        yield counter("engine_estimated_seconds", "The estimator's forecasts for those batches.", s.estimated_s)
        yield counter(
            "engine_estimate_error_seconds", "Sum over those batches of |forecast - measured run time|.",
            s.estimate_error_s,
        )

        yield counter("spec_decode_num_drafts", "Verified blocks with at least one draft token.", s.drafts)
        yield counter("spec_decode_num_draft_tokens", "Draft tokens verified.", s.draft_tokens)
        yield counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.", s.accepted_tokens)
        per_pos = CounterMetricFamily(
            "edgekit:spec_decode_num_accepted_tokens_per_pos",
            "Blocks whose draft token at this position (from 0) was accepted.",
            labels=["position"],
        )
        for i, n in enumerate(s.accepted_per_position):
            per_pos.add_metric([str(i)], n)
        yield per_pos
        yield counter("semantic_rounds", "Rounds verified in semantic mode (lossy, WISV).", s.semantic_rounds)
        yield counter(
            "semantic_accepted_mismatches",
            "Mismatches the semantic decision head accepted (draft tokens that are not the target's choice).",
            s.semantic_accepted,
        )

        yield counter(
            "committed_tokens", "Tokens committed by verdicts and target-only steps (goodput's numerator).",
            s.committed_tokens,
        )
        yield counter("generated_tokens", "Of those, tokens committed by target-only steps (Generate).",
                      s.generated_tokens)
        yield gauge(
            "goodput_tokens_per_second",
            f"Committed tokens per second over the last {self.stats.window_s:g} s (since start when shorter).",
            s.goodput,
        )

        classes = sorted(s.classes.items())
        for name, doc, value in (
            ("slo_rounds", "Speculative rounds verified, by SLO class.", lambda c: c.rounds),
            ("slo_deadline_rounds", "Rounds that had a deadline, by SLO class.", lambda c: c.with_deadline),
            ("slo_violations", "Rounds answered after their deadline, by SLO class.", lambda c: c.missed),
            ("slo_committed_tokens", "Tokens committed, by SLO class.", lambda c: c.committed_tokens),
        ):
            family = CounterMetricFamily(f"edgekit:{name}", doc, labels=["slo_class"])
            for cls, c in classes:
                family.add_metric([cls], value(c))
            yield family
        ratio = GaugeMetricFamily(
            "edgekit:slo_violation_ratio", "Violations over rounds that had a deadline, by SLO class.",
            labels=["slo_class"],
        )
        for cls, c in classes:
            ratio.add_metric([cls], c.violation_ratio)
        yield ratio
        for name, doc, hist in (
            ("queue_time_seconds", "A round's wait for the engine, by SLO class.", lambda c: c.queue_s),
            ("verify_time_seconds", "A round's time being verified, by SLO class.", lambda c: c.verify_s),
        ):
            h = HistogramMetricFamily(f"edgekit:{name}", doc, labels=["slo_class"])
            for cls, c in classes:
                h.add_metric([cls], *_buckets(hist(c)))
            yield h
        if self.budgets is not None:
            yield from self._budget_metrics(self.budgets)

    @staticmethod
    def _budget_metrics(budgets: Budgets) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

        states = list(budgets.states().values())
        yield GaugeMetricFamily(
            "edgekit:budget_capacity", "Draft tokens per target pass shared among the active sessions (GOODSPEED's C).",
            value=budgets.last_capacity,
        )
        h = HistogramMetricFamily("edgekit:budget_tokens", "The draft budget each open session was last told.")
        h.add_metric([], *_buckets(_binned(Counter(st.told for st in states), BUDGET_BUCKETS)))
        yield h
        yield GaugeMetricFamily(
            "edgekit:budget_acceptance_estimate", "Mean over open sessions of their acceptance estimate (eq. 3).",
            value=sum(st.alpha for st in states) / len(states) if states else float("nan"),
        )


def _binned(counts: Mapping[int, int], bounds: tuple[int, ...]) -> Histogram:
    """Exact counts by integer value as a histogram over `bounds`."""
    per = [0] * (len(bounds) + 1)
    total = 0
    for value, n in counts.items():
        per[next((i for i, b in enumerate(bounds) if value <= b), len(bounds))] += n
        total += value * n
    return Histogram(tuple(float(b) for b in bounds), tuple(accumulate(per)), float(total))


def _buckets(h: Histogram) -> tuple[list[tuple[str, float]], float]:
    """Prometheus' (le, cumulative count) pairs, ending in +Inf, and the sum."""
    from prometheus_client.utils import floatToGoString  # how its own histograms write `le`

    les = [floatToGoString(b) for b in h.bounds] + ["+Inf"]
    return list(zip(les, map(float, h.cumulative))), h.sum


class MetricsEndpoint:
    """`stats` served as Prometheus text at http://host:port/metrics (port 0: a free one),
    from a thread of its own until `close`."""

    def __init__(self, stats: ServingStats, host: str, port: int, budgets: Budgets | None = None) -> None:
        check_installed()
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatsCollector(stats, budgets))
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; choose another --metrics-port"
            ) from None
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.port: int = server.server_port
        self.address = f"{host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)

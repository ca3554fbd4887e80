"""Prometheus metrics of one server app (``GET /metrics``; docs/server.md "Metrics"): request
counts by endpoint and status, tokens, forward passes and latencies per method, and gauges read
from the pool at scrape time."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from relaxspec.engine import GenerationResult, GenerationStats
from relaxspec.serve.jobs import Job
from relaxspec.serve.pool import ServingPool

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}  # metrics label


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can share a process)."""

    def __init__(self, pool: ServingPool) -> None:
        self.registry = CollectorRegistry()
        self.pool = pool
        self._lock = threading.Lock()
        self._totals: dict[str, GenerationStats] = {}  # per method, over completed requests
        r = self.registry
        self.http_requests = Counter(
            "relaxspec_http_requests",
            "Generation requests by endpoint and HTTP status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "relaxspec_prompt_tokens", "Prompt tokens of completed requests", ["method"], registry=r
        )
        self.completion_tokens = Counter(
            "relaxspec_completion_tokens", "New tokens of completed requests", ["method"], registry=r
        )
        self.verifier_calls = Counter(
            "relaxspec_verifier_calls",
            "Verifier forward passes of completed requests",
            ["method"],
            registry=r,
        )
        self.draft_calls = Counter(
            "relaxspec_draft_calls", "Proposer forward passes of completed requests", ["method"], registry=r
        )
        self.latency = Histogram(
            "relaxspec_request_latency_seconds",
            "End-to-end latency of completed requests",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "relaxspec_time_to_first_token_seconds",
            "Time from request arrival to the first committed token",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        r.register(self)  # collect(): gauges read at scrape time

    def request_done(self, endpoint: str, status: int | str) -> None:
        self.http_requests.labels(endpoint, str(status)).inc()

    def generation_done(self, job: Job, result: GenerationResult, latency: float, ttft: float | None) -> None:
        s, m = result.stats, job.method
        self.prompt_tokens.labels(m).inc(job.prompt_tokens)
        self.completion_tokens.labels(m).inc(s.new_tokens)
        self.verifier_calls.labels(m).inc(s.verifier_calls)
        self.draft_calls.labels(m).inc(s.draft_calls)
        self.latency.labels(m).observe(latency)
        if ttft is not None:
            self.ttft.labels(m).observe(ttft)
        with self._lock:
            self._totals[m] = self._totals.get(m, GenerationStats()).merge(s)

    def collect(self) -> Iterable[Any]:
        """Gauges and pool counters computed at scrape time."""
        active = GaugeMetricFamily("relaxspec_active_sequences", "Sequences being decoded now")
        active.add_metric([], self.pool.active)
        yield active
        queued = GaugeMetricFamily("relaxspec_queued_requests", "Requests waiting for a decoding slot")
        queued.add_metric([], self.pool.waiting)
        yield queued
        tau = GaugeMetricFamily(
            "relaxspec_tau", "Tokens per verifier call (tau) over completed requests", labels=["method"]
        )
        with self._lock:
            for method, total in sorted(self._totals.items()):
                tau.add_metric([method], total.tau)
        yield tau
        chosen = CounterMetricFamily(
            "relaxspec_draft_length_cycles",
            "Cycles per draft length chosen by the adaptive policy (K = 0: an AR step)",
            labels=["policy", "k"],
        )
        for policy, counts in sorted(self.pool.draft_length_stats().items()):
            for k, cycles in counts.items():
                chosen.add_metric([policy, str(k)], cycles)
        yield chosen
        outcomes = CounterMetricFamily(
            "relaxspec_pool_requests", "Requests seen by the serving pool by outcome", labels=["outcome"]
        )
        stats = self.pool.stats
        for outcome in ("completed", "failed", "cancelled", "rejected"):
            outcomes.add_metric([outcome], getattr(stats, outcome))
        yield outcomes

    def render(self) -> bytes:
        return generate_latest(self.registry)

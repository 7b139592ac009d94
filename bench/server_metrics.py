"""What an API server's own `/metrics` says a piece of work cost it: its CPU seconds
(`process_cpu_seconds_total`) and, on a Go server, the bytes it allocated
(`go_memstats_alloc_bytes_total`), each read before and after the work (bench/kdd.py: a dry run
against a plain paged JSON read of the same lists, issue 31's measure; goal at most 0.5 each)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench.dry_run import spread
from job.adapters.kube import Kube, api_client
from job.adapters.retry import RetryPolicy
from job.config import Config

T = TypeVar("T")

# What the server's /metrics says of its process, by the names the benches print.
COUNTERS = {"cpu": "process_cpu_seconds_total", "allocated": "go_memstats_alloc_bytes_total"}


class Scrape:
    """Reads an API server's `/metrics` with a kubeconfig's credentials (which must be allowed
    `get` on that non-resource URL: cluster-admin is), through the job's own client (Kube): a
    failure is its one-line KubeError."""

    def __init__(self, kubeconfig: Path) -> None:
        self._kube = Kube(api_client(Config(kubeconfig=(kubeconfig,))), RetryPolicy())

    def counters(self) -> dict[str, float]:
        """The COUNTERS the server reports now (one it does not report is left out)."""
        return parse(self._kube.request_bytes("GET", "/metrics", accept="text/plain").decode(errors="replace"))

    def cost(self, work: Callable[[], T]) -> tuple[T, dict[str, float]]:
        """`work`'s result, and how far each counter moved while it ran."""
        before = self.counters()
        result = work()
        after = self.counters()
        return result, {name: after[name] - before[name] for name in after.keys() & before.keys()}


def parse(text: str) -> dict[str, float]:
    """The COUNTERS in Prometheus' text format (each sample of a name summed, labels or not)."""
    wanted = {metric: name for name, metric in COUNTERS.items()}
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, rest = line.partition(" ")
        name = wanted.get(metric.partition("{")[0])
        if name is not None:
            found[name] = found.get(name, 0.0) + float(rest.split()[0])
    return found


def compared(runs: list[dict[str, float]], plain: list[dict[str, float]] | None = None) -> str:
    """Each counter's median over `runs` with its spread, and (given the plain read's runs) its
    ratio to theirs; a counter the server does not report is said as such."""
    parts = []
    for name, unit, scale in (("cpu", "s", 1.0), ("allocated", " GB", 1e9)):
        values = [run[name] / scale for run in runs if name in run]
        if not values or len(values) < len(runs):
            parts.append(f"no {COUNTERS[name]} in its /metrics")
            continue
        text = f"{name} {spread(values, unit)}"
        floor = statistics.median(run.get(name, 0.0) / scale for run in plain) if plain else 0.0
        if floor > 0:
            text += f", {statistics.median(values) / floor:.2f} of the plain read's (goal <= 0.5)"
        parts.append(text)
    return "; ".join(parts)

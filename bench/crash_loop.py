"""`make bench-crash-loop`: the dry run of a 5,000-host fleet (etcd v3) in which every calico-node
crash-loops, as when a fail-closed webhook stops them all (incident 2): each pod's previous log
is 200 lines of calico-node's start, ending in an address conflict. Every such log is read and
held until the run ends, so this is where the health check's memory goes. Each log's answer is
delayed by --log-latency-ms, for the kubelet the API server passes the request to (assumed, not
measured here: loopback answers in under a millisecond, which no kubelet does).

Prints, as medians with their spread over the runs: the job's wall time and peak RSS, and the
calico-node findings and their causes; with `--job-tree`, the same dry run of another checkout
beside it, alternated. Only loopback traffic.
"""

from __future__ import annotations

import argparse
import compileall
import statistics
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

from bench.dry_run import cluster, run_job
from bench.generate import datastore, load, orphan_indexes
from tests.support.kubeapi import KubeApiServer

# calico-node 3.x's start, in its own format: about 100 characters a line, 20.8 KB a log of 200.
START = (
    "[INFO][9] startup/startup.go 425: Early log level set to info",
    "[INFO][9] startup/utils.go 126: Using NODENAME environment for node name {node}",
    "[INFO][9] startup/utils.go 138: Determined node name: {node}",
    "[INFO][9] startup/startup.go 94: Starting node {node} with version v3.32.0",
    "[INFO][9] startup/startup.go 106: Setting NetworkUnavailable to true until BGP is up",
    "[INFO][9] startup/startup.go 459: Checking datastore connection",
    "[INFO][9] startup/startup.go 483: Datastore connection verified",
    "[INFO][9] startup/startup.go 110: Datastore is ready",
    "[INFO][9] startup/customresource.go 102: Error getting resource Key=GlobalFelixConfig(name=CalicoVersion)",
    "[INFO][9] startup/startup.go 1112: Using autodetected IPv4 address on interface eth0: {ip}/20",
)
CONFLICT = "[WARNING][9] startup/startup.go 1021: Calico node '{holder}' is already using the IPv4 address {ip}."


def previous_log(node: str, index: int, lines: int) -> str:
    """`lines` lines of repeated starts, the last of which found its address taken."""
    ip = f"10.{index // 250}.{index % 250}.10"
    body = [
        f"2026-11-30 11:{n // 60 % 60:02d}:{n % 60:02d}.{n % 1000:03d} "
        + START[n % len(START)].format(node=node, ip=ip)
        for n in range(lines - 2)
    ]
    conflict = CONFLICT.format(holder=f"old-{node}", ip=ip)
    return "\n".join([*body, f"2026-11-30 11:59:59.000 {conflict}", "2026-11-30 11:59:59.001 [INFO][9] Terminating"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--orphans", type=int, default=500)
    parser.add_argument("--log-lines", type=int, default=200, help="each previous log's lines (the job reads 200)")
    parser.add_argument("--log-latency-ms", type=float, default=10, help="each log's answer is delayed this long")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--job-tree", type=Path, help="another checkout of the job, run beside this one")
    options = parser.parse_args()
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "job", quiet=1)
    gone = orphan_indexes(options.hosts, options.orphans, "together")
    live = [index for index in range(options.hosts) if index not in gone]

    def crash_looping(kubeapi: KubeApiServer, node: str) -> None:
        log = previous_log(node, len(kubeapi.logs), options.log_lines)
        kubeapi.add_calico_node_pod(node, ready=False, restarts=12, waiting="CrashLoopBackOff", log=log)
        if len(kubeapi.logs) == 1:
            kubeapi.on("GET", r"/log$", partial(time.sleep, options.log_latency_ms / 1000), times=10**9)

    with cluster("calico-gc-crash-loop-", live, add_node=crash_looping) as (etcd, _, env, _):
        keys = load(etcd.url, datastore(options.hosts, options.orphans, 20))
        print(
            f"seeded {keys} keys ({options.hosts} hosts, {options.orphans} orphaned); "
            f"{len(live)} calico-nodes crash-loop, each log answered in {options.log_latency_ms:g} ms"
        )
        trees: dict[str, Path | None] = {"this job": None}
        if options.job_tree:
            compileall.compile_dir(options.job_tree / "job", quiet=1)
            trees[f"{options.job_tree}"] = options.job_tree
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        causes: dict[str, Counter[Any]] = {}
        for _ in range(options.repeat):
            for name, tree in trees.items():
                seconds, peak, code, report = run_job(env, ["--datastore-type", "etcdv3"], tree=tree)
                assert code == 0, f"{name}: exit {code}"
                runs[name].append((seconds, peak))
                causes[name] = Counter(entry["cause"] for entry in report["health"]["calico_node"])
        for name, measured in runs.items():
            walls, peaks = [m[0] for m in measured], [m[1] for m in measured]
            print(
                f"{name}: dry run {statistics.median(walls):.2f} s [{min(walls):.2f}-{max(walls):.2f}], "
                f"peak {statistics.median(peaks):.1f} MB [{min(peaks):.1f}-{max(peaks):.1f}]; "
                f"causes {dict(causes[name])}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What planning a gone host's removal costs, apart from everything around it.

A dry run with every orphan planned adds to the default one mostly the plan (docs/development.md),
and a whole run's noise on this VM (0.1-0.3 s) hides a change of a few tens of milliseconds in it.
This files the fleet's keys (bench/generate.py, the same layouts as `make bench`) as a read files
them (`etcdv3.build_inventory`, no etcd: each host whole), then times, in this process:
- `plan_run` with every orphan planned (`--max-deletions` the orphans): the triage, the IPAM
  index, each host's steps and the handle repairs;
- `host_steps` of each planned host alone: its IPAM release, then its keys.
Each is the best of `--repeat` (the cyclic collector frozen out of the way, as the job freezes
what its read made). With `--job-tree`, the same in another checkout, alternated run by run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _best(work: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        runs.append(time.perf_counter() - started)
    return min(runs)


def measure(options: argparse.Namespace) -> dict[str, float | str]:
    """The figures, with the `job` of the checkout in CALICO_GC_JOB_TREE (default: this one)."""
    sys.path.insert(0, os.environ.get("CALICO_GC_JOB_TREE", str(ROOT)))
    from bench.generate import datastore, host_name, orphan_indexes
    from job.adapters.datastores.etcdv3 import build_inventory
    from job.config import Config
    from job.core.model import KubeNode, StoredItem
    from job.core.plan import build_index, host_steps, plan_run

    started = time.perf_counter()
    keys = datastore(
        options.hosts,
        options.orphans,
        options.pods_per_host,
        shape=options.shape,
        hashed=options.container_ids == "hashed",
    )
    inventory = build_inventory((StoredItem(key, 1, value) for key, value in keys), lambda: 1)
    gone = orphan_indexes(options.hosts, options.orphans, options.shape)
    nodes = tuple(KubeNode(host_name(index)) for index in range(options.hosts) if index not in gone)
    filed = time.perf_counter() - started
    config = Config(grace_period=timedelta(0), max_orphan_fraction=1.0, max_deletions=options.orphans)
    now = datetime.now(UTC)
    plan = plan_run(inventory, nodes, {}, now, config)
    planned = [decision.host for decision in plan.decisions if decision.steps]
    index = build_index(inventory, plan.keep, plan.cooldown)
    gc.collect()
    gc.freeze()
    return {
        "job": str(Path(sys.modules["job"].__file__ or "").parent),
        "filed": filed,
        "planned": len(planned),
        "plan_run": _best(lambda: plan_run(inventory, nodes, {}, now, config), options.repeat),
        "host_steps": _best(lambda: [host_steps(host, index) for host in planned], options.repeat),
    }


def _in(tree: Path, argv: Sequence[str]) -> dict[str, float]:
    """measure() in a process of its own, whose `job` is `tree`'s (this checkout's bench around it)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.plan", *argv, "--inner"],
        cwd=ROOT,
        env={**os.environ, "CALICO_GC_JOB_TREE": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(done.stdout)
    if Path(figures.pop("job")).resolve() != tree / "job":
        raise SystemExit(f"the run meant for {tree} imported another checkout's job")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--orphans", type=int, default=500)
    parser.add_argument("--pods-per-host", type=int, default=20)
    parser.add_argument("--shape", default="namespaces", choices=("together", "spread", "namespaces"))
    parser.add_argument("--container-ids", default="hashed", choices=("counted", "hashed"))
    parser.add_argument("--repeat", type=int, default=7, help="timings of each, the best kept")
    parser.add_argument("--rounds", type=int, default=3, help="processes of each checkout, alternated")
    parser.add_argument("--job-tree", type=Path, help="another checkout of the job, to time beside this one")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.inner:
        print(json.dumps(measure(options)))
        return 0
    passed = [
        *("--hosts", str(options.hosts), "--orphans", str(options.orphans)),
        *("--pods-per-host", str(options.pods_per_host), "--shape", options.shape),
        *("--container-ids", options.container_ids, "--repeat", str(options.repeat)),
    ]
    trees = {"this checkout": ROOT, **({str(options.job_tree): options.job_tree.resolve()} if options.job_tree else {})}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(options.rounds):
        for name, tree in trees.items():
            results[name].append(_in(tree, passed))
    first = results["this checkout"][0]
    print(
        f"{options.hosts} hosts, {options.orphans} gone, {options.pods_per_host} pods a host, shape {options.shape}, "
        f"{options.container_ids} container ids: filed in {first['filed']:.1f}s, {first['planned']:.0f} hosts planned"
    )
    for name, runs in results.items():
        planned = runs[0]["planned"]
        for what in ("plan_run", "host_steps"):
            per_host = sorted(run[what] / planned * 1e6 for run in runs)
            print(
                f"{name}: {what}, every orphan planned: {min(run[what] for run in runs):.3f}s, "
                f"{per_host[0]:.0f}-{per_host[-1]:.0f} us a host over {len(runs)} processes "
                f"(best of {options.repeat} each)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

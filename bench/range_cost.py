"""What a paged read costs etcd, taken apart: per range, per key counted, per key returned.

The job's page windows (etcdv3.scan) trade ranges against keys counted: etcd counts every key
from a range's start to its end, whatever the page's limit. This seeds the 5,000-host `namespaces`
datastore (`--hosts`) and reads one prefix (the workload endpoints: 100,000 keys, values ~0.9 KB) again and
again, measuring the CPU the test etcd spends on each read (/proc, as `make bench`):
- in exact pages of N keys (each range ends at the next page's first key, so etcd counts only
  what it returns), for several N: the cost of a range;
- in pages of N keys that each ask for the rest of the prefix (etcd counts to its end): the
  cost of a key counted;
- with `etcdctl get --prefix` (one range, everything).
The reads alternate in a shuffled order, run after run, and each line is a median with its spread.
Only loopback traffic.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.dry_run import EtcdCpu, etcdctl_seconds, spread, times
from bench.generate import datastore, load
from job.adapters.datastores.etcdv3 import WORKLOAD_ENDPOINTS, EtcdV3Datastore, prefix_end
from job.adapters.retry import RetryPolicy
from job.config import Config, EtcdEndpoint
from tests.support.etcd_server import EtcdServer

EXACT = (500, 1000, 2000, 4000, 20000)
TO_THE_END = (1000, 4000)


def paged(store: EtcdV3Datastore, keys: list[bytes], revision: int, size: int, exact: bool) -> Callable[[], int]:
    """A read of `keys` in pages of `size`: ranges that end at the next page (`exact`) or at the
    prefix's end. Returns the keys etcd counted."""
    end = prefix_end(WORKLOAD_ENDPOINTS)

    def read() -> int:
        counted = 0
        for first in range(0, len(keys), size):
            stop = keys[first + size] if exact and first + size < len(keys) else end
            answer, _ = store.range(keys[first], stop, revision, limit=size)
            counted += answer.count
        return counted

    return read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--hosts", type=int, default=5000, help="a tenth of them gone")
    options = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="calico-gc-bench-range-"))
    etcd = EtcdServer(workdir)
    etcd.start()
    try:
        load(etcd.url, datastore(options.hosts, options.hosts // 10, 20, shape="namespaces"))
        endpoint = EtcdEndpoint("http", "127.0.0.1", etcd.client_port)
        store = EtcdV3Datastore(Config(etcd_endpoints=(endpoint,), page_size=1_000_000), RetryPolicy())
        revision = store.range(WORKLOAD_ENDPOINTS, None, None)[0].header.revision
        keys = [kv.key for kvs, _ in store.scan(WORKLOAD_ENDPOINTS, revision, keys_only=True) for kv in kvs]
        pages = [(f"exact pages of {n}", n, True) for n in EXACT]
        pages += [(f"pages of {n} to the prefix's end", n, False) for n in TO_THE_END]
        reads: dict[str, Callable[[], object]] = {
            "etcdctl get --prefix": lambda: etcdctl_seconds(etcd.url, (WORKLOAD_ENDPOINTS,))
        }
        reads |= {name: paged(store, keys, revision, n, exact) for name, n, exact in pages}
        cpu = EtcdCpu(etcd)
        spent: dict[str, list[float]] = {name: [] for name in reads}
        results: dict[str, object] = {}
        for _ in range(options.repeat):
            for name in random.sample(list(reads), len(reads)):
                results[name], seconds = cpu.spent(reads[name])
                spent[name].append(seconds)
        store.close()
        print(f"{len(keys)} workload endpoints, {options.hosts:,} hosts (`namespaces`), {options.repeat} reads each")
        floor = statistics.median(spent["etcdctl get --prefix"])
        print(f"etcdctl get --prefix: 1 range; etcd CPU {spread(spent['etcdctl get --prefix'])}")
        for name, n, _ in pages:
            print(
                f"{name}: {-(-len(keys) // n)} ranges, etcd counted {results[name]} keys; etcd CPU "
                f"{spread(spent[name])}, {times(statistics.median(spent[name]), floor)} etcdctl's"
            )
        return 0
    finally:
        etcd.close()


if __name__ == "__main__":
    raise SystemExit(main())

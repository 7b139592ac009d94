"""`make bench-churn`: delete 500 orphans while live CNI traffic changes the same blocks.

A load generator plays Calico's IPAM on the same etcd at a steady rate: it allocates pod IPs in
live hosts' blocks (the handle first, then the block, by compare-and-swap) and releases them
again (the block, then the handle). It works on the blocks the orphans borrowed IPs from and on
other live blocks. Each run is timed against the same deletion without the load, on a fresh copy
of the datastore. Prints the times with their spread, the ratio (goal: at most 2), the write
conflicts the job met (each one re-read and re-planned one host), and whether every allocation
the generator still holds is intact in its block and its handle (goal: all of them). Only
loopback traffic.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import sys
import threading
import time
from typing import Any

import requests

from bench.dry_run import cluster, run_job, spread
from bench.generate import _block, datastore, load

BLOCKS = "/calico/ipam/v2/assignment/ipv4/block/"
HANDLES = "/calico/ipam/v2/handle/"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class CniLoad(threading.Thread):
    """Allocations and releases at `rate` per second, as Calico's IPAM writes them; `held` is
    its own record of every allocation it made and has not released."""

    def __init__(self, url: str, block_keys: list[str], rate: float, seed: int) -> None:
        super().__init__(name="cni-load", daemon=True)
        self.session = requests.Session()
        self.session.trust_env = False
        self.url, self.block_keys, self.rate = url, block_keys, rate
        self.random = random.Random(seed)
        self.held: dict[str, tuple[str, int]] = {}  # handle -> (block key, ordinal)
        self.ops = self.retries = self.made = 0
        self.stop = threading.Event()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.session.post(f"{self.url}/v3{path}", json=body, timeout=30)
        response.raise_for_status()
        answer: dict[str, Any] = response.json()
        return answer

    def get(self, key: str) -> tuple[dict[str, Any] | None, int]:
        kvs = self._post("/kv/range", {"key": _b64(key)}).get("kvs", [])
        if not kvs:
            return None, 0
        return json.loads(base64.b64decode(kvs[0]["value"])), int(kvs[0]["mod_revision"])

    def cas(self, key: str, revision: int, value: dict[str, Any] | None) -> bool:
        compare = [{"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": revision}]
        write = (
            {"request_delete_range": {"key": _b64(key)}}
            if value is None
            else {"request_put": {"key": _b64(key), "value": _b64(json.dumps(value))}}
        )
        return bool(self._post("/kv/txn", {"compare": compare, "success": [write]}).get("succeeded"))

    def allocate(self, key: str) -> None:
        handle = f"k8s-pod-network.churn{self.made:08d}"
        self.made += 1
        block, _ = self.get(key)
        if block is None:
            return
        counted = {"block": {block["cidr"]: 1}, "deleted": False}
        self.cas(HANDLES + handle, 0, counted)  # the handle first (created only while absent)
        while True:
            block, revision = self.get(key)
            free = [o for o in block["unallocated"] if block["allocations"][o] is None] if block else []
            if block is None or not free:
                _, handle_revision = self.get(HANDLES + handle)
                self.cas(HANDLES + handle, handle_revision, None)  # nothing allocated: the handle goes
                return
            ordinal = free[0]
            node = (block.get("affinity") or "host:").removeprefix("host:")
            block["attributes"].append(
                {"handle_id": handle, "secondary": {"node": node, "namespace": "churn", "pod": handle[-12:]}}
            )
            block["allocations"][ordinal] = len(block["attributes"]) - 1
            block["unallocated"].remove(ordinal)
            block["sequenceNumber"] = block.get("sequenceNumber", 0) + 1
            if self.cas(key, revision, block):
                self.held[handle] = (key, ordinal)
                return
            self.retries += 1

    def release(self, handle: str) -> None:
        key, ordinal = self.held.pop(handle)
        while True:
            block, revision = self.get(key)
            if block is None:
                return
            index = block["allocations"][ordinal]
            if index is None or block["attributes"][index].get("handle_id") != handle:
                self.held[handle] = (key, ordinal)  # not ours any more: left for check() to find
                return
            block["allocations"][ordinal] = None
            block["unallocated"].append(ordinal)
            if index not in (i for i in block["allocations"] if i is not None):
                del block["attributes"][index]  # Calico drops attributes nothing points at
                block["allocations"] = [i - 1 if i is not None and i > index else i for i in block["allocations"]]
            block["sequenceNumber"] = block.get("sequenceNumber", 0) + 1
            if self.cas(key, revision, block):
                break
            self.retries += 1
        _, handle_revision = self.get(HANDLES + handle)
        self.cas(HANDLES + handle, handle_revision, None)  # then the handle (its count was 1)

    def run(self) -> None:
        due = time.perf_counter()
        while not self.stop.is_set():
            if self.held and (len(self.held) > 200 or self.random.random() < 0.4):
                self.release(self.random.choice(sorted(self.held)))
            else:
                self.allocate(self.random.choice(self.block_keys))
            self.ops += 1
            due += 1 / self.rate
            self.stop.wait(max(0.0, due - time.perf_counter()))

    def lost(self) -> list[str]:
        """The allocations it holds that its block or its handle no longer records as made."""
        gone = []
        for handle, (key, ordinal) in sorted(self.held.items()):
            block, _ = self.get(key)
            index = block["allocations"][ordinal] if block else None
            counted, _ = self.get(HANDLES + handle)
            intact = index is not None and block is not None and block["attributes"][index]["handle_id"] == handle
            if not intact or not counted or counted["block"] != {block["cidr"] if block else "": 1}:
                gone.append(handle)
        return gone


def reset(url: str, hosts: int, orphans: int, pods: int) -> int:
    """A fresh copy of the datastore: everything under /calico/ deleted, then written again."""
    requests.post(
        f"{url}/v3/kv/deleterange", json={"key": _b64("/calico/"), "range_end": _b64("/calico0")}, timeout=60
    ).raise_for_status()
    return load(url, datastore(hosts, orphans, pods, borrow=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--orphans", type=int, default=500)
    parser.add_argument("--pods-per-host", type=int, default=20)
    parser.add_argument("--rate", type=float, default=50.0, help="load operations per second")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    live = options.hosts - options.orphans
    with cluster("calico-gc-churn-", live) as (etcd, workdir, env, _):
        # Half the load on the blocks the orphans borrowed from, half on other live blocks.
        lenders = [BLOCKS + _block(i)[0].replace("/", "-") for i in range(options.orphans)]
        others = [BLOCKS + _block(i)[0].replace("/", "-") for i in range(options.orphans, live)]
        args = ["--apply", "--lock", "none", "--grace-period", "0s", "--keep-reports", "0"]
        args += ["--state-file", str(workdir / "state.json"), "--max-deletions", str(options.orphans)]
        args += ["--log-format", "json"]
        quiet: list[float] = []
        churn: list[float] = []
        conflicts: list[int] = []
        for round_number in range(options.repeat):
            for loaded in (False, True):
                keys = reset(etcd.url, options.hosts, options.orphans, options.pods_per_host)
                load_thread = CniLoad(etcd.url, lenders + others[: len(lenders)], options.rate, round_number)
                if loaded:
                    load_thread.start()
                seconds, _, code, report = run_job(env, args, log=workdir / "job.log")
                load_thread.stop.set()
                if loaded:
                    load_thread.join()
                summary = report["summary"]
                met = sum('"write_conflict"' in line for line in (workdir / "job.log").read_text().splitlines())
                assert code == 0 and summary["deleted"] == options.orphans, (code, summary)  # type: ignore[index]
                if not loaded:
                    quiet.append(seconds)
                    continue
                lost = load_thread.lost()
                churn.append(seconds)
                conflicts.append(met)
                print(
                    f"round {round_number + 1}: {keys} keys; quiet {quiet[-1]:.2f}s, under load {seconds:.2f}s; "
                    f"{met} write conflicts, each re-read and re-planned; the load made {load_thread.ops} "
                    f"operations ({load_thread.ops / seconds:.0f}/s, {load_thread.retries} of its own retries), "
                    f"holds {len(load_thread.held)} allocations, {len(lost)} of them lost or changed"
                )
                assert not lost, lost
        ratio = statistics.median(churn) / statistics.median(quiet)
        print(f"delete {options.orphans} orphans, quiet: {spread(quiet)}")
        print(f"the same under {options.rate:.0f} CNI operations/s: {spread(churn)}  ratio {ratio:.2f} (goal <= 2.0)")
        print(f"write conflicts per run (one re-read and re-plan each): {conflicts}")
        return 0


if __name__ == "__main__":
    sys.exit(main())

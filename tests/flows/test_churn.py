"""Deleting orphans while live pods come and go in the same blocks (issue 11's churn, small and
deterministic): before every other commit of the job, a stand-in for Calico's IPAM allocates a
pod IP (handle first, then the block, as Calico does) or releases one, in the blocks the orphans'
steps edit. Every allocation it made must survive exactly, and the datastore is read only once."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from job.adapters.datastores.etcdv3 import EtcdV3Datastore
from job.core.ipam import release
from job.core.model import Step
from tests.conftest import Harness, hosts_by_name
from tests.support import calico
from tests.support import scenario as s

BLOCKS = (
    "/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26",  # the orphan's, lending an IP to a live pod
    "/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26",  # a live node's, which lent one to the orphan
)


class Churn:
    """Live pods on a live node, allocated and released as Calico's IPAM does."""

    def __init__(self, url: str) -> None:
        self.url, self.made, self.held = url, 0, {}  # held: handle -> (block key, ordinal)
        self.conflicts = 0  # commits of the job that found a key changed

    def act(self) -> None:
        keys = {k: v for k, (v, _) in calico.dump(self.url).items()}
        if self.made % 3 == 2:
            handle, (key, ordinal) = next(iter(self.held.items()))
            block, _ = release(json.loads(keys[key]), {ordinal})
            calico.load(self.url, {key: json.dumps(block)})  # the block first, then the handle
            calico.delete(self.url, f"/calico/ipam/v2/handle/{handle}")
            del self.held[handle]
        else:
            key = BLOCKS[self.made % 2]
            block = json.loads(keys[key])
            ordinal = min(block["unallocated"])
            handle = f"k8s-pod-network.churn{self.made}"
            attribute = {"handle_id": handle, "secondary": {"node": s.LIVE[2], "namespace": "churn"}}
            attribute["secondary"]["pod"] = f"churn-{self.made}"
            block["attributes"].append(attribute)
            block["allocations"][ordinal] = len(block["attributes"]) - 1
            block["unallocated"].remove(ordinal)
            block["sequenceNumber"] += 1
            cidr = block["cidr"]
            calico.load(
                self.url, {f"/calico/ipam/v2/handle/{handle}": json.dumps({"block": {cidr: 1}, "deleted": False})}
            )
            calico.load(self.url, {key: json.dumps(block)})  # the handle first, then the block
            self.held[handle] = (key, ordinal)
        self.made += 1


class Churning:
    """The job's datastore, with the churn played before every other commit."""

    def __init__(self, inner: Any, churn: Churn) -> None:
        self.inner, self.churn, self.commits, self.type = inner, churn, 0, inner.type

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def commit(self, step: Step) -> int:
        self.commits += 1
        if self.commits % 2 == 1:
            self.churn.act()
        applied = int(self.inner.commit(step))
        self.churn.conflicts += applied < len(step.writes)
        return applied


def test_orphans_go_and_every_allocation_made_meanwhile_stays(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.seed(s.kops_cluster())
    churn = Churn(harness.etcd.url)
    reads: list[int] = []
    real_read = EtcdV3Datastore.read
    monkeypatch.setattr(EtcdV3Datastore, "read", lambda self, *a: reads.append(1) or real_read(self, *a))
    real = harness.dependencies

    def churning(config: Any, **kwargs: Any) -> Any:
        deps = real(config, **kwargs)
        return replace(deps, datastore=Churning(deps.datastore, churn))

    monkeypatch.setattr(harness, "dependencies", churning)
    report, code = harness.run(harness.config(apply=True, keep_reports=0))
    assert code == 0 and {h["action"] for h in report["hosts"] if h["name"] != s.UNREFERENCED} == {"deleted"}
    assert churn.made >= 4 and churn.conflicts >= 1, (churn.made, churn.conflicts)
    assert len(reads) == 1, "conflicts re-read the host's keys, not the datastore"
    after = {k: v for k, (v, _) in harness.dump().items()}
    for handle, (key, ordinal) in churn.held.items():
        block = json.loads(after[key])
        assert block["attributes"][block["allocations"][ordinal]]["handle_id"] == handle, handle
        assert json.loads(after[f"/calico/ipam/v2/handle/{handle}"])["block"] == {block["cidr"]: 1}
    assert calico.ipam_problems(after) == []
    assert not any(s.POD_ORPHAN in key or s.CONFLICT_ORPHAN in key for key in after)
    assert hosts_by_name(report)[s.POD_ORPHAN]["changes"]

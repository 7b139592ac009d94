"""`calico-gc restore` on Calico 2.x's etcd v2 and on the Kubernetes datastore: a run undone
from its kept report gives back the same data, and an IP allocated again since stays with its
new owner (the etcd v3 cases in detail: tests/test_restore.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.adapters.test_etcdv2 import seeded
from tests.adapters.test_kdd import GONE, kdd, seed_kdd, snapshot
from tests.conftest import Harness
from tests.support import calico, calico2
from tests.support.calico2 import CONFLICT_ORPHAN, NEW_NODE, ORPHAN
from tests.support.groups import Group


def v2_values(harness: Harness) -> dict[str, str]:
    return {k: v for k, (v, _) in calico2.dump(harness.etcd.url).items()}


def test_etcd_v2_restore_gives_back_the_calico_2_hosts(harness: Harness) -> None:
    seeded(harness)
    before = v2_values(harness)
    directories = calico2.directories(harness.etcd.url)
    report, code = harness.run(harness.config(datastore_type="etcdv2", apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2 and report["kept_as"]
    assert not any(f"/{ORPHAN}/" in key for key in v2_values(harness))
    harness.kubeapi.delete_node(NEW_NODE)  # else the orphan that held its address is refused
    dry, code = harness.restore(harness.config(datastore_type="etcdv2"))
    assert code == 0 and dry["summary"]["would_restore"] == 2
    document, code = harness.restore(harness.config(datastore_type="etcdv2", apply=True))
    assert code == 0, document
    after = v2_values(harness)
    assert calico.semantic(after) == calico.semantic(before)
    assert calico.ipam_problems(after) == []
    # The host trees come back whole: orchestrator_refs too, so the hosts are linked again.
    assert f"/calico/v1/host/{ORPHAN}/orchestrator_refs" in after
    assert f"/calico/v1/host/{CONFLICT_ORPHAN}/metadata" in after
    assert calico2.directories(harness.etcd.url) >= {d for d in directories if ORPHAN in d}
    again, code = harness.restore(harness.config(datastore_type="etcdv2", apply=True))
    assert code == 0 and {h["action"] for h in again["hosts"]} == {"nothing_to_restore"}


def kdd_state(harness: Harness, group: Group) -> dict[str, Any]:
    """Every Calico object as Calico reads it: IPAM by ordinal, the rest by spec and labels."""
    objects = snapshot(harness.kubeapi, group)
    specs = calico.semantic({key: json.dumps(obj.get("spec")) for key, obj in objects.items()})
    return {key: (specs[key], obj["metadata"].get("labels")) for key, obj in objects.items()}


def test_kubernetes_datastore_restore_gives_back_the_gone_nodes_ipam_and_config(harness: Harness, group: Group) -> None:
    api = group.path
    seed_kdd(harness.kubeapi, group)
    before = kdd_state(harness, group)
    old = harness.kubeapi.get(f"{api}/felixconfigurations", f"node.{GONE}")
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and report["summary"]["deleted"] == 1
    assert not any(GONE in key for key in snapshot(harness.kubeapi, group))
    document, code = harness.restore(kdd(harness, apply=True))
    assert code == 0, document
    assert kdd_state(harness, group) == before
    # Created anew: nothing the server assigned to the old objects is sent back.
    restored = harness.kubeapi.get(f"{api}/felixconfigurations", f"node.{GONE}")
    assert old is not None and restored is not None
    assert restored["metadata"]["uid"] != old["metadata"]["uid"]
    posted = [p for m, p in harness.kubeapi.requests if m == "POST" and p.startswith(api)]
    assert f"{api}/felixconfigurations" in posted and f"{api}/ipamblocks" in posted
    again, code = harness.restore(kdd(harness, apply=True))
    assert code == 0 and {h["action"] for h in again["hosts"]} == {"nothing_to_restore"}


def test_kubernetes_datastore_restore_leaves_an_ip_allocated_again_since(harness: Harness, group: Group) -> None:
    api = group.path
    seed_kdd(harness.kubeapi, group)
    harness.run(kdd(harness, apply=True))
    # cart-2 borrowed 100.96.1.40 from live-a's block; a new pod of live-a has it now.
    block = harness.kubeapi.get(f"{api}/ipamblocks", "100-96-1-0-26")
    assert block is not None and block["spec"]["allocations"][40] is None
    block["spec"]["attributes"].append({"handle_id": "k8s-pod-network.newcomer", "secondary": {"node": "live-a"}})
    block["spec"]["allocations"][40] = len(block["spec"]["attributes"]) - 1
    block["spec"]["unallocated"].remove(40)
    harness.kubeapi.put(f"{api}/ipamblocks", block)
    document, code = harness.restore(kdd(harness, apply=True))
    assert code == 4
    assert [c["message"] for c in document["hosts"][0]["conflicts"]] == [
        "100.96.1.40 was allocated again since (handle k8s-pod-network.newcomer)"
    ]
    now = harness.kubeapi.get(f"{api}/ipamblocks", "100-96-1-0-26")
    assert now is not None
    spec = now["spec"]
    assert spec["attributes"][spec["allocations"][40]]["handle_id"] == "k8s-pod-network.newcomer"
    # The gone node's own blocks and affinities are back all the same.
    assert harness.kubeapi.get(f"{api}/ipamblocks", "100-96-9-0-26") is not None
    assert harness.kubeapi.get(f"{api}/blockaffinities", f"{GONE}-100-96-9-0-26") is not None


def test_a_restored_object_the_crds_rules_refuse_fails_its_host_in_one_line(harness: Harness, group: Group) -> None:
    """The real server judges a restore's creates by the CRD's CEL rules too (a report from a
    Calico whose objects a newer CRD refuses, or one edited by hand): the refusal is the host's
    error, in the server's words, and nothing is half put back unsaid."""
    api = group.path
    seed_kdd(harness.kubeapi, group)
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and report["summary"]["deleted"] == 1
    (host,) = report["hosts"]
    key = f"hostendpoints/{GONE}-eth0"
    (change,) = [c for c in host["changes"] if c["key"].endswith(key)]
    before = json.loads(change["before"])
    del before["spec"]["interfaceName"]  # a HostEndpoint needs an interface name or expected IPs
    change["before"] = json.dumps(before)
    document, code = harness.restore(kdd(harness, apply=True), source=report)
    assert code == 4 and document["summary"]["failed"] == 1
    (restored,) = document["hosts"]
    assert restored["action"] == "failed" and "\n" not in restored["error"]
    assert "at least one of interfaceName or expectedIPs must be specified" in restored["error"], restored["error"]
    assert harness.kubeapi.get(f"{api}/hostendpoints", f"{GONE}-eth0") is None


@pytest.mark.parametrize("metadata", [[], {"name": "100-96-8-0-26"}])
def test_a_reread_object_that_is_no_object_fails_the_restore_never_taken_for_absent(
    harness: Harness, group: Group, metadata: object
) -> None:
    """The restore reads each key it would write as it is now; an answer with no metadata a write
    could build on (a proxy's) fails the host in one line. It was taken for an object that is not
    there, and its create put back over the one that is, where the server did not refuse it."""
    seed_kdd(harness.kubeapi, group)
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0
    lending = f"{group.path}/ipamblocks/100-96-8-0-26"
    harness.kubeapi.fail("GET", f"{lending}$", 200, times=20, body={"kind": "IPAMBlock", "metadata": metadata})
    document, code = harness.restore(kdd(harness, apply=True), source=report)
    (restored,) = document["hosts"]
    assert (code, restored["action"]) == (4, "failed")
    assert restored["error"] == f"GET {lending}: the answer is no Kubernetes object (no metadata.resourceVersion)"
    assert document["summary"]["keys_written"] == 0

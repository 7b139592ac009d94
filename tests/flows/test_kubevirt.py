"""KubeVirt VM addresses outlive their pods (Calico 3.32+, on by default): a VM's address stays
while its VirtualMachine (or a standalone VirtualMachineInstance) exists, whatever pod or node
it last had; during a live migration it stays while either owner's node is live; where calico-gc
cannot tell, it stays. On the Kubernetes datastore, in both API groups, with KubeVirt's kinds
served as KubeVirt serves them (kubevirt.io/v1, namespaced)."""

from __future__ import annotations

import copy
import ipaddress
import json
from datetime import timedelta
from typing import Any

from tests.adapters.test_kdd import GONE, LIVE_A, LIVE_B, cidr_name, kdd, seed_kdd, snapshot
from tests.conftest import Harness, hosts_by_name
from tests.support import calico, crds
from tests.support.calico import allocate_in, allocation_attribute
from tests.support.groups import Group
from tests.support.kubeapi import KubeApiServer
from tests.support.scenario import POD_ORPHAN, kops_cluster

VMS = "/apis/kubevirt.io/v1/namespaces/vms"
BLOCKS = ("100.96.1.0/26", "100.96.2.0/26", "100.96.9.0/26", "100.96.8.0/26")


def vm_address(
    kubeapi: KubeApiServer,
    group: Group,
    ip: str,
    node: str,
    vm: str,
    alternate: dict[str, str] | None = None,
) -> str:
    """A virt-launcher pod's allocation as Calico's CNI writes it: the handle and the owner
    attributes name the VM (`<network>.vmi.<namespace>.<vm>`, `vmi-name`, `vmi-uid`, `vm-uid`)."""
    cidr = next(c for c in BLOCKS if ipaddress.ip_address(ip) in ipaddress.ip_network(c))
    block = copy.deepcopy(kubeapi.get(f"{group.path}/ipamblocks", cidr_name(cidr)))
    assert block is not None
    spec = block["spec"]
    ordinal = int(ipaddress.ip_address(ip)) - int(ipaddress.ip_network(cidr).network_address)
    handle = f"k8s-pod-network.vmi.vms.{vm}"
    pod = f"virt-launcher-{vm}-x7k2p"
    allocate_in(spec, ordinal, allocation_attribute(handle, node, None, pod, "vms", vm, alternate))
    kubeapi.put(f"{group.path}/ipamblocks", block)
    body = {"handleID": handle, "block": {cidr: 1}, "deleted": False}
    kubeapi.put(f"{group.path}/ipamhandles", {"metadata": {"name": handle.lower()}, "spec": body})
    return handle


def install_kubevirt(kubeapi: KubeApiServer) -> None:
    kubeapi.install(*kubeapi.crds, *crds.KUBEVIRT)


def virtual_machine(kubeapi: KubeApiServer, name: str, running: bool = False) -> None:
    """A VirtualMachine; `running` adds its VirtualMachineInstance, owned by it."""
    vm = kubeapi.put(
        f"{VMS}/virtualmachines",
        {"metadata": {"name": name, "namespace": "vms"}, "spec": {"runStrategy": "Always" if running else "Halted"}},
    )
    if running:
        owner = {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "name": name,
            "uid": vm["metadata"]["uid"],
            "controller": True,
        }
        kubeapi.put(
            f"{VMS}/virtualmachineinstances",
            {"metadata": {"name": name, "namespace": "vms", "ownerReferences": [owner]}, "spec": {}},
        )


def allocation_at(kubeapi: KubeApiServer, group: Group, ip: str) -> dict[str, Any] | None:
    cidr = next(c for c in BLOCKS if ipaddress.ip_address(ip) in ipaddress.ip_network(c))
    block = kubeapi.get(f"{group.path}/ipamblocks", cidr_name(cidr))
    if block is None:
        return None
    spec = block["spec"]
    index = spec["allocations"][int(ipaddress.ip_address(ip)) - int(ipaddress.ip_network(cidr).network_address)]
    return None if index is None else dict(spec["attributes"][index])


def vm_states(report: dict[str, Any]) -> dict[str, str]:
    return {entry["ip"]: entry["state"] for entry in report["audit"]["vm_addresses"]["sample"]}


def test_a_stopped_vm_keeps_its_address_through_any_number_of_runs(harness: Harness, group: Group) -> None:
    """Its pod is gone, the VM stays: never a leak, however long, even with --release-leaked-ips."""
    seed_kdd(harness.kubeapi, group)
    install_kubevirt(harness.kubeapi)
    virtual_machine(harness.kubeapi, "db")
    vm_address(harness.kubeapi, group, "100.96.1.20", LIVE_A, "db")
    config = kdd(harness, apply=True, release_leaked_ips=True, max_leak_releases=50)
    for _ in range(4):
        report, code = harness.run(config)
        assert code == 0, report["errors"]
        assert "100.96.1.20" not in {e["ip"] for e in report["audit"]["leaked_ips"]["sample"]}
        assert vm_states(report)["100.96.1.20"] == "vm_exists"
        harness.now += timedelta(minutes=20)
    assert (allocation_at(harness.kubeapi, group, "100.96.1.20") or {}).get("handle_id") == "k8s-pod-network.vmi.vms.db"
    assert report["audit"]["vm_addresses"]["kubevirt"] == {"served": True, "vms": 1, "why": None}
    # The ghost pod's leak, the control: released once its grace is over.
    assert allocation_at(harness.kubeapi, group, "100.96.1.9") is None


def test_a_deleted_vms_address_is_a_leak_released_only_after_its_grace(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)
    install_kubevirt(harness.kubeapi)
    vm_address(harness.kubeapi, group, "100.96.1.21", LIVE_A, "gone-vm")  # no VM, no VMI, no pod
    config = kdd(harness, apply=True, release_leaked_ips=True, max_leak_releases=50)
    first, _ = harness.run(config)
    assert vm_states(first)["100.96.1.21"] == "vm_gone"
    (leak,) = [e for e in first["audit"]["leaked_ips"]["sample"] if e["ip"] == "100.96.1.21"]
    assert leak["action"] == "waiting_grace" and allocation_at(harness.kubeapi, group, "100.96.1.21") is not None
    harness.now += timedelta(minutes=14)
    harness.run(config)
    assert allocation_at(harness.kubeapi, group, "100.96.1.21") is not None, "not before the leak grace"
    harness.now += timedelta(minutes=2)
    harness.run(config)
    assert allocation_at(harness.kubeapi, group, "100.96.1.21") is None
    assert harness.kubeapi.get(f"{group.path}/ipamhandles", "k8s-pod-network.vmi.vms.gone-vm") is None


def test_a_vms_last_node_deleted_keeps_the_address_and_removes_the_rest(harness: Harness, group: Group) -> None:
    """The VM's next pod reuses the address wherever it lands: the gone node's block keeps it,
    without affinity, and everything else of the node goes (unlike kube-controllers, which holds the
    whole node back while the VM exists)."""
    seed_kdd(harness.kubeapi, group)
    install_kubevirt(harness.kubeapi)
    virtual_machine(harness.kubeapi, "web")
    handle = vm_address(harness.kubeapi, group, "100.96.9.30", GONE, "web")
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted", report["errors"]
    kept = harness.kubeapi.get(f"{group.path}/ipamblocks", "100-96-9-0-26")
    assert kept is not None and "affinity" not in kept["spec"], "kept, claimed by no node"
    assert (allocation_at(harness.kubeapi, group, "100.96.9.30") or {}).get("handle_id") == handle
    assert allocation_at(harness.kubeapi, group, "100.96.9.5") is None, "the node's pods' addresses went"
    assert harness.kubeapi.get(f"{group.path}/ipamhandles", handle.lower()) is not None
    left = snapshot(harness.kubeapi, group)
    assert [k for k in left if GONE in k] == [], "its affinities, config, peers, endpoints: gone"
    again, code = harness.run(kdd(harness, apply=True))
    assert code == 0
    decision = hosts_by_name(again)[GONE]
    assert (decision["action"], decision["reason"]) == ("skipped", "addresses_kept")
    assert "100.96.9.30 (vm_exists)" in decision["error"]


def test_a_live_migration_across_a_gone_node_keeps_the_address(harness: Harness, group: Group) -> None:
    """The source pod (the active owner) was on the node that is gone, the target pod runs on a
    live one: the address is the VM's, on its new node."""
    seed_kdd(harness.kubeapi, group)
    install_kubevirt(harness.kubeapi)
    virtual_machine(harness.kubeapi, "mig", running=True)
    target = {"node": LIVE_B, "namespace": "vms", "pod": "virt-launcher-mig-target", "vmim-uid": "m-1"}
    vm_address(harness.kubeapi, group, "100.96.8.40", GONE, "mig", alternate=target)
    harness.kubeapi.objects[f"{VMS}/virtualmachines"].clear()  # even the VM gone: its target pod runs
    report, code = harness.run(kdd(harness, apply=True, release_leaked_ips=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    assert vm_states(report)["100.96.8.40"] == "alternate_owner_live"
    assert (allocation_at(harness.kubeapi, group, "100.96.8.40") or {}).get("alternateOwnerAttrs") == target


def test_where_the_vms_cannot_be_listed_every_vm_address_stays_and_the_report_says_why(
    harness: Harness, group: Group
) -> None:
    seed_kdd(harness.kubeapi, group)
    install_kubevirt(harness.kubeapi)
    vm_address(harness.kubeapi, group, "100.96.9.31", GONE, "unknown")
    vm_address(harness.kubeapi, group, "100.96.1.22", LIVE_A, "unknown-2")
    harness.kubeapi.fail("GET", "/virtualmachines$", 403, times=10)
    report, code = harness.run(kdd(harness, apply=True, release_leaked_ips=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    audit = report["audit"]["vm_addresses"]
    assert audit["kubevirt"]["served"] is True and audit["kubevirt"]["vms"] is None
    assert "forbidden (HTTP 403)" in audit["kubevirt"]["why"]
    assert vm_states(report) == {"100.96.1.22": "vm_unknown", "100.96.9.31": "vm_unknown"}
    assert allocation_at(harness.kubeapi, group, "100.96.9.31") is not None
    assert allocation_at(harness.kubeapi, group, "100.96.1.22") is not None


def test_without_kubevirt_nothing_is_asked_beyond_discovery(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)
    report, code = harness.run(kdd(harness))
    assert code == 0 and report["audit"]["vm_addresses"] == {
        "count": 0,
        "sample": [],
        "kubevirt": {"served": False, "vms": 0, "why": None},
    }
    assert harness.kubeapi.count("GET", "^/apis$") == 1, "one discovery a run"
    assert harness.kubeapi.count("GET", "kubevirt") == 0


def test_on_etcd_a_vms_address_stays_when_its_last_node_is_deleted(harness: Harness) -> None:
    """The same rule in the etcd datastore: the VM's address on the deleted node stays in its block
    (kept without affinity), the rest of the node goes."""
    scenario = kops_cluster()
    scenario.seed.allocate(
        "100.96.20.30",
        "k8s-pod-network.vmi.vms.web",
        POD_ORPHAN,
        pod="virt-launcher-web-a1b2c",
        namespace="vms",
        vm="web",
    )
    harness.seed(scenario)
    install_kubevirt(harness.kubeapi)
    virtual_machine(harness.kubeapi, "web")
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and hosts_by_name(report)[POD_ORPHAN]["action"] == "deleted"
    assert vm_states(report)["100.96.20.30"] == "vm_exists"
    block = json.loads(calico.dump(harness.etcd.url)["/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"][0])
    assert block["affinity"] is None
    (attribute,) = [a for a in block["attributes"] if a.get("handle_id") == "k8s-pod-network.vmi.vms.web"]
    assert block["allocations"][30] == block["attributes"].index(attribute)
    assert "/calico/ipam/v2/handle/k8s-pod-network.vmi.vms.web" in calico.dump(harness.etcd.url)

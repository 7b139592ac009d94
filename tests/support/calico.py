"""Build Calico 3.x etcd-v3 data the way Calico writes it, and load it into a real etcd.

Used by the tests, `make demo` and the benchmark. Values follow docs/calico-data.md
(field names, key shapes, handle IDs); they are built here, not copied from a cluster.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import requests

R = "/calico/resources/v3/projectcalico.org/"


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def allocation_attribute(
    handle: str,
    node: str,
    kind: str | None = None,
    pod: str | None = None,
    namespace: str | None = None,
    vm: str | None = None,
    alternate: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An allocation's attribute as Calico's CNI plugin writes it; `vm`: a KubeVirt virt-launcher
    pod's, whose owner attributes name the VM (cni-plugin's ipam_plugin.go, vmipam); `alternate`: a
    live migration's target pod (alternateOwnerAttrs)."""
    secondary: dict[str, str] = {"node": node}
    if kind:
        secondary["type"] = kind
    if pod and namespace:
        secondary.update(namespace=namespace, pod=pod, timestamp="2026-01-01 00:00:00 +0000 UTC")
    if vm:
        uid = hashlib.sha256(f"{namespace}/{vm}".encode()).hexdigest()
        secondary.update({"vmi-name": vm, "vmi-uid": uid[:32], "vm-uid": uid[32:]})
    attribute: dict[str, Any] = {"handle_id": handle, "secondary": secondary}
    if alternate:
        attribute["alternateOwnerAttrs"] = alternate
    return attribute


def block_slot(cidrs: Iterable[str], ip: str) -> tuple[str, int]:
    """The seeded block an address is in, and its ordinal there."""
    address = ipaddress.ip_address(ip)
    cidr = next(c for c in cidrs if address in ipaddress.ip_network(c))
    return cidr, int(address) - int(ipaddress.ip_network(cidr).network_address)


def allocate_in(block: dict[str, Any], ordinal: int, attribute: dict[str, Any]) -> None:
    """An allocation as Calico's IPAM writes it into a block value: its attribute, the ordinal off
    `unallocated`, and the block's sequence number recorded for it."""
    block["attributes"].append(attribute)
    block["allocations"][ordinal] = len(block["attributes"]) - 1
    block["unallocated"].remove(ordinal)
    block["sequenceNumber"] += 1
    block["sequenceNumberForAllocation"][str(ordinal)] = block["sequenceNumber"]


@dataclass
class CalicoSeed:
    """An in-memory Calico datastore: `keys` maps each etcd key to its JSON text."""

    keys: dict[str, str] = field(default_factory=dict)
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    handles: dict[str, dict[str, Any]] = field(default_factory=dict)
    sequence: int = 1_700_000_000_000_000_000

    def resource(self, plural: str, name: str, kind: str, spec: dict[str, Any], namespace: str | None = None) -> str:
        metadata: dict[str, Any] = {
            "name": name,
            "uid": f"uid-{plural}-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        }
        if namespace:
            metadata["namespace"] = namespace
        key = f"{R}{plural}/{namespace + '/' if namespace else ''}{name}"
        self.keys[key] = _dump({"kind": kind, "apiVersion": "projectcalico.org/v3", "metadata": metadata, "spec": spec})
        return key

    def cluster_information(self, guid: str = "a1b2c3d4e5f6", ready: bool = True) -> None:
        self.resource(
            "clusterinformations",
            "default",
            "ClusterInformation",
            {"clusterGUID": guid, "clusterType": "k8s,bgp,kops", "calicoVersion": "v3.32.1", "datastoreReady": ready},
        )

    def node(
        self,
        name: str,
        ipv4: str | None = None,
        k8s_node: str | None = "",
        tunnel_ip: str | None = None,
        ipv6: str | None = None,
    ) -> str:
        """A Calico Node; k8s_node "" means "same as name", None means no orchRefs at all."""
        bgp: dict[str, Any] = {}
        if ipv4:
            bgp["ipv4Address"] = f"{ipv4}/19"
        if ipv6:
            bgp["ipv6Address"] = f"{ipv6}/64"
        if tunnel_ip:
            bgp["ipv4IPIPTunnelAddr"] = tunnel_ip
        spec: dict[str, Any] = {"bgp": bgp} if bgp else {}
        if k8s_node is not None:
            spec["orchRefs"] = [{"nodeName": k8s_node or name, "orchestrator": "k8s"}]
        key = self.resource("nodes", name, "Node", spec)
        if tunnel_ip:
            self.allocate(tunnel_ip, f"ipip-tunnel-addr-{name}", name, kind="ipipTunnelAddress")
        return key

    def block(self, cidr: str, host: str | None) -> dict[str, Any]:
        network = ipaddress.ip_network(cidr)
        cidr = str(network)  # as Go's IPNet.String() writes it (fd00:64::/122, not fd00:64:0::/122)
        block = {
            "cidr": cidr,
            "affinity": f"host:{host}" if host else None,
            "allocations": [None] * network.num_addresses,
            "unallocated": list(range(network.num_addresses)),
            "attributes": [],
            "deleted": False,
            "sequenceNumber": self.sequence,
            "sequenceNumberForAllocation": {},
            "strictAffinity": False,
        }
        self.sequence += 1000
        self.blocks[cidr] = block
        version = network.version
        if host:
            self.keys[f"/calico/ipam/v2/host/{host}/ipv{version}/block/{cidr.replace('/', '-')}"] = _dump(
                {"state": "confirmed", "deleted": False}
            )
        self._sync_block(cidr)
        return block

    def _sync_block(self, cidr: str) -> None:
        version = ipaddress.ip_network(cidr).version
        self.keys[f"/calico/ipam/v2/assignment/ipv{version}/block/{cidr.replace('/', '-')}"] = _dump(self.blocks[cidr])

    def allocate(self, ip: str, handle: str, node: str, **owner: Any) -> None:
        """An allocation as Calico's CNI plugin and IPAM write it; `owner`: allocation_attribute's
        (kind, pod, namespace, vm, alternate)."""
        cidr, ordinal = block_slot(self.blocks, ip)
        allocate_in(self.blocks[cidr], ordinal, allocation_attribute(handle, node, **owner))
        self._sync_block(cidr)
        entry = self.handles.setdefault(handle, {"block": {}, "deleted": False})
        entry["block"][cidr] = entry["block"].get(cidr, 0) + 1
        self.keys[f"/calico/ipam/v2/handle/{handle}"] = _dump(entry)

    def namespace_profile(self, namespace: str) -> str:
        """The Profile kube-controllers keeps for a Kubernetes namespace (etcd mode)."""
        spec = {
            "ingress": [{"action": "Allow"}],
            "egress": [{"action": "Allow"}],
            "labelsToApply": {"pcns.projectcalico.org/name": namespace},
        }
        return self.resource("profiles", f"kns.{namespace}", "Profile", spec)

    def cooling(self, ips: tuple[str, ...], released_at: str) -> None:
        """Addresses in IP cooldown (Calico 3.32+) as its release leaves them: pointed at one
        attribute holding only `releasedAt`, off `unallocated`, the sequence number kept."""
        for ip in ips:
            cidr, ordinal = block_slot(self.blocks, ip)
            allocate_in(self.blocks[cidr], ordinal, {"releasedAt": released_at})
            self._sync_block(cidr)

    def pod(self, node: str, namespace: str, pod: str, ip: str, ipv6: str | None = None) -> str:
        """A pod's workload endpoint and its IPAM allocations (one handle for both addresses of a
        dual-stack pod, as Calico's CNI plugin does); returns the WEP key."""
        container = hashlib.sha256(f"{node}/{namespace}/{pod}".encode()).hexdigest()[:16]
        for address in (ip, ipv6) if ipv6 else (ip,):
            self.allocate(address, f"k8s-pod-network.{container}", node, pod=pod, namespace=namespace)
        name = "-".join(part.replace("-", "--") for part in (node, "k8s", pod, "eth0"))
        return self.resource(
            "workloadendpoints",
            name,
            "WorkloadEndpoint",
            {
                "orchestrator": "k8s",
                "workload": "",
                "node": node,
                "containerID": container,
                "pod": pod,
                "endpoint": "eth0",
                "serviceAccountName": "default",
                "ipNetworks": [f"{ip}/32", *([f"{ipv6}/128"] if ipv6 else [])],
                "profiles": [f"kns.{namespace}", "ksa.default.default"],
                "interfaceName": f"cali{container[:11]}",
                "mac": "ee:ee:ee:ee:ee:ee",
            },
            namespace=namespace,
        )

    def felix(self, host: str, alive: bool) -> None:
        base = f"/calico/felix/v2/no-region/host/{host}/"
        report = _dump({"time": "2026-11-30T05:00:00Z", "uptime": 1200.5, "first_update": False})
        self.keys[base + "last_reported_status"] = report
        if alive:
            self.keys[base + "status"] = report

    def node_config(self, host: str) -> None:
        self.resource(
            "felixconfigurations", f"node.{host}", "FelixConfiguration", {"defaultEndpointToHostAction": "Return"}
        )
        self.resource("bgpconfigurations", f"node.{host}", "BGPConfiguration", {"listenPort": 179})

    def peer(self, name: str, node: str | None) -> str:
        spec: dict[str, Any] = {"peerIP": "10.0.0.250", "asNumber": 64512}
        if node:
            spec["node"] = node
        else:
            spec["nodeSelector"] = "all()"
        return self.resource("bgppeers", name, "BGPPeer", spec)

    def host_endpoint(self, name: str, node: str) -> str:
        return self.resource("hostendpoints", name, "HostEndpoint", {"node": node, "interfaceName": "eth0"})


def load(url: str, keys: dict[str, str], session: requests.Session | None = None) -> None:
    """Put every key into etcd in transactions of 128 puts."""
    session = session or _session()
    items = list(keys.items())
    for start in range(0, len(items), 128):
        success = [{"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in items[start : start + 128]]
        response = session.post(f"{url}/v3/kv/txn", json={"success": success}, timeout=30)
        response.raise_for_status()


def dump(url: str, session: requests.Session | None = None) -> dict[str, tuple[str, int]]:
    """Every key in etcd with its value and mod revision, for before/after comparisons."""
    session = session or _session()
    body = {"key": _b64("\0"), "range_end": _b64("\0")}
    response = session.post(f"{url}/v3/kv/range", json=body, timeout=30)
    response.raise_for_status()
    return {
        base64.b64decode(kv["key"]).decode(): (base64.b64decode(kv.get("value", "")).decode(), int(kv["mod_revision"]))
        for kv in response.json().get("kvs", [])
    }


def wipe(url: str, session: requests.Session | None = None) -> None:
    session = session or _session()
    body = {"key": _b64("\0"), "range_end": _b64("\0")}
    session.post(f"{url}/v3/kv/deleterange", json=body, timeout=30).raise_for_status()


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


def ipam_problems(values: dict[str, str]) -> list[str]:
    """What `calicoctl ipam check` would object to in etcd v3 IPAM keys, plus block validity.

    Every ordinal is allocated or listed in `unallocated`, exactly once; every attribute is
    referenced; every handle counts exactly the allocations its blocks hold for it, and no
    handle is left that counts none.
    """
    problems: list[str] = []
    held: dict[str, dict[str, int]] = {}
    for key, text in values.items():
        if not key.startswith("/calico/ipam/v2/assignment/") or key.endswith("/"):  # "/": a v2 directory
            continue
        block = json.loads(text)
        allocations, unallocated = block["allocations"], block["unallocated"]
        free = [o for o, index in enumerate(allocations) if index is None]
        if sorted(unallocated) != free:
            problems.append(f"{key}: unallocated {sorted(unallocated)} is not the free ordinals {free}")
        referenced = {index for index in allocations if index is not None}
        if referenced != set(range(len(block["attributes"]))):
            problems.append(f"{key}: attributes {len(block['attributes'])} referenced {sorted(referenced)}")
        for index in allocations:
            handle = None if index is None else block["attributes"][index]["handle_id"]
            if handle is not None:  # Calico 2.6's IPIP address has no handle
                per_block = held.setdefault(handle, {})
                per_block[block["cidr"]] = per_block.get(block["cidr"], 0) + 1
    handles = {
        key.rsplit("/", 1)[1]: json.loads(text)["block"]
        for key, text in values.items()
        if key.startswith("/calico/ipam/v2/handle/") and not key.endswith("/")
    }
    for handle in sorted(set(handles) | set(held)):
        if handles.get(handle) != held.get(handle):
            problems.append(f"handle {handle}: counts {handles.get(handle)}, blocks hold {held.get(handle)}")
    return problems


BLOCK_BOOKKEEPING = ("allocations", "attributes", "unallocated", "sequenceNumber", "sequenceNumberForAllocation")


def semantic(values: dict[str, str]) -> dict[str, Any]:
    """Values as Calico reads them: a block as its affinity and each allocated ordinal's
    attribute (not the attributes' order, nor the sequence numbers a write bumps), any other JSON
    value parsed. Two datastores equal under this hold the same IPAM and the same resources."""
    seen: dict[str, Any] = {}
    for key, text in values.items():
        try:
            value = json.loads(text)
        except ValueError:
            seen[key] = text
            continue
        if isinstance(value, dict) and isinstance(value.get("allocations"), list):
            attributes = value.get("attributes") or []
            rest = {k: v for k, v in value.items() if k not in BLOCK_BOOKKEEPING}
            value = {
                **rest,
                "owners": {o: attributes[i] for o, i in enumerate(value["allocations"]) if i is not None},
                "free": sorted(value.get("unallocated") or []),
            }
        seen[key] = value
    return seen


def delete(url: str, key: str, session: requests.Session | None = None) -> None:
    """Delete one key, as `etcdctl del` does."""
    session = session or _session()
    session.post(f"{url}/v3/kv/deleterange", json={"key": _b64(key)}, timeout=30).raise_for_status()

"""Calico 2.6 data in the etcd v2 keyspace (docs/calico-data.md, "etcd v2"), and v2 helpers."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any

import requests

from tests.support.calico import block_slot


def _session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


@dataclass
class Calico2Seed:
    """Keys -> (value, ttl). Blocks have Calico 2.x fields only: no sequence numbers, no `deleted`."""

    keys: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    handles: dict[str, dict[str, int]] = field(default_factory=dict)

    def put(self, key: str, value: str, ttl: int | None = None) -> None:
        self.keys[key] = (value, ttl)

    def globals(self, ready: bool = True) -> None:
        self.put("/calico/v1/config/ClusterGUID", "c0ffee0123456789")
        self.put("/calico/v1/Ready", "true" if ready else "false")
        self.put("/calico/v1/ipam/v4/pool/100.96.0.0-11", json.dumps({"cidr": "100.96.0.0/11", "ipip": "tunl0"}))
        self.put("/calico/bgp/v1/global/as_num", "64512")

    def block(self, cidr: str, host: str | None) -> None:
        size = ipaddress.ip_network(cidr).num_addresses
        self.blocks[cidr] = {
            "cidr": cidr,
            "affinity": f"host:{host}" if host else None,
            "strictAffinity": False,
            "allocations": [None] * size,
            "unallocated": list(range(size)),
            "attributes": [],
        }
        version = ipaddress.ip_network(cidr).version
        if host:
            self.put(f"/calico/ipam/v2/host/{host}/ipv{version}/block/{cidr.replace('/', '-')}", "")
        self._sync(cidr)

    def _sync(self, cidr: str) -> None:
        version = ipaddress.ip_network(cidr).version
        key = f"/calico/ipam/v2/assignment/ipv{version}/block/{cidr.replace('/', '-')}"
        self.put(key, json.dumps(self.blocks[cidr]))

    def allocate(self, ip: str, handle: str | None) -> None:
        cidr, ordinal = block_slot(self.blocks, ip)
        block = self.blocks[cidr]
        block["attributes"].append({"handle_id": handle, "secondary": None})
        block["allocations"][ordinal] = len(block["attributes"]) - 1
        block["unallocated"].remove(ordinal)
        self._sync(cidr)
        if handle:
            entry = self.handles.setdefault(handle, {})
            entry[cidr] = entry.get(cidr, 0) + 1
            self.put(f"/calico/ipam/v2/handle/{handle}", json.dumps({"block": entry}))

    def host(
        self, name: str, ip: str, k8s_node: str | None = "", tunnel_ip: str | None = None, felix_alive: bool = False
    ) -> None:
        """A Calico 2.x host; k8s_node "" means "same as name", None means no orchestrator_refs."""
        root = f"/calico/v1/host/{name}/"
        self.put(root + "metadata", "{}")
        self.put(root + "bird_ip", ip)
        if k8s_node is not None:
            self.put(root + "orchestrator_refs", json.dumps([{"orchestrator": "k8s", "nodeName": k8s_node or name}]))
        self.put(root + "config/DefaultEndpointToHostAction", "RETURN")
        bgp = f"/calico/bgp/v1/host/{name}/"
        self.put(bgp + "ip_addr_v4", ip)
        self.put(bgp + "ip_addr_v6", "")
        self.put(bgp + "network_v4", "10.0.0.0/19")
        if tunnel_ip:
            self.put(root + "config/IpInIpTunnelAddr", tunnel_ip)
            self.allocate(tunnel_ip, None)  # Calico 2.6 allocated it without a handle
        felix = f"/calico/felix/v1/host/{name}/"
        self.put(felix + "last_reported_status", json.dumps({"time": "2026-11-30T05:00:00Z", "uptime": 10}))
        if felix_alive:
            self.put(felix + "status", json.dumps({"time": "2026-11-30T05:00:00Z", "uptime": 10}), ttl=600)

    def pod(self, host: str, namespace: str, pod: str, ip: str, ipv6: str | None = None) -> None:
        handle = f"{namespace}.{pod}"
        self.allocate(ip, handle)
        if ipv6:
            self.allocate(ipv6, handle)
        self.put(
            f"/calico/v1/host/{host}/workload/k8s/{namespace}.{pod}/endpoint/eth0",
            json.dumps(
                {
                    "state": "active",
                    "name": f"cali{pod[:11]}",
                    "mac": "ee:ee:ee:ee:ee:ee",
                    "profile_ids": [f"k8s_ns.{namespace}"],
                    "ipv4_nets": [f"{ip}/32"],
                    "ipv6_nets": [f"{ipv6}/128"] if ipv6 else [],
                    "labels": {"calico/k8s_ns": namespace},
                }
            ),
        )

    def load(self, url: str) -> None:
        session = _session()
        for key, (value, ttl) in self.keys.items():
            data = {"value": value, **({"ttl": str(ttl)} if ttl else {})}
            session.put(f"{url}/v2/keys{key}", data=data, timeout=10).raise_for_status()


def dump(url: str) -> dict[str, tuple[str, int]]:
    """Every key of the v2 keyspace with its value and modifiedIndex."""
    response = _session().get(f"{url}/v2/keys/", params={"recursive": "true"}, timeout=10)
    found: dict[str, tuple[str, int]] = {}

    def walk(node: dict[str, Any]) -> None:
        if node.get("dir"):
            for child in node.get("nodes") or []:
                walk(child)
        else:
            found[node["key"]] = (node.get("value", ""), int(node["modifiedIndex"]))

    walk(response.json()["node"])
    return found


def directories(url: str) -> set[str]:
    response = _session().get(f"{url}/v2/keys/", params={"recursive": "true"}, timeout=10)
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if node.get("dir"):
            found.add(node.get("key", "/"))
            for child in node.get("nodes") or []:
                walk(child)

    walk(response.json()["node"])
    return found


def wipe(url: str) -> None:
    _session().delete(f"{url}/v2/keys/calico", params={"recursive": "true", "dir": "true"}, timeout=10)


LIVE = ("ip-10-0-2-10.ec2.internal", "ip-10-0-2-11.ec2.internal")
ORPHAN = "ip-10-0-2-20.ec2.internal"
CONFLICT_ORPHAN = "ip-10-0-2-13.old-domain.example"
NEW_NODE = "ip-10-0-2-13.ec2.internal"
BACKLOG = ("ip-10-0-2-30", "ip-10-0-2-31")  # registered before CALICO_K8S_NODE_REF: no refs


def _with_live_hosts() -> Calico2Seed:
    """The globals and the live hosts, each with its block, IPIP address and a pod."""
    seed = Calico2Seed()
    seed.globals()
    for index, name in enumerate(LIVE):
        seed.block(f"100.96.{index}.0/26", name)
        seed.host(name, f"10.0.2.{10 + index}", tunnel_ip=f"100.96.{index}.1", felix_alive=True)
        seed.pod(name, "default", f"web-{index}", f"100.96.{index}.5")
    return seed


def kops_18_cluster() -> tuple[Calico2Seed, list[tuple[str, str]]]:
    seed = _with_live_hosts()
    seed.block("100.96.20.0/26", ORPHAN)
    seed.host(ORPHAN, "10.0.2.20", tunnel_ip="100.96.20.1")
    seed.pod(ORPHAN, "shop", "cart-1", "100.96.20.5")
    seed.pod(ORPHAN, "shop", "cart-2", "100.96.0.40")  # borrowed from a live host's block
    seed.pod(LIVE[1], "shop", "api-1", "100.96.20.9")  # a live pod in the orphan's block
    seed.put(f"/calico/bgp/v1/host/{ORPHAN}/peer_v4/10.0.0.250", json.dumps({"ip": "10.0.0.250", "as_num": "65001"}))
    seed.block("100.96.13.0/26", CONFLICT_ORPHAN)
    seed.host(CONFLICT_ORPHAN, "10.0.2.13", tunnel_ip="100.96.13.1")
    for index, name in enumerate(BACKLOG):
        seed.block(f"100.96.{30 + index}.0/26", name)
        seed.host(name, f"10.0.2.{30 + index}", k8s_node=None, tunnel_ip=f"100.96.{30 + index}.1")
    k8s = [(name, f"10.0.2.{10 + i}") for i, name in enumerate(LIVE)] + [(NEW_NODE, "10.0.2.13")]
    return seed, k8s


def cross_borrowing_fleet(orphans: int) -> tuple[Calico2Seed, list[tuple[str, str]]]:
    """Calico 2.6 hosts whose IPAM is entangled: each orphan has its own block, an IPIP address
    without a handle, a pod, and a pod whose IP it borrowed from the next orphan's block; a
    live pod holds an IP in the last orphan's block."""
    seed = _with_live_hosts()
    names = [f"gone-{i}" for i in range(orphans)]
    for i, name in enumerate(names):
        seed.block(f"100.96.{20 + i}.0/26", name)
        seed.host(name, f"10.0.2.{20 + i}", tunnel_ip=f"100.96.{20 + i}.1")
    for i, name in enumerate(names):
        seed.pod(name, "shop", f"cart-{i}", f"100.96.{20 + i}.5")
        seed.pod(name, "shop", f"borrower-{i}", f"100.96.{20 + (i + 1) % orphans}.{40 + i}")
    seed.pod(LIVE[1], "shop", "api-1", f"100.96.{20 + orphans - 1}.9")
    return seed, [(name, f"10.0.2.{10 + i}") for i, name in enumerate(LIVE)]

"""Calico 2.x on the etcd v2 API (`/v2/keys`), with requests.

Layout: docs/calico-data.md, "etcd v2". Each host is a tree under `/calico/v1/host/<h>`, its BGP
data under `/calico/bgp/v1/host/<h>`, Felix status under `/calico/felix/v1/host/<h>`; the IPAM
keys have the same shapes as in etcd v3 and are filed by the same collector. The v2 API has no
multi-key transactions: every write is its own compare-and-swap on `prevIndex`, in the step's
order, and a failed compare stops the step so that the planner decides again from a fresh read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from dataclasses import replace
from functools import partial
from typing import Annotated

import msgspec

from job.adapters.datastores.base import DatastoreError, Scope
from job.adapters.datastores.etcd_http import EtcdHttp
from job.adapters.datastores.etcdv3 import (
    Collected,
    bare_ip,
    collect_key,
    collect_pool,
    inventory_of,
    k8s_node_name,
    unregistered_names,
)
from job.adapters.retry import UNANSWERED, RetryPolicy
from job.config import Config
from job.core.inventory import Inventory
from job.core.ipam import address_in, block_data
from job.core.model import (
    CREATE,
    CalicoHost,
    ClusterInfo,
    IpamBlock,
    IpamHandle,
    Step,
    StoredItem,
    WorkloadEndpoint,
    Write,
)

HOSTS = "/calico/v1/host/"
BGP_HOSTS = "/calico/bgp/v1/host/"
FELIX_HOSTS = "/calico/felix/v1/host/"
IPAM_HOSTS = "/calico/ipam/v2/host/"
POOLS = "/calico/v1/ipam/"  # v4/pool/<cidr> and v6/pool/<cidr>: {"cidr": ...}
# Every subtree one run reads, each with one recursive GET (the v2 API does not page, nor pin a
# revision across GETs). The host trees, which hold the identity (`metadata`), come last: a host
# that registers while the others are read is then seen with its identity, never as a name with
# IPAM but no Calico host.
TREES = (POOLS, "/calico/ipam/v2/assignment/", IPAM_HOSTS, "/calico/ipam/v2/handle/", BGP_HOSTS, FELIX_HOSTS, HOSTS)
CLUSTER_GUID = "/calico/v1/config/ClusterGUID"
READY = "/calico/v1/Ready"
COMPARE_FAILED = 412
NOT_FOUND = 404


HOST_ROOTS = (HOSTS, BGP_HOSTS, FELIX_HOSTS, IPAM_HOSTS)


class Node(msgspec.Struct, frozen=True):
    """A node of a v2 answer, as etcd v2 writes it: the fields read, typed, so that one of
    another type is said as a bad answer (a modifiedIndex that is no whole number was an
    `unexpected` error); etcd's others (createdIndex, ttl, expiration) are passed over."""

    key: str = ""
    dir: bool = False
    value: str = ""
    modifiedIndex: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0  # etcd's name; a uint64 far below 2**63
    nodes: tuple[Node, ...] = ()


class _Answer(msgspec.Struct, frozen=True):
    node: Node | None = None


_ANSWER = msgspec.json.Decoder(_Answer)


def _leaves(node: Node) -> Iterator[StoredItem]:
    """Every key in a v2 recursive answer, depth first. A directory that holds no key at all,
    however deep, comes as one item whose key ends with "/" and whose value is None."""
    if node.dir:
        if not node.nodes and node.key:
            yield StoredItem(node.key + "/", node.modifiedIndex, None)
        for child in node.nodes:
            yield from _leaves(child)
    elif node.key:
        yield StoredItem(node.key, node.modifiedIndex, node.value)


def _host_directories(name: str, keys: list[str]) -> tuple[StoredItem, ...]:
    """The directories under the host roots that hold `keys` (keys, or empty directories ending
    with "/"), deepest first: `dir=true` deletes a directory only once it is empty."""
    found: set[str] = set()
    for key in keys:
        root = next((r for r in HOST_ROOTS if key.startswith(r + name + "/") or key == r + name + "/"), None)
        if root is None:
            continue
        parts = key[len(root) :].rstrip("/").split("/")
        depth = len(parts) if key.endswith("/") else len(parts) - 1
        found |= {root + "/".join(parts[:level]) + "/" for level in range(1, depth + 1)}
    return tuple(StoredItem(d, 0, "") for d in sorted(found, key=lambda d: (-d.count("/"), d)))


def orphan_tunnel_ips(name: str, blocks: Iterable[IpamBlock], spoken_for: Set[str]) -> tuple[str, ...]:
    """The IPIP tunnel address a Calico 2.6 host left in its own blocks, proven from the data alone
    (docs/calico-data.md, "IPAM-only hosts"): calico-node allocated it without a handle, and only the
    host's `config/IpInIpTunnelAddr` named it, which a hand-run clean-up deleted with the host tree.
    So a handle-less allocation in a block whose affinity still names `name`, that no host's tunnel
    key names and no workload endpoint holds (`spoken_for`), is this host's."""
    found = []
    for block in blocks:
        if block.affine_host != name or block.item.value is None:
            continue
        data = block_data(block)
        attributes = data.get("attributes") or []
        ip_of = address_in(block.cidr)
        for ordinal, index in enumerate(data["allocations"]):
            if index is None or attributes[index].get("handle_id") or block.owners.get(ordinal) is not None:
                continue
            ip = ip_of(ordinal)
            if ip not in spoken_for:
                found.append(ip)
    return tuple(found)


def _unregistered_host(name: str, tree: list[StoredItem], collected: Collected) -> CalicoHost:
    """Data under a name with no `metadata` or `orchestrator_refs` (docs/calico-data.md,
    "IPAM-only hosts"): what a hand-run clean-up that deleted only `/calico/v1/host/<name>/metadata`
    leaves (its IPAM, endpoints, BGP and Felix keys), or a run that died before pruning the empty
    directories. Its keys go, then its directories, deepest first; nothing written meanwhile is
    lost, since `dir=true` cannot delete a directory that holds a key. Its tunnel IP is found once
    every host is known (orphan_tunnel_ips)."""
    keys = sorted((item for item in tree if item.value is not None), key=lambda i: i.key)
    endpoints = [e for e in map(partial(_endpoint, name, collected), keys) if e is not None]
    owned = [item for item in keys if not any(e.item is item for e in endpoints)]
    affinities = tuple(sorted(collected.affinities.pop(name, ()), key=lambda a: a.item.key))
    directories = _host_directories(name, [i.key for i in tree] + [a.item.key for a in affinities])
    return CalicoHost(
        name,
        None,
        None,
        felix_alive=f"{FELIX_HOSTS}{name}/status" in {i.key for i in keys},
        workload_endpoints=tuple(endpoints),
        affinities=affinities,
        owned=(*owned, *directories),
        registered=False,
    )


def _endpoint(name: str, collected: Collected, item: StoredItem) -> WorkloadEndpoint | None:
    """A workload endpoint key of host `name` (`.../workload/<orch>/<id>/endpoint/<ep>`), else None."""
    own = f"{HOSTS}{name}/"
    parts = item.key[len(own) :].split("/") if item.key.startswith(own) else []
    if not (len(parts) == 5 and parts[0] == "workload" and parts[3] == "endpoint"):
        return None
    value = collected.json(item)
    listed = [value.get(field) for field in ("ipv4_nets", "ipv6_nets")] if isinstance(value, dict) else []
    # A list of another shape names no IP, as on etcd v3 (_endpoint_of_any_shape).
    nets = [n for nets in listed if isinstance(nets, list) for n in nets if isinstance(n, str)]
    return WorkloadEndpoint(item, name, tuple(n.split("/", 1)[0] for n in nets))


def build_inventory(items: Iterator[StoredItem], cluster: ClusterInfo) -> Inventory:
    """The v2 layout as the shared model. Pure; unknown shapes become problems."""
    collected = Collected()
    trees: dict[str, list[StoredItem]] = {}
    for item in items:
        for root in HOST_ROOTS if item.value is None else (HOSTS, BGP_HOSTS, FELIX_HOSTS):
            if item.key.startswith(root):
                owner, _, rest = item.key[len(root) :].partition("/")
                if not owner or (not rest and item.value is not None):
                    collected.problem("unknown_key", item.key, "not under a host directory")
                else:
                    trees.setdefault(owner, []).append(item)
                break
        else:
            if item.key.startswith(POOLS):
                if "/pool/" in item.key and item.value is not None:
                    collect_pool(collected, item, "cidr")
            else:
                collect_key(collected, item)  # IPAM: blocks, affinities, handles
    hosts: list[CalicoHost] = []
    leftovers: dict[str, list[StoredItem]] = {}
    for name, tree in sorted(trees.items()):
        host = _host(name, [item for item in tree if item.value is not None], collected)
        if host is None:
            leftovers[name] = tree
        else:
            hosts.append(host)
    registered = {host.name for host in hosts}
    for name in sorted(unregistered_names(collected, registered) | set(leftovers) - registered):
        hosts.append(_unregistered_host(name, leftovers.get(name, []), collected))
    # A tunnel IP some host's key names, or an IP some workload endpoint holds: never a dead host's tunnel.
    spoken_for = {ip for host in hosts for ip in host.tunnel_ips}
    spoken_for |= {ip for host in hosts for endpoint in host.workload_endpoints for ip in endpoint.ips}
    for number, host in enumerate(hosts):
        if not host.registered:
            hosts[number] = replace(host, tunnel_ips=orphan_tunnel_ips(host.name, collected.blocks, spoken_for))
    return inventory_of(collected, hosts, cluster, 0)  # v2 pins no revision


def _host(name: str, tree: list[StoredItem], collected: Collected) -> CalicoHost | None:
    own = f"{HOSTS}{name}/"
    metadata = next((item for item in tree if item.key == own + "metadata"), None)
    refs = next((item for item in tree if item.key == own + "orchestrator_refs"), None)
    if metadata is None and refs is None:
        return None  # a run deleting it died after both: only the rest of its tree is left
    by_key = {item.key: item for item in tree}
    endpoints, owned = [], []
    k8s_node: str | None = None
    for item in sorted(tree, key=lambda i: i.key):
        if item is metadata or item is refs:
            continue
        endpoint = _endpoint(name, collected, item)
        if endpoint is not None:
            endpoints.append(endpoint)
        else:
            owned.append(item)
    if refs is not None:
        k8s_node = k8s_node_name(collected, refs.key, collected.json(refs))
    bgp = f"{BGP_HOSTS}{name}/"
    tunnel = by_key.get(own + "config/IpInIpTunnelAddr")
    return CalicoHost(
        name,
        metadata,
        k8s_node,
        ipv4=bare_ip(by_key[bgp + "ip_addr_v4"].value) if bgp + "ip_addr_v4" in by_key else None,
        ipv6=bare_ip(by_key[bgp + "ip_addr_v6"].value) if bgp + "ip_addr_v6" in by_key else None,
        # Calico 2.6 allocated the IPIP address without a handle: only this key finds it.
        tunnel_ips=tuple(ip for ip in [bare_ip(tunnel.value)] if ip) if tunnel else (),
        felix_alive=f"{FELIX_HOSTS}{name}/status" in by_key,
        workload_endpoints=tuple(endpoints),
        affinities=tuple(sorted(collected.affinities.pop(name, ()), key=lambda a: a.item.key)),
        owned=tuple(owned),
        link_keys=() if refs is None else (refs,),
    )


class EtcdV2Datastore:
    """Recursive GETs per subtree; every write a compare-and-swap on `prevIndex`."""

    type = "etcdv2"

    def __init__(self, config: Config, retry: RetryPolicy) -> None:
        self._http = EtcdHttp(config, retry)

    def describe(self) -> dict[str, object]:
        return {"type": self.type, "endpoints": self._http.endpoints}

    def _get(self, key: str, recursive: bool = False) -> Node | None:
        status, answer = self._http.request(
            "GET",
            f"/v2/keys{key}",
            params={"recursive": "true"} if recursive else None,
            expect=(200, NOT_FOUND),
            decode=_ANSWER.decode,
        )
        if status == NOT_FOUND:
            return None
        node: Node | None = answer.node
        if node is None:
            raise DatastoreError(
                f"etcd v2 GET {key} answered without a node: not the etcd v2 API? check ETCD_ENDPOINTS"
            )
        return node

    def has_calico_data(self) -> bool:
        """Whether a Calico 2.x host tree exists (used to explain an empty etcd v3 keyspace)."""
        node = self._get(HOSTS)
        return bool(node and node.nodes)

    def read(self, kube_names: Callable[[], Set[str]] | None = None, scope: Scope | None = None) -> Inventory:
        """Everything: etcd v2 answers each tree whole (it cannot page), so `kube_names` (see
        Datastore.read) would not lower the peak."""
        guid, ready = self._get(CLUSTER_GUID), self._get(READY)
        cluster = ClusterInfo(
            guid.value if guid and not guid.dir else None, None if ready is None else ready.value != "false"
        )
        items = (item for tree in TREES for node in [self._get(tree, recursive=True)] if node for item in _leaves(node))
        return build_inventory(items, cluster)

    def current(self, keys: Sequence[str]) -> dict[str, StoredItem]:
        found = {}
        for key in keys:
            node = self._get(key)
            if node is not None and not node.dir:
                found[key] = StoredItem(key, node.modifiedIndex, node.value)
        return found

    def handles(self, ids: Iterable[str]) -> dict[str, IpamHandle]:
        found = self.current([f"/calico/ipam/v2/handle/{handle_id}" for handle_id in ids])
        return {key.rsplit("/", 1)[1]: IpamHandle(item, key.rsplit("/", 1)[1]) for key, item in found.items()}

    def commit(self, step: Step) -> int:
        """Each write conditional on its prevIndex, in order; stop at the first failed compare."""
        for applied, write in enumerate(step.writes):
            try:
                if not self._write(write):
                    return applied
            except DatastoreError as error:
                error.applied = applied
                raise
        # The Calico Node step (metadata, then orchestrator_refs): the host's empty directories go.
        try:
            for host in sorted({w.key[len(HOSTS) :].split("/", 1)[0] for w in step.writes if _is_identity(w.key)}):
                self._prune(host)
        except DatastoreError as error:  # the step's writes are done: only directories may be left
            error.applied, error.in_doubt = len(step.writes), 0
            raise
        return len(step.writes)

    def _write(self, write: Write) -> bool:
        """One compare-and-swap; False when the compare failed (or the key is gone). A write tried
        again may have been done at the first try, its answer lost: where the retry's compare
        fails, the key is read, and as this write leaves it means it was written."""
        tries: list[int] = []
        if write.key.endswith("/"):  # an empty directory: refused (403) if a key appeared in it
            status, _ = self._http.request(
                "DELETE", f"/v2/keys{write.key}", params={"dir": "true"}, expect=(200, 403, 404), tries=tries
            )
            return status == 200 or (status == NOT_FOUND and UNANSWERED in tries)
        status, _ = self._http.request(
            "DELETE" if write.value is None else "PUT",
            f"/v2/keys{write.key}",
            params={"prevExist": "false"} if write.revision == CREATE else {"prevIndex": str(write.revision)},
            data=None if write.value is None else {"value": write.value},
            expect=(200, 201, COMPARE_FAILED, NOT_FOUND),
            tries=tries,
        )
        if status not in (COMPARE_FAILED, NOT_FOUND):
            return True
        if UNANSWERED not in tries:
            return False
        try:
            node = self._get(write.key)
        except DatastoreError as error:
            error.in_doubt = 1  # the write's first try may have been done, and this cannot tell
            raise
        return (node.value if node is not None and not node.dir else None) == write.value

    def _prune(self, host: str) -> None:
        """Remove the gone host's now empty directories, deepest first; a directory something
        was written to meanwhile is not empty, so it stays (dir=true never deletes keys)."""
        for root in (f"{HOSTS}{host}", f"{BGP_HOSTS}{host}", f"{FELIX_HOSTS}{host}", f"{IPAM_HOSTS}{host}"):
            node = self._get(root, recursive=True)
            if node is None:
                continue
            for directory in sorted(_directories(node), key=lambda d: -d.count("/")):
                # 403 "directory not empty": something was written there meanwhile, so it stays.
                self._http.request("DELETE", f"/v2/keys{directory}", params={"dir": "true"}, expect=(200, 403, 404))

    def close(self) -> None:
        self._http.close()


def _is_identity(key: str) -> bool:
    return key.startswith(HOSTS) and key.endswith(("/metadata", "/orchestrator_refs")) and key.count("/") == 5


def _directories(node: Node) -> Iterator[str]:
    if node.dir:
        yield node.key
        for child in node.nodes:
            yield from _directories(child)

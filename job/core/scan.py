"""One pass over every IPAM block, made once a run: what the IPAM check, the stale-handle check and
the leak check need of the blocks, so that each block is parsed once (and again only where a
leak may be). A lean read makes it as it reads (Inventory.scan); otherwise the flow does."""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from job.core.ipam import (
    RELEASED_AT,
    Held,
    Networks,
    address_in,
    address_number,
    affinity_host,
    block_data,
    tunnel_handle_node,
)
from job.core.kept import ALTERNATE, VM_HANDLE_MARK, VM_NAME
from job.core.leaks import Allocation, pod_attribution
from job.core.model import IpamBlock, Owners, parse_time

SAMPLE = 20  # how many of a finding the report lists (audit)

# One block in this many gives its last allocation's handle id to BlockScan.handle_samples: at 20
# pods a block, one handle in about 80; at 15,000 hosts 3,750 ids, about 0.5 MB, and as much
# again as the read's bounds (the peak did not rise: 183.0 MB against 184.2 MB).
HANDLE_SAMPLE_EVERY = 4


class BlockSummary(NamedTuple):
    """What BlockScan.add gives of a block: its affine host, each allocation's node (Owners), and
    whether an allocation is of a host that is not live (BlockScan.owner_live)."""

    affine_host: str | None
    owners: Owners
    touched: bool


@dataclass
class BlockScan:
    """What one pass over every block gives the IPAM check, the stale-handle check and the
    leak check, so that each block is parsed once a run (and again only where a leak may be).

    Leak candidates are found in three moves, so that no set of every endpoint IP is needed: `add`
    marks, per block, the ordinals that may name a pod on a live node (a live node and a namespace);
    `held_by_endpoints` clears those any workload endpoint holds (in the Kubernetes datastore, any
    listed pod); `attribute` turns what is left into `pod_ips`, parsing only those blocks."""

    live_nodes: Set[str] = frozenset()
    calico2: bool = False
    held: Held = field(default_factory=Held)
    allocated: Counter[str] = field(default_factory=Counter)  # cidr -> allocations
    node_blocks: Counter[str] = field(default_factory=Counter)  # node -> blocks affine to it
    node_allocated: Counter[str] = field(default_factory=Counter)  # node -> allocations ("": none named)
    dangling: list[dict[str, str]] = field(default_factory=list)  # allocations whose handle is missing
    dangling_count: int | None = None  # how many there are, where `dangling` is a sample (dangling_blocks)
    unheld: dict[str, int] = field(default_factory=dict)  # cidr -> bits of the ordinals above
    pod_ips: dict[tuple[str, str], list[Allocation]] = field(default_factory=lambda: defaultdict(list))
    attributed: bool = False  # `pod_ips` is made (attribute): what the bits say is final
    # Whether a node is live (a host calico-gc keeps), when the read plans on arrival: `add` then
    # collects in `wanted` the handles of allocations no live host owns (a plan may write those).
    owner_live: Callable[[str], bool] | None = None
    # An allocation that names no node (no `secondary.node`, no tunnel handle) in a block no gone
    # host is affine to is written only by the plan of a gone host whose known IP it is
    # (ipam._host_ordinals). With `defer_unowned` it marks neither the block nor its handle, and
    # its ordinal waits in `unowned` (cidr -> bits) for the read to ask, once it has the gone
    # hosts' IPs, which of them a plan may free (unowned_at): a keyspace whose allocations carry no
    # attributes kept every block whole and every handle.
    defer_unowned: bool = False
    # Gone hosts no plan of this run takes (Inventory.partial): their blocks and allocations are
    # scanned as a live host's are, for what a plan would write, and as a gone host's for the audit.
    partial: Set[str] = frozenset()
    unowned: dict[str, int] = field(default_factory=dict)
    # Of a block whose affine host is not live, the allocations that name no node (Calico 2.x:
    # nor a pod), as bits per cidr; an endpoint holding one clears its bit. What is left stays
    # when the host goes (the audit's unattributed_allocations): nothing says whose they are.
    unclaimed: dict[str, int] = field(default_factory=dict)
    # An IP as (version, number); an adapter may give a faster one than the pure core has.
    parse_ip: Callable[[str], tuple[int, int] | None] = address_number
    wanted: set[str] = field(default_factory=set)
    # Allocations a KubeVirt VM or a live migration owns, as (cidr, ordinal, attribute): kept.py
    # decides whether each stays, and the audit lists them.
    owned_specially: list[tuple[str, int, Mapping[str, Any]]] = field(default_factory=list)
    # Addresses in IP cooldown, per block: how many, and the oldest `releasedAt` (None: none readable).
    cooling: dict[str, tuple[int, datetime | None]] = field(default_factory=dict)
    # The namespaces pods' allocations name, with how many: where and how often the etcd v3 read's
    # endpoint pages may stop (namespace starts, as its namespace profiles give, and hosts within).
    namespaces: dict[str, int] = field(default_factory=dict)
    # A handle id from every HANDLE_SAMPLE_EVERY-th block, drawn at random as far as the handles'
    # keys go (container ids): where the etcd v3 read's handle pages may stop.
    handle_samples: list[str] = field(default_factory=list)
    _networks: Networks | None = None  # of the blocks with bits in `unheld`, once every block is in
    _pending: list[str] = field(default_factory=list)  # endpoint IPs given before that

    def add(self, cidr: str, data: Mapping[str, Any], handles: Container[str] | None = None) -> BlockSummary:
        """One block's JSON (of a shape block_shape_problem accepts), in one pass over its
        allocations: a read adds every block, and three passes over each (the scan, the summary,
        the handles to keep) were a third of a 5,000-host read's filing. Gives what the index
        needs of the block (summarize_block's summary) and whether a host that is not live
        (`owner_live`) is its affine host or owns an allocation in it; those allocations' handles
        go into `wanted`. `dangling` is filled only when `handles` is given; a read that scans
        blocks before it reads the handles calls find_dangling once it has."""
        assert self._networks is None, "a block added after blocks_read"
        host = affinity_host(data)
        live, live_nodes, calico2, held, wanted = self.owner_live, self.live_nodes, self.calico2, self.held, self.wanted
        partial = self.partial
        # A read that files no host as gone (a full read) tells by the Kubernetes names alone.
        host_not_live = host is not None and (not live(host) if live is not None else host not in live_nodes)
        touched = host_gone = live is not None and host_not_live and host not in partial
        if host:
            self.node_blocks[host] += 1
        attributes = data.get("attributes") or []
        count = bits = mine = hosts = unowned = unclaimed = 0
        defer = self.defer_unowned and not host_gone
        others: dict[int, str | None] | None = None
        per_node, namespaces = self.node_allocated, self.namespaces
        for ordinal, index in enumerate(data["allocations"]):
            if index is None:
                continue
            count += 1
            attribute = attributes[index]
            handle = attribute.get("handle_id")
            if not isinstance(handle, str):
                handle = None
            secondary = attribute.get("secondary")
            node = secondary.get("node") if isinstance(secondary, dict) else None
            if not isinstance(node, str):
                node = namespace = None
            elif isinstance(namespace := secondary.get("namespace"), str):  # a pod's
                namespaces[namespace] = namespaces.get(namespace, 0) + 1
            else:
                namespace = None
            if (node and VM_NAME in secondary) or ALTERNATE in attribute or (handle and VM_HANDLE_MARK in handle):
                self.owned_specially.append((cidr, ordinal, attribute))
            elif RELEASED_AT in attribute and not handle:  # in IP cooldown (a few a block, at most)
                found, oldest = self.cooling.get(cidr, (0, None))
                released = parse_time(attribute[RELEASED_AT])  # None for a value that is not a time
                if released is not None and (oldest is None or released < oldest):
                    oldest = released
                self.cooling[cidr] = (found + 1, oldest)
            owner = node or tunnel_handle_node(handle)
            if owner and owner == host:
                mine |= 1 << ordinal
                if host_gone and handle:
                    wanted.add(handle)
            else:
                others = others or {}
                others[ordinal] = sys.intern(owner) if owner else None
                if not owner and host_not_live and not (calico2 and handle and "." in handle):
                    unclaimed |= 1 << ordinal  # on Calico 2.x a handle naming a pod is the leak check's
                if live is not None and not owner and defer:
                    unowned |= 1 << ordinal
                elif live is not None and (not owner or not (live(owner) or owner in partial)):
                    touched = True
                    if handle:
                        wanted.add(handle)
            if not node or node == host:
                hosts += 1
            else:
                per_node[node] += 1
            if not handle:
                continue
            held.add(handle, cidr)
            if handles is not None and handle not in handles:
                self.dangling.append({"ip": address_in(cidr)(ordinal), "handle": handle})
            # A pod's on a live node, as far as a node and a namespace tell: `attribute` applies
            # pod_attribution whole to what no endpoint holds (a call here was a sixth of the scan).
            # Calico 2.x records no node: there the handle names the pod.
            if node:
                if namespace and node in live_nodes:
                    bits |= 1 << ordinal
            elif calico2 and pod_attribution(attribute, handle, live_nodes, calico2):
                bits |= 1 << ordinal
        if hosts:
            per_node[host or ""] += hosts
        if count and handle and not len(self.allocated) % HANDLE_SAMPLE_EVERY:
            self.handle_samples.append(handle)  # the last allocation's
        self.allocated[cidr] = count
        if bits:
            self.unheld[cidr] = bits
        if unowned:
            self.unowned[cidr] = unowned
        if unclaimed:
            self.unclaimed[cidr] = unclaimed
        return BlockSummary(host, Owners(sys.intern(host) if host else None, mine, others), touched)

    def blocks_read(self) -> None:
        """Every block is added: the endpoint IPs given so far are looked up, later ones at once."""
        self._networks = Networks()
        for cidr in (*self.unheld, *self.unclaimed):
            self._networks.add(cidr)
        pending, self._pending = self._pending, []
        self.held_by_endpoints(pending)

    def held_by_endpoints(self, ips: Iterable[str]) -> None:
        """Clear the ordinals at these workload endpoint IPs. Those given before blocks_read wait
        for it, so that a read may scan the endpoints beside the blocks."""
        networks = self._networks
        if networks is None:
            self._pending.extend(ips)
            return
        parse, at, unheld, unclaimed = self.parse_ip, networks.at, self.unheld, self.unclaimed
        for ip in ips:
            parsed = parse(ip)
            located = None if parsed is None else at(*parsed)
            if located is not None:
                cidr, ordinal = located
                if cidr in unheld:
                    unheld[cidr] &= ~(1 << ordinal)
                if cidr in unclaimed:
                    unclaimed[cidr] &= ~(1 << ordinal)

    def unowned_at(self, ips: Iterable[str]) -> dict[str, set[int]]:
        """Of the allocations `add` deferred (`unowned`), those at these IPs, by block. Without
        any, the IPs are not looked at (a read gives every gone host's: 50,000 at 2,500 of them)."""
        found: dict[str, set[int]] = {}
        if not self.unowned:
            return found
        networks = Networks()
        for cidr in self.unowned:
            networks.add(cidr)
        for ip in ips:
            parsed = self.parse_ip(ip)
            located = None if parsed is None else networks.at(*parsed)
            if located is not None and self.unowned[located[0]] >> located[1] & 1:
                found.setdefault(located[0], set()).add(located[1])
        return found

    def attribute(self, blocks: Iterable[IpamBlock]) -> None:
        """`pod_ips` from the ordinals no endpoint holds, in these blocks (those `unheld` names)."""
        self.attributed = True
        for block in blocks:
            bits = self.unheld.get(block.cidr, 0)
            if not bits:
                continue
            data = block_data(block)
            attributes = data["attributes"]
            ip_of = address_in(block.cidr)
            for ordinal, index in enumerate(data["allocations"]):
                if index is not None and bits >> ordinal & 1:
                    attribute = attributes[index]
                    handle = attribute["handle_id"]
                    names = pod_attribution(attribute, handle, self.live_nodes, self.calico2)
                    if names is not None:
                        node, namespace, pod = names
                        ip = ip_of(ordinal)
                        allocation = Allocation(ip, block.cidr, ordinal, handle, node, namespace, pod, attribute)
                        self.pod_ips[(namespace, pod)].append(allocation)


def scan_blocks(
    blocks: Sequence[IpamBlock],
    live_nodes: Set[str],
    endpoint_ips: Iterable[str],
    handles: Container[str],
    calico2: bool,
    attribute: bool = True,
) -> BlockScan:
    """One pass over every block (BlockScan.add), and the leak candidates, unless more endpoints
    (the pods, `attribute` False) are still to clear their IPs."""
    scan = BlockScan(live_nodes, calico2)
    for block in blocks:
        scan.add(block.cidr, block_data(block), handles)
    scan.blocks_read()
    scan.held_by_endpoints(endpoint_ips)
    if attribute:
        scan.attribute(blocks)
    return scan


def dangling_blocks(held: Held, missing: Set[int]) -> tuple[int, set[str]]:
    """How many allocations name a handle that is not there (`missing`: their ids' hashes), and
    the blocks that hold the first SAMPLE of them by address: the only blocks whose values a read
    needs for the audit's sample. Blocks do not overlap, so those of the lowest addresses hold
    the lowest allocations. A keyspace without handles had every block read again for it."""
    per_block = held.in_blocks(missing)
    sampled: set[str] = set()
    found = 0
    for cidr in sorted(per_block, key=address_order):
        if found >= SAMPLE:
            break
        sampled.add(cidr)
        found += per_block[cidr]
    return sum(per_block.values()), sampled


def address_order(ip_or_cidr: str) -> tuple[int, int]:
    """An address (or a network, by its first) in address order, IPv4 first."""
    return address_number(ip_or_cidr.partition("/")[0]) or (0, 0)


def find_dangling(blocks: Iterable[IpamBlock], missing: Set[int]) -> list[dict[str, str]]:
    """The allocations in `blocks` whose handle id hashes into `missing` (Held's keys that no
    handle key was read for)."""
    found = []
    for block in blocks:
        data = block_data(block)
        attributes = data.get("attributes") or []
        ip_of = address_in(block.cidr)
        for ordinal, index in enumerate(data["allocations"]):
            handle = attributes[index].get("handle_id") if index is not None else None
            if isinstance(handle, str) and hash(handle) in missing:
                found.append({"ip": ip_of(ordinal), "handle": handle})
    return found

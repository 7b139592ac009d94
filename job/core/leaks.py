"""Leaked pod IPs (pure): allocations on live nodes for a pod that is gone, runs on another node,
or holds other IPs now, and that no workload endpoint holds (docs/calico-data.md, "Leaked pod
IPs"). Found by settling every pod allocation against the pods as they are listed, page by page;
what no pod settles is leaked. Released only when asked, after --leak-grace-period of being seen
leaked in every run, and each block's release is re-checked against its pods right before it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from job.config import Config
from job.core.ipam import (
    block_data,
    dump,
    handle_problem,
    held_by,
    lowered_handle,
    normal_cidr,
    parse_handle,
    release,
)
from job.core.model import Cooldown, IpamBlock, IpamHandle, PodInfo, Step, Write

# What a run does about a leaked IP (the report's audit.leaked_ips.sample[].action).
LEAK_WAITING = "waiting_grace"
LEAK_REPORTED = "reported"  # leak release is off (--release-leaked-ips)
LEAK_WOULD_RELEASE = "would_release"
LEAK_RELEASED = "released"
LEAK_DEFERRED = "deferred"  # over --max-leak-releases, or the run stopped first
LEAK_LEFT_TO_HOST = "left_to_host"  # its block is written by a host this run removes
LEAK_POD_BACK = "pod_back"  # the pod was there again at the re-check
LEAK_CHANGED = "changed"  # the block or handle was written meanwhile: decided again next run
LEAK_FAILED = "failed"
# The namespace of a listed pod whose list does not say it (the pods asked for as a Table): no pod
# is without one, so it cannot be mistaken for a namespace.
ANY_NAMESPACE = ""
# Leaks whose first sighting is kept in the grace state (about 100 bytes each: the state's
# ConfigMap must stay well under 1 MiB); the rest are reported and wait for a later run.
MAX_TRACKED = 2000


@dataclass(frozen=True, slots=True)
class Allocation:
    """One pod IP as its block records it."""

    ip: str
    cidr: str
    ordinal: int
    handle: str
    node: str  # "" on Calico 2.x, which records no node: any pod of that name then holds it
    namespace: str
    pod: str
    attribute: Mapping[str, Any] = field(default_factory=dict, compare=False)  # as its block records it

    def settled_by(self, pod: PodInfo) -> bool:
        """The pod still holds this IP: same node, and this IP among its IPs (or none yet)."""
        if not self.node:
            return True
        return pod.node == self.node and (not pod.ips or self.ip in pod.ips)


def pod_attribution(
    attribute: Mapping[str, Any], handle: str, live_nodes: Set[str], calico2: bool
) -> tuple[str, str, str] | None:
    """(node, namespace, pod) of an allocation that names a pod on a live node, else None.
    Allocations of nodes that are gone go with their host instead. Calico 2.x records no node:
    there the pod is named by the handle its CNI writes, `<namespace>.<pod>`, and the node is ""
    (any pod of that name then holds the IP)."""
    secondary = attribute.get("secondary")
    if not isinstance(secondary, dict):
        secondary = {}  # none, or not an object: names no pod
    if calico2 and not secondary and "." in handle:
        namespace, pod = handle.split(".", 1)
        return "", namespace, pod
    node, space, name = secondary.get("node"), secondary.get("namespace"), secondary.get("pod")
    if isinstance(node, str) and node in live_nodes and isinstance(space, str) and isinstance(name, str):
        return (node, space, name) if space and name else None
    return None


def settle(candidates: dict[tuple[str, str], list[Allocation]], key: tuple[str, str], pod: PodInfo) -> None:
    """Drop from `candidates` the allocations this listed pod still holds."""
    allocations = candidates.get(key)
    if allocations is None:
        return
    left = [a for a in allocations if not a.settled_by(pod)]
    if left:
        candidates[key] = left
    else:
        del candidates[key]


def settler(candidates: dict[tuple[str, str], list[Allocation]]) -> Callable[[tuple[str, str], PodInfo], None]:
    """`settle` for each listed pod, once `candidates` are all known. A pod listed without its
    namespace (ANY_NAMESPACE) settles the candidates of its name in every namespace: an IP that a
    pod of that name holds on that node is in use, whoever's it is, and an IP-less one may be any
    of them (a leak hidden so waits a run)."""
    by_name: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for each in candidates:
        by_name[each[1]].append(each)

    def one(key: tuple[str, str], pod: PodInfo) -> None:
        keys = by_name.get(key[1], ()) if key[0] == ANY_NAMESPACE else (key,)
        for each in keys:
            settle(candidates, each, pod)

    return one


def as_listed(pod: PodInfo, families: Set[bool]) -> PodInfo:
    """A listed pod as the leak check reads it, the blocks being of `families` (True: IPv6). Where
    they are of one family and none of the pod's IPs is (another IPAM's address, printed first in
    a Table row, Kube.each_pod), the blocks' address is not said: the pod is taken as one whose IPs
    are not known, which settles by name and node."""
    if len(families) != 1 or not pod.ips or families & {":" in ip for ip in pod.ips}:
        return pod
    return PodInfo(pod.node, ())


def sighting(allocation: Allocation) -> str:
    return f"leak:{allocation.ip}@{allocation.handle}"


@dataclass(frozen=True)
class LeakRelease:
    """The release of one block's leaked IPs (one step: its handles, then the block)."""

    cidr: str
    leaks: tuple[Allocation, ...]
    step: Step


@dataclass(frozen=True)
class LeakPlan:
    actions: Mapping[str, str]  # ip -> what this run does about it
    since: Mapping[str, datetime]  # ip -> first seen leaked
    releases: tuple[LeakRelease, ...]
    sightings: Mapping[str, datetime]


def plan_leaks(
    leaked: Sequence[Allocation],
    blocks: Mapping[str, IpamBlock],
    handles: Mapping[str, IpamHandle],
    grace_state: Mapping[str, datetime],
    now: datetime,
    config: Config,
    busy: Set[str],
    cooldown: Cooldown | None = None,
) -> LeakPlan:
    """What to do about each leaked IP. `busy`: keys a host of this run writes anyway."""
    actions: dict[str, str] = {}
    since: dict[str, datetime] = {}
    sightings: dict[str, datetime] = {}
    ripe: dict[str, list[Allocation]] = defaultdict(list)
    for number, allocation in enumerate(sorted(leaked, key=lambda a: (a.cidr, a.ordinal))):
        if number >= MAX_TRACKED:
            actions[allocation.ip] = LEAK_DEFERRED
            continue
        mark = sighting(allocation)
        first = sightings[mark] = since[allocation.ip] = min(grace_state.get(mark, now), now)
        if now - first < config.leak_grace_period:
            actions[allocation.ip] = LEAK_WAITING
        elif not config.release_leaked_ips:
            actions[allocation.ip] = LEAK_REPORTED
        elif blocks[allocation.cidr].item.key in busy:
            actions[allocation.ip] = LEAK_LEFT_TO_HOST
        else:
            ripe[allocation.cidr].append(allocation)
    releases = []
    taken = 0
    for cidr, allocations in ripe.items():
        if taken + len(allocations) > config.max_leak_releases:
            actions.update((a.ip, LEAK_DEFERRED) for a in allocations)
            continue
        step = _release_step(blocks[cidr], allocations, handles, cooldown)
        if step is None:
            actions.update((a.ip, LEAK_DEFERRED) for a in allocations)
            continue
        taken += len(allocations)
        actions.update((a.ip, LEAK_WOULD_RELEASE) for a in allocations)
        releases.append(LeakRelease(cidr, tuple(allocations), step))
    return LeakPlan(actions, since, tuple(releases), sightings)


def _release_step(
    block: IpamBlock, allocations: Sequence[Allocation], handles: Mapping[str, IpamHandle], cooldown: Cooldown | None
) -> Step | None:
    """The block with the leaked IPs freed, and each of their handles lowered to what the block
    holds for it then (absolute, never raised), handles first; None if a handle is unreadable."""
    released, _ = release(block_data(block), {a.ordinal for a in allocations}, cooldown)
    writes = []
    for handle_id in sorted({a.handle for a in allocations}):
        handle = handles.get(handle_id)
        if handle is None:
            continue  # a missing handle is reported as such; the block is released all the same
        data = parse_handle(handle.item.value or "")
        if data is None or handle_problem(data) is not None:
            return None
        held = {k: held_by(released, handle_id) for k in data["block"] if normal_cidr(k) == block.cidr}
        lowered = lowered_handle(data, held)
        if lowered != data:
            writes.append(
                Write(
                    handle.item.key, handle.item.revision, None if lowered is None else dump(lowered), handle.item.value
                )
            )
    writes.append(Write(block.item.key, block.item.revision, dump(released), block.item.value))
    ips = ", ".join(a.ip for a in allocations)
    return Step(f"release leaked pod IPs {ips} in block {block.cidr}", tuple(writes))

"""Pure planning of a restore: put back what a kept report says a run removed, and nothing
that has moved on since (README, "Kept reports and restore"; docs/calico-data.md, "Restore").

- A key the run deleted is created again only while it is absent, or marked for deletion and
  not yet deleted (the first half of the run's own delete, on the Kubernetes datastore). Present
  with the value the run removed, it is already back; present with another value, it is a
  conflict.
- A key the run updated is never written back whole, which would undo everything that happened
  to it since. An IPAM block gets back the allocations the run freed, each only where its
  ordinal is still free (an IP allocated again since is a conflict), and its affinity only while
  no host claims it. A handle's count for a block is raised to what that block holds for it
  once its allocations are back, never lowered. Any other updated key is put back only if it
  still holds what the run wrote.
- A block's step carries its handles (first, as Calico's own assignment writes them) and its
  affinity key: one etcd transaction. The rest of the host follows, identity first.
- Every target is absolute, so planning again after any partial restore gives only what is left.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from job.core.ipam import (
    MAX_TXN_WRITES,
    affinity_host,
    allocate,
    block_shape_problem,
    dump,
    handle_problem,
    held_by,
    is_cooling,
    normal_cidr,
)
from job.core.model import CREATE, JsonObject, Step, StoredItem, Write

PENDING_DELETION = "pendingDeletion"  # an affinity's state once its delete has begun

# A failed host's report lists the writes that were applied, as does a skipped one's where it was
# skipped after a conflict (its Node back, its Felix alive).
RESTORABLE_ACTIONS = ("deleted", "failed", "skipped")


class ReportShapeError(ValueError):
    """The document is not a calico-gc run report this version can restore from."""


@dataclass(frozen=True)
class Change:
    """One write of the run being undone, as its report recorded it."""

    key: str
    op: str  # "delete" or "update"
    before: str | None
    after: str | None
    step: int


@dataclass(frozen=True)
class RemovedHost:
    name: str
    k8s_node: str | None  # the Kubernetes Node it was linked to (the same machine, if it is back)
    ipv4: str | None
    ipv6: str | None
    changes: tuple[Change, ...]

    def keys(self) -> list[str]:
        return [change.key for change in self.changes]


@dataclass(frozen=True)
class Finding:
    """A key that is not restored, and why; `ip` when an address was allocated again since."""

    key: str
    message: str
    ip: str | None = None


@dataclass(frozen=True)
class HostRestore:
    name: str
    steps: tuple[Step, ...] = ()
    conflicts: tuple[Finding, ...] = ()
    already: int = 0  # keys already as the run found them
    refused: str | None = None  # why nothing of this host is restored


def removed_hosts(report: Mapping[str, Any], only: Iterable[str] = ()) -> tuple[RemovedHost, ...]:
    """The hosts of a run report whose data the run removed (all of them, or those in `only`).
    A report is read as its schema says (job/report.schema.json) in every field a restore uses: a
    file edited by hand or cut short is refused whole, never half-restored."""
    wanted = set(only)
    hosts = report.get("hosts")
    if not isinstance(hosts, list):
        raise ReportShapeError("the report has no hosts list")
    removed = []
    for entry in hosts:
        if not isinstance(entry, dict) or (wanted and entry.get("name") not in wanted):
            continue
        if entry.get("action") not in RESTORABLE_ACTIONS or not entry.get("changes"):
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ReportShapeError(f"a removed host's name is {name!r}, not a name")
        for field in ("k8s_node", "ipv4", "ipv6"):
            if not isinstance(entry.get(field), str | None):
                raise ReportShapeError(f"host {name!r}: {field} is {entry[field]!r}, not a string or null")
        if not isinstance(entry["changes"], list):
            raise ReportShapeError(f"host {name!r}: changes is {_kind(entry['changes'])}, not a list")
        changes = tuple(_change(name, change) for change in entry["changes"])
        removed.append(RemovedHost(name, entry.get("k8s_node"), entry.get("ipv4"), entry.get("ipv6"), changes))
    missing = wanted - {host.name for host in removed}
    if missing:
        raise ReportShapeError(f"the report removed nothing of {', '.join(sorted(missing))}")
    return tuple(removed)


def _change(host: str, change: Any) -> Change:
    """One recorded write, its types as the report schema gives them (a report without steps, as
    older versions wrote, is one step)."""
    if not isinstance(change, dict):
        raise ReportShapeError(f"host {host!r}: a change is {_kind(change)}, not an object")
    key, op, before, after, step = (change.get(f) for f in ("key", "op", "before", "after", "step"))
    if not isinstance(key, str) or not key:
        raise ReportShapeError(f"host {host!r}: a change's key is {key!r}, not a key")
    if op not in ("delete", "update"):
        problem = f"op is {op!r}, not delete or update"
    elif not isinstance(before, str | None) or not isinstance(after, str | None):
        problem = f"before is {_kind(before)} and after {_kind(after)}: each a value or null"
    elif step is not None and (type(step) is not int or step < 0):
        problem = f"step is {step!r}, not a whole number"
    else:
        return Change(key, str(op), before, after, step or 0)
    raise ReportShapeError(f"host {host!r}: the change of {key}: {problem}")


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _parse(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _marked(value: Any) -> bool:
    """A value marked for deletion and not yet deleted (Kubernetes: a block's `deleted: true`
    tombstone, an affinity's `pendingDeletion`): the first half of a delete, the run's own when
    it was killed between the two. To a restore of a key the run deleted, as good as gone."""
    data = value.get("spec", value) if isinstance(value, dict) else None  # a Kubernetes object by its spec
    return isinstance(data, dict) and (data.get("deleted") is True or data.get("state") == PENDING_DELETION)


def _unmarked(change: Change, now: StoredItem) -> Write:
    """A marked key put back as it was, over its mark: an update, which for a Kubernetes object
    (recorded whole) writes its spec, the object's metadata being the server's."""
    before = _parse(change.before)
    whole = isinstance(before, dict) and "metadata" in before and "spec" in before
    return Write(change.key, now.revision, dump(before["spec"]) if whole else change.before, now.value)


def _is_block(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("allocations"), list) and "cidr" in value


def _is_handle(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("block"), dict) and "allocations" not in value


def _same(one: str | None, other: str | None) -> bool:
    """Equal as data. Kubernetes objects compare by spec: the server rewrites their metadata."""
    if one is None or other is None:
        return one is other
    a, b = _parse(one), _parse(other)
    if a is None or b is None:
        return one == other
    if isinstance(a, dict) and isinstance(b, dict) and "metadata" in a and "metadata" in b:
        return bool(a.get("spec") == b.get("spec"))
    return bool(a == b)


def handle_id(key: str, value: Mapping[str, Any]) -> str:
    """The handle's ID: in its spec on the Kubernetes datastore, else the last part of its key."""
    named = value.get("handleID")
    return named if isinstance(named, str) else key.rsplit("/", 1)[-1]


@dataclass
class _Block:
    """One block's restore: its write (if any), its value afterwards, its handles' holdings."""

    change: Change
    write: Write | None
    after: JsonObject | None
    handles: set[str]  # handles that get an allocation back here
    affinity_ok: bool


def _released(block: Mapping[str, Any], ordinal: int) -> bool:
    """Whether an ordinal is free or in IP cooldown in a block value: released either way."""
    index = block["allocations"][ordinal]
    return index is None or is_cooling((block.get("attributes") or [])[index])


def _restore_block(host: str, change: Change, now: StoredItem | None, findings: list[Finding]) -> _Block:
    before = _parse(change.before)
    after = _parse(change.after) if change.op == "update" else None
    problem = block_shape_problem(before) or (block_shape_problem(after) if change.op == "update" else None)
    if problem is not None:
        findings.append(Finding(change.key, f"the report's block cannot be read: {problem}"))
        return _Block(change, None, None, set(), False)
    attributes = before.get("attributes") or []
    wanted = {  # what the run released: freed, or (IP cooldown) pointed at a cooldown attribute
        ordinal: attributes[index]
        for ordinal, index in enumerate(before["allocations"])
        if index is not None and (after is None or _released(after, ordinal))
    }
    wants_affinity = affinity_host(before) == host and (after is None or affinity_host(after) != host)
    network = ipaddress.ip_network(before["cidr"], strict=False)
    handles = {str(a.get("handle_id")) for a in wanted.values() if a.get("handle_id")}
    if change.op == "delete" and (now is None or _marked(_parse(now.value))):
        back = Write(change.key, CREATE, change.before, None) if now is None else _unmarked(change, now)
        return _Block(change, back, before, handles, True)
    if now is None:
        findings.append(Finding(change.key, f"block {network} was deleted since: its {len(wanted)} IPs stay free"))
        return _Block(change, None, None, set(), False)
    current = _parse(now.value)
    problem = block_shape_problem(current)
    if problem is not None or current.get("deleted") is True:
        why = problem or "it is being deleted (a tombstone)"
        findings.append(Finding(change.key, f"block {network} as it is now cannot take allocations back: {why}"))
        return _Block(change, None, None, set(), False)
    current_attributes = current.get("attributes") or []
    free = {}
    for ordinal, attribute in wanted.items():
        index = current["allocations"][ordinal]
        if _released(current, ordinal):  # free, or cooling: released, no one's
            free[ordinal] = attribute
        elif current_attributes[index] != attribute:
            holder = current_attributes[index].get("handle_id")
            ip = str(network[ordinal])
            findings.append(Finding(change.key, f"{ip} was allocated again since (handle {holder})", ip))
    new = allocate(current, free)
    affinity_ok = False
    if wants_affinity:
        holder = affinity_host(current)
        if current.get("affinity") is None:
            new = {**new, "affinity": before["affinity"]}
            for claim_time in ("affinity_claim_time", "affinityClaimTime"):
                if claim_time in before:
                    new[claim_time] = before[claim_time]
            affinity_ok = True
        elif holder == host:
            affinity_ok = True
        else:
            findings.append(Finding(change.key, f"block {network} is claimed by {current.get('affinity')} now"))
    write = Write(change.key, now.revision, dump(new), now.value) if new != current else None
    # Every handle of an allocation the block holds again, or still: a run killed between a
    # handle and its block (one write each, on etcd v2 and Kubernetes) deleted the one only.
    held = {hid for hid in handles if held_by(new, hid)}
    return _Block(change, write, new, held, affinity_ok)


def _raised_handle(change: Change, now: StoredItem | None, block: _Block, hid: str) -> Write | None:
    """The handle counting what `block` holds for it once restored; None when it already does."""
    assert block.after is not None
    cidr = str(ipaddress.ip_network(block.after["cidr"], strict=False))
    target = held_by(block.after, hid)
    if now is None:
        template = _parse(change.before) or {}
        if not target:
            return None
        value = {**template, "block": {block.after["cidr"]: target}}
        if "deleted" in value:
            value["deleted"] = False
        return Write(change.key, CREATE, dump(value), None)
    current = _parse(now.value)
    if handle_problem(current) is not None:
        return None
    counts = dict(current.get("block") or {})
    key = next((k for k in counts if normal_cidr(k) == cidr), block.after["cidr"])
    if counts.get(key, 0) >= target:
        return None
    counts[key] = target
    return Write(change.key, now.revision, dump({**current, "block": counts}), now.value)


def _addresses(value: Any) -> Iterator[str]:
    """Every IP address a JSON value names (`10.0.0.5`, `10.0.0.5/32`), wherever it is."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _addresses(item)
    elif isinstance(value, str) and (value[:1].isdigit() or ":" in value):
        try:
            yield str(ipaddress.ip_interface(value).ip)
        except ValueError:
            return


def _generic(
    change: Change, now: StoredItem | None, findings: list[Finding], taken: Collection[str] = ()
) -> Write | bool | None:
    """The write that puts a non-IPAM key back; True when it already is, None when it cannot be.
    A key that names an address in `taken` (allocated to someone else since) stays away: a
    workload endpoint brought back with another pod's IP would make two owners of it."""
    if change.before is None:
        findings.append(Finding(change.key, "the report holds no value from before"))
        return None
    clash = sorted(set(taken).intersection(_addresses(_parse(change.before))))
    if clash:
        findings.append(Finding(change.key, f"not restored: it names {', '.join(clash)}, allocated again since"))
        return None
    current = now.value if now is not None else None
    if _same(current, change.before):
        return True
    if change.op == "delete":
        if now is None:
            return Write(change.key, CREATE, change.before, None)
        if _marked(_parse(current)):
            return _unmarked(change, now)
        findings.append(Finding(change.key, "exists again with another value"))
        return None
    if now is not None and _same(current, change.after):
        return Write(change.key, now.revision, change.before, current)
    findings.append(Finding(change.key, "deleted since" if now is None else "changed since"))
    return None


def _chunks(purpose: str, writes: Sequence[Write]) -> list[Step]:
    return [
        Step(purpose, tuple(writes[start : start + MAX_TXN_WRITES])) for start in range(0, len(writes), MAX_TXN_WRITES)
    ]


def plan_host(host: RemovedHost, now: Mapping[str, StoredItem], addresses: Mapping[str, str]) -> HostRestore:
    """What is left to restore of one host, given its keys as they are now (`now`) and who holds
    each node address now (`addresses`: Calico hosts and Kubernetes Nodes by name)."""
    for address in (host.ipv4, host.ipv6):
        holder = addresses.get(address or "")
        if holder is not None and holder not in (host.name, host.k8s_node):
            why = f"its address {address} belongs to {holder} now; restoring it would start the IP clash over"
            return HostRestore(host.name, refused=why)
    findings: list[Finding] = []
    handles: dict[str, Change] = {}
    groups: dict[int, list[Change]] = {}
    for change in host.changes:
        if change.key.endswith("/"):  # an etcd v2 directory: comes back with its first key
            continue
        value = _parse(change.before)
        if _is_handle(value):
            handles[handle_id(change.key, value)] = change
        else:
            groups.setdefault(change.step, []).append(change)
    steps: list[Step] = []
    generic: list[Change] = []
    already = 0
    for number in sorted(groups):
        blocks = [c for c in groups[number] if _is_block(_parse(c.before))]
        if not blocks:
            generic += groups[number]
            continue
        others = [c for c in groups[number] if c not in blocks]  # the affinity key
        for position, change in enumerate(blocks):
            block = _restore_block(host.name, change, now.get(change.key), findings)
            writes = []
            for hid in sorted(block.handles & set(handles)):
                raised = _raised_handle(handles[hid], now.get(handles[hid].key), block, hid)
                writes += [raised] if raised else []
            if block.write is not None:
                writes.append(block.write)
            elif block.after is not None and not any(f.key == change.key for f in findings):
                already += 1
            for other in others if position == 0 else ():
                if not block.affinity_ok:
                    findings.append(Finding(other.key, "not restored: the block's affinity is not this host's"))
                    continue
                restored = _generic(other, now.get(other.key), findings)
                already += restored is True
                writes += [restored] if isinstance(restored, Write) else []
            if writes:
                steps += _chunks(f"restore block {_parse(change.before)['cidr']}", writes)
    rest: list[Write] = []
    taken = {f.ip for f in findings if f.ip}
    for change in sorted(generic, key=lambda c: -c.step):  # the host's identity before what hangs on it
        restored = _generic(change, now.get(change.key), findings, taken)
        already += restored is True
        rest += [restored] if isinstance(restored, Write) else []
    steps += _chunks("restore the host's keys", rest)
    return HostRestore(host.name, tuple(steps), tuple(findings), already)

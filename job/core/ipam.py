"""Pure editing of Calico IPAM blocks and handles, mirroring libcalico-go's algorithm.

Blocks are edited as the JSON objects Calico stores: only the fields this module means to
change are touched, every other field (known or not) is written back as it was read.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import repeat
from typing import Any

from job.core.kept import Keep
from job.core.model import (
    CalicoHost,
    Cooldown,
    IpamBlock,
    IpamHandle,
    JsonObject,
    Owners,
    Step,
    StoredItem,
    Write,
    ascii_number,
    parse_time,
)

WINDOWS_RESERVED_HANDLE = "windows-reserved-ipam-handle"
TUNNEL_HANDLE_PREFIXES = (
    "ipip-tunnel-addr-",
    "vxlan-tunnel-addr-",
    "vxlan-v6-tunnel-addr-",
    "wireguard-tunnel-addr-",
    "wireguard-v6-tunnel-addr-",
)

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"  # 0-255, no leading zero (as ipaddress)
_IPV4 = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")
MAX_TXN_WRITES = 128  # etcd's default --max-txn-ops; every step is one transaction
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def dump(value: JsonObject) -> str:
    """Serialise as Go's encoding/json does (no spaces), keeping field order."""
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Cidr:
    """A network: its canonical text, IP version, first address as a number, and prefix length."""

    text: str
    version: int
    base: int
    length: int

    @property
    def size(self) -> int:
        return 1 << ((32 if self.version == 4 else 128) - self.length)


def parse_cidr(text: str, strict: bool = True) -> Cidr | None:
    """`text` as a network, None when it is not one (or, `strict`, has host bits set). IPv4 is
    parsed by hand: a read parses every block's CIDR, and an ipaddress network costs 5 us."""
    address, slash, length = text.partition("/")
    prefix = ascii_number(length)
    parsed = address_number(address) if ":" not in address and slash and prefix is not None else None
    if parsed is not None and prefix is not None and prefix <= 32:
        number = parsed[1]
        base = number >> (32 - prefix) << (32 - prefix)
        if base == number:
            return Cidr(f"{address}/{prefix}", 4, base, prefix)
        return None if strict else Cidr(f"{_ipv4_text(base)}/{prefix}", 4, base, prefix)
    return _ipaddress_cidr(text, strict)


@functools.cache
def _ipaddress_cidr(text: str, strict: bool) -> Cidr | None:
    """parse_cidr by ipaddress (IPv6, and IPv4 not written as Calico writes it), once per text: a
    dual-stack read asks again for each IPv6 block's CIDR (its key, its affinity's, its value, the
    index), 12 us each, where one entry per block costs 0.26 KB (docs/development.md)."""
    try:
        network = ipaddress.ip_network(text, strict=strict)
    except ValueError:
        return None
    return Cidr(str(network), network.version, int(network.network_address), network.prefixlen)


def block_shape_problem(data: object, cidr: str | None = None) -> str | None:
    """Why a parsed block value cannot be edited safely (or is not the block `cidr` names)."""
    if not isinstance(data, dict):
        return "block value is not a JSON object"
    network = parse_cidr(str(data.get("cidr")))
    if network is None:
        return f"block cidr {data.get('cidr')!r} is not a network"
    if cidr is not None and network.text != cidr:
        return f"block cidr {data['cidr']!r} does not match its key"
    allocations = data.get("allocations")
    attributes = data.get("attributes") or []
    unallocated = data.get("unallocated") or []
    if not isinstance(allocations, list) or len(allocations) != network.size:
        return "block allocations do not match its cidr size"
    # Checked a type at a time (set(map(type, ...))), not an item at a time: a read checks every block.
    if not isinstance(attributes, list) or not set(map(type, attributes)) <= {dict}:
        return "block attributes are not a list of objects"
    # Calico's Go types: a handle_id is a string and a secondary an object, else Calico cannot read the block.
    if not set(map(type, map(dict.get, attributes, repeat("handle_id")))) <= {str, type(None)}:
        handle = next(h for h in (a.get("handle_id") for a in attributes) if h is not None and type(h) is not str)
        return f"block attribute handle_id is {handle!r}, not a string"
    if not set(map(type, map(dict.get, attributes, repeat("secondary")))) <= {dict, type(None)}:
        return "block attribute secondary is not an object"
    if not isinstance(unallocated, list) or not set(map(type, unallocated)) <= {int}:
        return "block unallocated is not a list of ordinals"
    pointers = [index for index in allocations if index is not None]
    if pointers and not (set(map(type, pointers)) <= {int} and min(pointers) >= 0 and max(pointers) < len(attributes)):
        index = next(i for i in pointers if not (type(i) is int and 0 <= i < len(attributes)))
        return f"block allocation points at missing attribute {index!r}"
    if "sequenceNumber" in data and type(data["sequenceNumber"]) is not int:
        return f"block sequenceNumber is {data['sequenceNumber']!r}, not a whole number"
    return None


def summarize_block(data: Mapping[str, Any]) -> tuple[str | None, Owners]:
    """What the index needs of a block: its affine host and each allocated ordinal's node.

    The node is `secondary.node`, else the node of a tunnel handle (`ipip-tunnel-addr-<n>`).
    """
    host = affinity_host(data)
    bits, others = 0, None
    attributes = data.get("attributes") or []
    for ordinal, position in enumerate(data["allocations"]):
        if position is not None:
            attribute = attributes[position]
            handle = attribute.get("handle_id")
            owner = _owner_node(attribute) or tunnel_handle_node(handle if isinstance(handle, str) else None)
            if owner and owner == host:
                bits |= 1 << ordinal
            else:
                others = others or {}
                others[ordinal] = sys.intern(owner) if owner else None
    return host, Owners(sys.intern(host) if host else None, bits, others)


def block_data(block: IpamBlock) -> JsonObject:
    """A block's JSON; the adapter validated its shape when it read it."""
    if block.item.value is None:  # a lean read's summary (Inventory.scan): a bug to get here
        raise LookupError(f"IPAM block {block.cidr} was read without its value")
    data: JsonObject = json.loads(block.item.value)
    return data


def affinity_host(block: Mapping[str, object]) -> str | None:
    affinity = block.get("affinity")
    if isinstance(affinity, str) and affinity.startswith("host:"):
        return affinity[len("host:") :]
    return None


def tunnel_handle_node(handle_id: str | None) -> str | None:
    """The node a tunnel-address handle (e.g. `ipip-tunnel-addr-<node>`) belongs to."""
    if handle_id:
        for prefix in TUNNEL_HANDLE_PREFIXES:
            if handle_id.startswith(prefix):
                return handle_id[len(prefix) :]
    return None


def attribute_at(block: Mapping[str, object], ordinal: int) -> Mapping[str, object]:
    """The attributes of the allocation at `ordinal` ({} where it is free)."""
    index = block["allocations"][ordinal]  # type: ignore[index]
    return block["attributes"][index] if index is not None else {}  # type: ignore[index]


def _owner_node(attribute: Mapping[str, object]) -> str | None:
    secondary = attribute.get("secondary")
    node = secondary.get("node") if isinstance(secondary, dict) else None
    return node if isinstance(node, str) else None


def holds_only_cooling(block: Mapping[str, object]) -> bool:
    """Every allocation left is an address in IP cooldown (none is anyone's)."""
    allocations: list[int | None] = block["allocations"]  # type: ignore[assignment]
    return all(index is None or is_cooling(attribute_at(block, ordinal)) for ordinal, index in enumerate(allocations))


def is_empty(block: Mapping[str, object]) -> bool:
    """No allocations left, ignoring Windows-reserved ones (as Calico counts it)."""
    allocations: list[int | None] = block["allocations"]  # type: ignore[assignment]
    for ordinal, index in enumerate(allocations):
        if index is not None and attribute_at(block, ordinal).get("handle_id") != WINDOWS_RESERVED_HANDLE:
            return False
    return True


def _bump_sequence(block: JsonObject) -> None:
    # Calico 2.x blocks have no sequence number; never add fields that were not there.
    if "sequenceNumber" in block:
        block["sequenceNumber"] += 1


RELEASED_AT = "releasedAt"  # IP cooldown: the attribute a released address points at until it has cooled


def is_cooling(attribute: Mapping[str, object]) -> bool:
    """An address in cooldown: released, pointed at an attribute holding only when."""
    return RELEASED_AT in attribute and not attribute.get("handle_id")


def _cooled(attribute: Mapping[str, object], cooldown: Cooldown) -> bool:
    """Whether a cooling address has waited out the cooldown (Calico's garbageCollect: released
    before now - cooldown, with a millisecond's leeway so that 0 frees at once)."""
    released = parse_time(attribute.get(RELEASED_AT))
    limit = cooldown.now - timedelta(seconds=cooldown.seconds) + timedelta(milliseconds=1)
    return released is not None and released < limit


def release(
    block: Mapping[str, object], ordinals: Collection[int], cooldown: Cooldown | None = None
) -> tuple[JsonObject, Counter[str]]:
    """Free `ordinals` in a copy of `block`; return it and how many IPs each handle lost.

    Windows-reserved allocations are never freed. Attributes whose every reference was
    freed are dropped and the remaining allocations renumbered, as libcalico-go does. With a
    cooldown above 0 the addresses are released as Calico releases them: pointed at one new
    attribute holding only `releasedAt` (now), not freed until they have cooled.
    """
    if cooldown is not None and cooldown.seconds > 0:
        return _release_to_cooldown(block, ordinals, cooldown)
    if cooldown is not None:  # a cooldown of 0: freed at once, and whatever cools is freed too
        freed_now, lost = release(block, ordinals)
        collect_cooled(freed_now, cooldown)
        return freed_now, lost
    # Shallow copy; every field changed below gets a fresh container, so `block` is untouched.
    new: JsonObject = dict(block)
    allocations: list[int | None] = list(new["allocations"])
    attributes: list[JsonObject] = new.get("attributes") or []
    unallocated = list(new["unallocated"]) if isinstance(new.get("unallocated"), list) else []
    listed = set(unallocated)
    sequence_by_ordinal = new.get("sequenceNumberForAllocation")
    if isinstance(sequence_by_ordinal, dict):
        sequence_by_ordinal = new["sequenceNumberForAllocation"] = dict(sequence_by_ordinal)
    references = Counter(index for index in allocations if index is not None)
    freed: Counter[int] = Counter()
    handles: Counter[str] = Counter()
    for ordinal in sorted(ordinals):
        index = allocations[ordinal]
        if index is None or attributes[index].get("handle_id") == WINDOWS_RESERVED_HANDLE:
            continue
        allocations[ordinal] = None
        if ordinal not in listed:  # data that already listed it is not made worse
            unallocated.append(ordinal)
            listed.add(ordinal)
        if isinstance(sequence_by_ordinal, dict):
            sequence_by_ordinal.pop(str(ordinal), None)
        freed[index] += 1
        handle_id = attributes[index].get("handle_id")
        if isinstance(handle_id, str) and handle_id:
            handles[handle_id] += 1
    if not freed:
        return dict(block), handles
    unused = {index for index, count in freed.items() if references[index] == count}
    new["allocations"], kept = _compacted(allocations, attributes, lambda index: index not in unused)
    new["unallocated"] = unallocated
    if "attributes" in new:
        new["attributes"] = kept
    _bump_sequence(new)
    return new, handles


def _compacted(
    allocations: list[int | None], attributes: list[Any], keep: Callable[[int], bool]
) -> tuple[list[int | None], list[Any]]:
    """The attributes `keep` keeps, in order, and the allocations renumbered onto them, as
    libcalico-go compacts a block's attributes (an allocation must not point at a dropped one)."""
    kept = [index for index in range(len(attributes)) if keep(index)]
    renumbered = {old: position for position, old in enumerate(kept)}
    return [None if index is None else renumbered[index] for index in allocations], [attributes[i] for i in kept]


def _release_to_cooldown(
    block: Mapping[str, object], ordinals: Collection[int], cooldown: Cooldown
) -> tuple[JsonObject, Counter[str]]:
    """release() with a cooldown: the ordinals point at a new cooldown attribute; then what has
    cooled anywhere in the block is freed, as Calico's garbageCollect does on every block write."""
    new: JsonObject = dict(block)
    allocations: list[int | None] = list(new["allocations"])
    attributes: list[JsonObject] = list(new.get("attributes") or [])
    handles: Counter[str] = Counter()
    cooling: int | None = None
    for ordinal in sorted(ordinals):
        index = allocations[ordinal]
        if index is None or is_cooling(attributes[index]):
            continue  # not allocated, or already in cooldown: Calico's release is a no-op there
        if attributes[index].get("handle_id") == WINDOWS_RESERVED_HANDLE:
            continue
        handle_id = attributes[index].get("handle_id")
        if isinstance(handle_id, str) and handle_id:
            handles[handle_id] += 1
        if cooling is None:
            attributes.append({RELEASED_AT: cooldown.now.strftime("%Y-%m-%dT%H:%M:%SZ")})
            cooling = len(attributes) - 1
        allocations[ordinal] = cooling
    if cooling is None:
        return dict(block), handles
    new["allocations"], new["attributes"] = allocations, attributes
    collect_cooled(new, cooldown)
    _bump_sequence(new)
    return new, handles


def collect_cooled(block: JsonObject, cooldown: Cooldown) -> None:
    """In place, as Calico's garbageCollect: free each address whose cooldown is over (onto
    `unallocated`, its sequence number dropped), then drop the attributes nothing refers to and
    renumber the allocations."""
    allocations: list[int | None] = list(block["allocations"])
    attributes: list[JsonObject] = list(block.get("attributes") or [])
    unallocated = list(block.get("unallocated") or [])
    sequence_by_ordinal = block.get("sequenceNumberForAllocation")
    if isinstance(sequence_by_ordinal, dict):
        sequence_by_ordinal = block["sequenceNumberForAllocation"] = dict(sequence_by_ordinal)
    for ordinal, index in enumerate(allocations):
        if index is not None and is_cooling(attributes[index]) and _cooled(attributes[index], cooldown):
            allocations[ordinal] = None
            unallocated.append(ordinal)
            if isinstance(sequence_by_ordinal, dict):
                sequence_by_ordinal.pop(str(ordinal), None)
    used = {index for index in allocations if index is not None}
    block["allocations"], block["attributes"] = _compacted(allocations, attributes, used.__contains__)
    block["unallocated"] = unallocated


def allocate(block: Mapping[str, object], wanted: Mapping[int, Mapping[str, object]]) -> JsonObject:
    """A copy of `block` with each free ordinal of `wanted` allocated to its attribute (the
    inverse of `release`, for a restore). An equal attribute already in the block is shared, as
    Calico shares one per handle; an ordinal already allocated is left as it is (the caller
    decides whether that is the same allocation or a conflict). An ordinal in IP cooldown is free
    to take back: released, no one's, and what a restore undoes is that release. Blocks that
    record a sequence number per allocation get the block's current one, as Calico's assignment does."""
    new: JsonObject = dict(block)
    allocations: list[int | None] = list(new["allocations"])
    attributes: list[Any] = list(new.get("attributes") or [])
    free = [o for o in sorted(wanted) if allocations[o] is None or is_cooling(attributes[allocations[o]])]  # type: ignore[index]
    if not free:
        return new
    sequence_by_ordinal = new.get("sequenceNumberForAllocation")
    if "sequenceNumber" in new:
        sequence_by_ordinal = new["sequenceNumberForAllocation"] = dict(sequence_by_ordinal or {})
    for ordinal in free:
        attribute = dict(wanted[ordinal])
        if attribute not in attributes:
            attributes.append(attribute)
        allocations[ordinal] = attributes.index(attribute)
        if isinstance(sequence_by_ordinal, dict):
            sequence_by_ordinal[str(ordinal)] = new["sequenceNumber"]
    used = {index for index in allocations if index is not None}
    if len(used) < len(attributes):  # a cooldown attribute no ordinal points at any more goes, as in Calico
        allocations, attributes = _compacted(
            allocations, attributes, lambda index: index in used or not is_cooling(attributes[index])
        )
    new["allocations"] = allocations
    new["attributes"] = attributes
    new["unallocated"] = [o for o in new.get("unallocated") or [] if o not in set(free)]
    _bump_sequence(new)
    return new


def without_affinity(block: Mapping[str, object]) -> JsonObject:
    """A copy of a block that no host claims any more (it keeps lending its IPs)."""
    new: JsonObject = dict(block)  # only top-level fields change
    new["affinity"] = None
    new.pop("affinity_claim_time", None)  # etcd
    new.pop("affinityClaimTime", None)  # Kubernetes datastore
    _bump_sequence(new)
    return new


def handle_problem(handle: object) -> str | None:
    """Why a parsed handle cannot be edited safely: it must be `{"block": {cidr: count}}`."""
    if not isinstance(handle, dict) or not isinstance(handle.get("block", {}), dict):
        return 'handle value is not {"block": {...}}'
    for cidr, count in (handle.get("block") or {}).items():
        if type(count) is not int or count < 0:
            return f"handle count for {cidr} is {count!r}, not a whole number"
    return None


def held_by(block: Mapping[str, Any] | None, handle_id: str) -> int:
    """How many allocations `block` still holds for `handle_id` (0 for a deleted block)."""
    if block is None:
        return 0
    attributes = block.get("attributes") or []
    return sum(1 for i in block["allocations"] if i is not None and attributes[i].get("handle_id") == handle_id)


def holdings(block: Mapping[str, Any] | None) -> Counter[object]:
    """held_by for every handle at once (none for a deleted block): a plan lowers a host's ~20
    handles in one block, and counting the block for each cost it 20 walks (held_by: 1.3 us a
    call at 64 addresses, this 2.9 us for all)."""
    if block is None:
        return Counter()
    attributes = block.get("attributes") or []
    return Counter(attributes[i].get("handle_id") for i in block["allocations"] if i is not None)


def lowered_handle(handle: Mapping[str, Any], held: Mapping[str, int | None]) -> JsonObject | None:
    """The handle with each block's count lowered to what that block still holds.

    `held` maps the handle's own cidr keys to a count, or None where it is unknown (a block
    that could not be parsed): those counts stay. Counts are never raised. None means nothing
    is left and the handle should go. Because the target is absolute, planning this again
    after any partial run gives the same result: a crash or a re-plan cannot decrement twice.
    """
    per_block: dict[str, int] = dict(handle.get("block") or {})
    for cidr, count in list(per_block.items()):
        target = held.get(cidr)
        if target is not None and target < count:
            if target:
                per_block[cidr] = target
            else:
                del per_block[cidr]
    if not per_block:
        return None
    return {**handle, "block": per_block}


def _ipv4_text(number: int) -> str:
    """An IPv4 address as text, from its number, without an ipaddress object."""
    return f"{number >> 24}.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}"


def address_number(ip: str) -> tuple[int, int] | None:
    """An address as text as (IP version, number); None when it is not one. IPv4 is parsed by hand:
    a run looks up every endpoint IP, and an `ipaddress` object for each costs more than the rest."""
    if ":" in ip:
        try:
            return 6, int(ipaddress.IPv6Address(ip))
        except ValueError:
            return None
    if _IPV4.fullmatch(ip) is None:
        return None
    a, b, c, d = map(int, ip.split("."))
    return 4, a << 24 | b << 16 | c << 8 | d


class Networks:
    """Block CIDRs by network, to find the block an address is in without an ipaddress object
    per block (a run may index 15,000)."""

    __slots__ = ("_bases",)

    def __init__(self) -> None:
        # version -> host bits (128 or 32 less the prefix length) -> base -> cidr: an address is
        # looked up only among blocks of its family (a read looks up every endpoint IP).
        self._bases: dict[int, dict[int, dict[int, str]]] = {4: {}, 6: {}}

    def _shape(self, cidr: str) -> tuple[dict[int, str], int]:
        network = _network(cidr)
        width = 128 if network.version == 6 else 32
        return self._bases[network.version].setdefault(width - network.length, {}), network.base

    def add(self, cidr: str) -> None:
        bases, base = self._shape(cidr)
        bases[base] = cidr

    def copy(self) -> Networks:
        copied = Networks()
        for version, shapes in self._bases.items():
            copied._bases[version] = {bits: dict(bases) for bits, bases in shapes.items()}
        return copied

    def discard(self, cidr: str) -> None:
        bases, base = self._shape(cidr)
        bases.pop(base, None)

    def locate(self, ip: str) -> tuple[str, int] | None:
        """The block `ip` is in and its ordinal there; None when in none (or not an address)."""
        parsed = address_number(ip)
        return None if parsed is None else self.at(*parsed)

    def at(self, version: int, address: int) -> tuple[str, int] | None:
        """The block an address (as a number) is in and its ordinal there; None when in none."""
        for bits, bases in self._bases[version].items():
            base = address >> bits << bits
            cidr = bases.get(base)
            if cidr is not None:
                return cidr, address - base
        return None


@dataclass
class IpamIndex:
    """Blocks indexed once per run so that planning a host never scans every block."""

    blocks: dict[str, IpamBlock] = field(default_factory=dict)
    handles: Mapping[str, IpamHandle] = field(default_factory=dict)
    owned: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # node -> blocks
    affine: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    malformed_networks: list[IpNetwork] = field(default_factory=list)
    networks: Networks = field(default_factory=Networks)
    keep: Keep | None = None  # allocations that stay whatever their node says (kept.py)
    cooldown: Cooldown | None = None  # IP cooldown, where the datastore's IPAMConfig was read

    @classmethod
    def build(
        cls,
        blocks: Iterable[IpamBlock],
        handles: Mapping[str, IpamHandle],
        malformed_blocks: Iterable[str] = (),
        keep: Keep | None = None,
        cooldown: Cooldown | None = None,
    ) -> IpamIndex:
        index = cls(handles=handles, keep=keep, cooldown=cooldown)
        for block in blocks:
            index._add(block)
        for cidr in malformed_blocks:
            try:
                index.malformed_networks.append(ipaddress.ip_network(cidr))
            except ValueError:
                continue
        return index

    def updated(
        self, blocks: Mapping[str, IpamBlock | None], handles: Mapping[str, IpamHandle], malformed: Iterable[str] = ()
    ) -> IpamIndex:
        """This index with `blocks` as they are now (None: gone), these handles and these blocks
        newly unreadable: what re-planning a host after a conflict needs, indexing only the
        blocks that changed (equal to `build` over the whole inventory, which cost 50 ms a
        conflict at 5,000 hosts). The lists it changes are copies: this index is not changed."""
        index = IpamIndex(dict(self.blocks), handles, defaultdict(list, self.owned), defaultdict(list, self.affine))
        index.keep, index.cooldown = self.keep, self.cooldown
        index.malformed_networks = list(self.malformed_networks)
        index.networks = self.networks.copy()
        for cidr in dict.fromkeys([*blocks, *malformed]):
            old, new = index.blocks.pop(cidr, None), blocks.get(cidr)
            # Every list the old or the new block is in becomes a copy without it (the lists are
            # this index's), then the new block is added to those copies.
            for table, name in [*index._entries(old), *index._entries(new)]:
                table[name] = [c for c in table.get(name, ()) if c != cidr]
            if old is not None:
                index.networks.discard(cidr)
            if new is not None:
                index._add(new)
        for cidr in malformed:
            with contextlib.suppress(ValueError):
                index.malformed_networks.append(ipaddress.ip_network(cidr))
        return index

    def _entries(self, block: IpamBlock | None) -> list[tuple[dict[str, list[str]], str]]:
        """The lists of `owned` and `affine` that `block` is in, as (table, name)."""
        if block is None:
            return []
        entries = [(self.owned, owner) for owner in block.owners.nodes()]
        return entries + ([(self.affine, block.affine_host)] if block.affine_host is not None else [])

    def _add(self, block: IpamBlock) -> None:
        self.blocks[block.cidr] = block
        self.networks.add(block.cidr)
        if block.affine_host is not None:
            self.affine[block.affine_host].append(block.cidr)
        for owner in block.owners.nodes():
            self.owned[owner].append(block.cidr)

    def owned_by(self, node: str) -> dict[str, set[int]]:
        """The ordinals allocated to `node`, by block."""
        return {cidr: self.blocks[cidr].owners.of(node) for cidr in self.owned.get(node, ())}

    def locate(self, ip: str) -> tuple[str, int] | None:
        """The block holding `ip` and its ordinal there, if any block does."""
        return self.networks.locate(ip)

    def in_malformed_block(self, ip: str) -> bool:
        if not self.malformed_networks:
            return False  # nearly always: no address object for each of a host's IPs
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return any(address in network for network in self.malformed_networks)

    def malformed_affinity(self, cidrs: Iterable[str]) -> bool:
        return any(ipaddress.ip_network(cidr) in self.malformed_networks for cidr in cidrs if cidr not in self.blocks)


@dataclass(frozen=True)
class IpamRelease:
    """The steps that free one host's addresses and affinities, or why they cannot be planned;
    `kept`: the host's addresses that stay (a VM's, or a live migration's), with why."""

    steps: tuple[Step, ...] = ()
    problem: str | None = None
    kept: tuple[tuple[str, str], ...] = ()
    cooling: tuple[str, ...] = ()  # the host's blocks that keep its affinity while their addresses cool


def _parsed(block: IpamBlock, parsed: dict[str, JsonObject]) -> JsonObject:
    """A block's JSON, parsed once for one host's plan, which reads it in several places. Never
    changed in place: release and without_affinity change copies."""
    data = parsed.get(block.cidr)
    if data is None:
        data = parsed[block.cidr] = block_data(block)
    return data


def _host_ordinals(
    host: CalicoHost, index: IpamIndex, parsed: dict[str, JsonObject]
) -> tuple[dict[str, set[int]], list[tuple[str, str]]]:
    """Ordinals to free: owned by the host, by its tunnel handles, or at its known IPs; and the
    host's addresses that stay (index.keep), as (ip, why).

    An IP found only through a stale endpoint is freed only when its allocation names no
    other node: it may have been handed to a live pod since. A known IP among the host's own
    allocations is one of them already, and is not looked up again.
    """
    targets = index.owned_by(host.name)
    own: set[str] = set()
    for cidr, ordinals in targets.items():
        at = address_in(cidr)
        own.update(at(ordinal) for ordinal in ordinals)
    for ip in host.known_ips:
        if ip in own:
            continue
        located = index.locate(ip)
        if located is None:
            continue
        cidr, ordinal = located
        owners = index.blocks[cidr].owners
        if ordinal in owners and owners[ordinal] in (None, host.name):
            targets.setdefault(cidr, set()).add(ordinal)
    kept: list[tuple[str, str]] = []
    if index.keep is not None:
        for cidr, ordinals in targets.items():
            data = _parsed(index.blocks[cidr], parsed)
            for ordinal in sorted(ordinals):
                why = index.keep.reason(attribute_at(data, ordinal))
                if why is not None:
                    ordinals.discard(ordinal)
                    kept.append((address_in(cidr)(ordinal), why))
    return targets, kept


def _write(item: StoredItem, value: JsonObject | None) -> Write:
    return Write(item.key, item.revision, None if value is None else dump(value), item.value)


def _delete_emptied(item: StoredItem, emptied: JsonObject) -> Write:
    return Write(item.key, item.revision, None, item.value, final=dump(emptied))


@functools.lru_cache(maxsize=4096)  # a plan asks again for each handle of a block's
def normal_cidr(text: str) -> str | None:
    network = parse_cidr(text, strict=False)
    return None if network is None else network.text


@dataclass
class _BlockEdit:
    """One block's planned writes; `after` is its value once they commit (None: deleted)."""

    purpose: str
    writes: list[Write]
    after: JsonObject | None
    cooling: bool = False  # the host's own block, kept with its affinity while its addresses cool


def _edit_block(
    cidr: str,
    host: CalicoHost,
    index: IpamIndex,
    ordinals: set[int],
    affinity: Write | None,
    parsed: dict[str, JsonObject],
) -> tuple[_BlockEdit, Counter[str]]:
    """Free `ordinals` in the block and drop the host's claim on it (docs/calico-data.md)."""
    block = index.blocks.get(cidr)
    writes: list[Write] = []
    actions: list[str] = []
    freed: Counter[str] = Counter()
    after: JsonObject | None = None
    cooling = False
    if block is not None:
        data = after = _parsed(block, parsed)
        owned = affinity_host(data) == host.name
        holds = index.cooldown is not None and index.cooldown.seconds > 0  # a release puts addresses in cooldown
        if ordinals:
            data, freed = release(data, ordinals)
            goes = is_empty(data) and (owned or data.get("affinity") is None)
            if index.cooldown is not None and (not goes or (owned and holds)):
                # A block that stays, or the host's own under a cooldown: its addresses are released
                # as Calico releases them (cooldown), and what has cooled is freed.
                data, freed = release(_parsed(block, parsed), ordinals, index.cooldown)
            after = data
            actions.append(f"release {sum(freed.values())} IPs")
        elif owned and index.cooldown is not None:
            data = dict(_parsed(block, parsed))  # what has cooled, freed in a copy: written only if the block goes
            collect_cooled(data, index.cooldown)
        if owned:
            if is_empty(data):
                writes.append(_delete_emptied(block.item, data))
                after = None
                actions.append("delete the empty block")
            elif holds and holds_only_cooling(data):
                # The host's addresses cool in it: it keeps the affinity until they have, as
                # kube-controllers holds it, for a new claim of the CIDR would reuse them at once.
                cooling, affinity = True, None
                if ordinals:
                    writes.append(_write(block.item, data))
                actions.append("keep the block and its affinity until its addresses have cooled")
            else:
                after = without_affinity(data)
                writes.append(_write(block.item, after))
                actions.append("keep the block, which still lends IPs, without affinity")
        elif freed:
            delete = is_empty(data) and data.get("affinity") is None
            after = None if delete else data
            writes.append(_delete_emptied(block.item, data) if delete else _write(block.item, data))
            if delete:
                actions.append("delete the now empty unclaimed block")
    if affinity is not None:
        writes.append(affinity)
        actions.append("delete the affinity")
    return _BlockEdit(f"block {cidr}: " + ", ".join(actions), writes, after, cooling), freed


def plan_release(host: CalicoHost, index: IpamIndex) -> IpamRelease:
    """Everything IPAM holds for a gone host, as conditional writes (docs/calico-data.md, order step 1).

    Each handle is written in the step of the first block that frees one of its IPs, before
    that block (one etcd transaction; in order where a datastore writes one key at a time),
    and lowered to what the blocks hold once this plan is done. So no crash or conflict can
    leave a handle counting an IP that its block no longer holds, and a later run plans the
    same end state again. The host's tunnel handles (named after it) are repaired too: a
    crash of an earlier version may have freed their IPs and left the count.
    """
    affinities = {affinity.cidr: affinity for affinity in host.affinities}
    if any(index.in_malformed_block(ip) for ip in host.known_ips) or (index.malformed_affinity(affinities)):
        return IpamRelease(problem="an IPAM block of this host could not be parsed")
    parsed: dict[str, JsonObject] = {}
    targets, kept = _host_ordinals(host, index, parsed)
    edits: dict[str, _BlockEdit] = {}
    cooling: list[str] = []
    first_freed_in: dict[str, str | None] = {}  # handle -> the block step that writes it
    for cidr in sorted(set(targets) | set(index.affine.get(host.name, ())) | set(affinities)):
        affinity = affinities.get(cidr)
        unclaim = None if affinity is None else _write(affinity.item, None)
        edit, freed = _edit_block(cidr, host, index, targets.get(cidr, set()), unclaim, parsed)
        if edit.writes:
            edits[cidr] = edit
        if edit.cooling:
            cooling.append(cidr)
        for handle_id in sorted(freed):
            first_freed_in.setdefault(handle_id, cidr if edit.writes else None)
    for prefix in TUNNEL_HANDLE_PREFIXES:
        first_freed_in.setdefault(prefix + host.name, None)
    handle_writes: dict[str | None, list[Write]] = defaultdict(list)
    counted: dict[str, Counter[object]] = {}  # a block's holdings once the plan is done, for each handle
    read: dict[str, tuple[Any, str | None]] = {}  # a host's pods' handles have the same text, block by block
    for handle_id, step_cidr in first_freed_in.items():
        handle = index.handles.get(handle_id)
        if handle is None:
            continue  # a missing handle is what `calicoctl ipam check` reports; nothing to lower
        text = handle.item.value or ""
        if text not in read:
            data = parse_handle(text)
            read[text] = data, "not valid JSON" if data is None else handle_problem(data)
        data, problem = read[text]
        if problem is not None:
            return IpamRelease(problem=f"IPAM handle {handle.item.key}: {problem}")
        held = {key: _held_after(key, handle_id, edits, index, counted, parsed) for key in data.get("block") or {}}
        lowered = lowered_handle(data, held)
        if lowered != data:
            handle_writes[step_cidr].append(_write(handle.item, lowered))
    steps: list[Step] = []
    if handle_writes.get(None):
        steps += _steps("repair IPAM handles", handle_writes[None], [])
    for cidr, edit in edits.items():
        steps += _steps(edit.purpose, handle_writes.get(cidr, []), edit.writes)
    return IpamRelease(tuple(steps), kept=tuple(kept), cooling=tuple(cooling))


def _held_after(
    key: str,
    handle_id: str,
    edits: Mapping[str, _BlockEdit],
    index: IpamIndex,
    counted: dict[str, Counter[object]],
    parsed: dict[str, JsonObject],
) -> int | None:
    """What block `key` (a handle's cidr key) holds for the handle once the plan is done; each
    block is counted once into `counted`, for the host's other handles."""
    cidr = normal_cidr(key)
    if cidr is None:
        return None
    if cidr not in counted:
        if cidr in edits:
            counted[cidr] = holdings(edits[cidr].after)
        elif cidr in index.blocks:
            counted[cidr] = holdings(_parsed(index.blocks[cidr], parsed))
        else:
            return None if ipaddress.ip_network(cidr) in index.malformed_networks else 0
    return counted[cidr][handle_id]


def _steps(purpose: str, first: list[Write], then: list[Write]) -> list[Step]:
    """One transaction where it fits; else the `first` writes go in earlier ones, never later."""
    steps = []
    while len(first) + len(then) > MAX_TXN_WRITES:
        steps.append(Step(f"{purpose} (handles first)", tuple(first[:MAX_TXN_WRITES])))
        first = first[MAX_TXN_WRITES:]
    return [*steps, Step(purpose, tuple(first + then))]


@dataclass(frozen=True)
class StaleHandle:
    """A handle that counts more IPs in some block than that block holds for it. `repaired` is
    its value lowered to what the blocks hold (None: nothing left, delete it)."""

    handle: IpamHandle
    over: Mapping[str, tuple[int, int]]  # the handle's own cidr key -> (counts, held)
    repaired: JsonObject | None


def _network(cidr: str) -> Cidr:
    """A block's CIDR, which its reader has checked."""
    network = parse_cidr(cidr)
    if network is None:
        raise ValueError(f"{cidr!r} is not a network")
    return network


def address_in(cidr: str) -> Callable[[int], str]:
    """The address at an ordinal of a block, as text; IPv4 without building an ipaddress object
    per address (the IPAM check asks for hundreds of thousands)."""
    network = _network(cidr)
    base = network.base
    if network.version == 4:
        return lambda ordinal: _ipv4_text(base + ordinal)
    return lambda ordinal: str(ipaddress.IPv6Address(base + ordinal))


class Held:
    """What the blocks hold for each handle: {cidr: allocations}, for the stale-handle check.

    There is one entry per pod, so it is kept small: keyed by the hash of the handle id, not the
    id, and a handle's lone allocation is kept as its block's cidr (one string per block); one
    allocation in each of several blocks (a dual-stack pod's two) as a tuple of their cidrs (56
    bytes, where a dict of two is 184: 13 MB at 5,000 dual-stack hosts). Two ids with one hash (a
    64-bit hash; about 1e-9 at 300,000 handles) would share their counts. That only ever raises
    what a handle is found to hold, so it can hide a stale handle or a missing one, never make one
    up: nothing is written because of it.
    """

    __slots__ = ("_by_hash",)

    def __init__(self) -> None:
        self._by_hash: dict[int, str | tuple[str, ...] | dict[str, int]] = {}

    def add(self, handle_id: str, cidr: str) -> None:
        key = hash(handle_id)
        counts = self._by_hash.get(key)
        if counts is None:
            self._by_hash[key] = cidr
        elif isinstance(counts, dict):
            counts[cidr] = counts.get(cidr, 0) + 1
        else:
            ones = (counts,) if isinstance(counts, str) else counts
            self._by_hash[key] = (*ones, cidr) if cidr not in ones else {**dict.fromkeys(ones, 1), cidr: 2}

    def counts(self, handle_id: str) -> Mapping[str, int]:
        return _counts(self._by_hash.get(hash(handle_id)))

    def __contains__(self, handle_id: object) -> bool:
        return hash(handle_id) in self._by_hash

    def hashes(self) -> set[int]:
        return set(self._by_hash)

    def __len__(self) -> int:
        return len(self._by_hash)

    def in_blocks(self, hashes: Iterable[int]) -> Counter[str]:
        """How many allocations the handles with these hashes have, block by block."""
        found: Counter[str] = Counter()
        for key in hashes:
            found.update(_counts(self._by_hash.get(key)))
        return found

    def holds_exactly(self, handle_id: str, counts: Mapping[str, int]) -> bool:
        """Whether the blocks hold exactly what a handle counts, block by block (and something)."""
        found = self._by_hash.get(hash(handle_id))
        if isinstance(found, str):  # one allocation, as nearly every pod's
            return len(counts) == 1 and counts.get(found) == 1
        return found is not None and _counts(found) == counts

    def exact(self, handle_id: str, value: str | None) -> bool:
        """Whether a handle's text is exactly what Calico writes for what the blocks hold for it
        (nearly every handle), or what Python's json.dumps writes for the same (scripts and tools
        that rewrote the keys: `{"block": {...}, "deleted": false}`). Compared as text, only the
        handles that differ are parsed: at 5,000 hosts rewritten by json.dumps, parsing all
        105,000 took 0.05 s (docs/development.md). The expected text is built, not matched with
        parse_handle's pattern, which reads the same two forms: 0.05 s against 0.07 s for 105,000,
        and built by f-strings: 0.04 us a text, where str.format took 0.3 us. A handle with one
        allocation in each of several blocks (a dual-stack pod's) is written with its blocks in
        the order Go's encoder writes a map's keys, sorted: 0.2 us, where parsing it took 2 us."""
        if value is None:
            return False
        found = self._by_hash.get(hash(handle_id))
        if isinstance(found, str):
            cidr, count = found, 1
        elif isinstance(found, tuple):
            if value.startswith('{"block":{"'):
                return value == '{"block":{"' + '":1,"'.join(sorted(found)) + '":1},"deleted":false}'
            return value == '{"block": {"' + '": 1, "'.join(sorted(found)) + '": 1}, "deleted": false}'
        elif isinstance(found, dict) and len(found) == 1:
            ((cidr, count),) = found.items()
        else:
            return False
        if value.startswith('{"block":{"'):
            return value == f'{{"block":{{"{cidr}":{count}}},"deleted":false}}'
        # another writer's text (other spacing, field order) is neither form: no text to build for it
        return value == f'{{"block": {{"{cidr}": {count}}}, "deleted": false}}'


def _counts(held: str | tuple[str, ...] | dict[str, int] | None) -> Mapping[str, int]:
    """What Held keeps for one handle, as {cidr: allocations}."""
    if isinstance(held, dict):
        return held
    return dict.fromkeys((held,) if isinstance(held, str) else held or (), 1)


def stale_handles(
    handles: Mapping[str, IpamHandle], held: Held, malformed_blocks: Collection[str] = ()
) -> list[StaleHandle]:
    """Every handle counting more in a block than the block holds for it. A block that could not
    be parsed holds an unknown number: its counts are left alone. A handle counting fewer is not
    stale: Calico raises the handle before it writes the block, so that is an allocation in flight."""
    found = []
    normal: dict[str, str | None] = {}  # handles name the same few thousand blocks: parse each once
    for handle_id, handle in handles.items():
        if held.exact(handle_id, handle.item.value):
            continue  # as Calico writes a handle counting exactly what its one block holds
        counts = held.counts(handle_id)
        data = parse_handle(handle.item.value or "")
        if data is None or handle_problem(data) is not None:
            continue
        actual: dict[str, int | None] = {}
        for key in data.get("block") or {}:
            if key not in normal:
                normal[key] = normal_cidr(key)
            cidr = normal[key]
            actual[key] = None if cidr is None or cidr in malformed_blocks else counts.get(cidr, 0)
        over = {
            key: (count, actual[key] or 0)
            for key, count in (data.get("block") or {}).items()
            if actual[key] is not None and count > (actual[key] or 0)
        }
        if over:
            found.append(StaleHandle(handle, over, lowered_handle(data, actual)))
    return sorted(found, key=lambda stale: stale.handle.handle_id)


# A handle for a single block as Calico writes one, or as json.dumps does (Held.exact): read without
# the JSON decoder, which a plan of 500 gone hosts called on 10,000 handles, each more than once.
_ONE_BLOCK_HANDLE = re.compile(r'\{"block": ?\{"([^"\\\x00-\x1f]*)": ?(0|[1-9][0-9]{0,17})\}, ?"deleted": ?false\}')


def parse_handle(text: str) -> Any:
    """A handle's JSON, or None when it is not JSON at all (handle_problem checks its shape)."""
    one = _ONE_BLOCK_HANDLE.fullmatch(text)
    if one is not None:
        return {"block": {one[1]: int(one[2])}, "deleted": False}
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
        return None

"""IPAM block and handle editing on Calico-shaped values (no datastore involved)."""

from __future__ import annotations

import ipaddress
import json
import random
from typing import Any

import pytest
from etcd3.etcdrpc.kv_pb2 import KeyValue
from hypothesis import given
from hypothesis import strategies as st

from job.adapters.datastores.base import ip_number
from job.adapters.datastores.etcdv3 import (
    BLOCKS,
    HANDLES,
    WORKLOAD_ENDPOINTS,
    Collected,
    assemble,
    bare_ip,
    build_inventory,
    collect_page,
    endpoint_spec,
    scanning,
)
from job.core.ipam import (
    Held,
    Networks,
    address_in,
    address_number,
    block_shape_problem,
    handle_problem,
    held_by,
    holdings,
    is_empty,
    lowered_handle,
    parse_cidr,
    parse_handle,
    release,
    summarize_block,
    without_affinity,
)
from job.core.model import Owners, StoredItem
from job.core.plan import build_index, host_steps
from job.core.scan import BlockScan
from tests.support.calico import CalicoSeed


def block_with(owners: dict[int, tuple[str, str]], size: int = 8, **extra: Any) -> dict[str, Any]:
    """A /29 block: ordinal -> (handle, node). Attributes are shared per handle, as Calico does."""
    attributes: list[dict[str, Any]] = []
    allocations: list[int | None] = [None] * size
    for ordinal, (handle, node) in sorted(owners.items()):
        attribute = {"handle_id": handle, "secondary": {"node": node}}
        if attribute not in attributes:
            attributes.append(attribute)
        allocations[ordinal] = attributes.index(attribute)
    return {
        "cidr": "10.1.0.0/29",
        "affinity": "host:a",
        "allocations": allocations,
        "unallocated": [o for o in range(size) if o not in owners],
        "attributes": attributes,
        "sequenceNumber": 50,
        "sequenceNumberForAllocation": {str(o): 40 + o for o in owners},
        "deleted": False,
        **extra,
    }


def test_release_frees_ordinals_and_appends_them_to_unallocated() -> None:
    block = block_with({1: ("h1", "a"), 2: ("h2", "b")})
    new, handles = release(block, {1})
    assert new["allocations"][1] is None
    assert new["unallocated"] == [0, 3, 4, 5, 6, 7, 1]
    assert "1" not in new["sequenceNumberForAllocation"] and "2" in new["sequenceNumberForAllocation"]
    assert new["sequenceNumber"] == 51
    assert handles == {"h1": 1}
    assert block["allocations"][1] == 0, "the input is never modified"
    assert "1" in block["sequenceNumberForAllocation"] and 1 not in block["unallocated"]


def test_release_compacts_attributes_and_renumbers_every_allocation() -> None:
    block = block_with({0: ("h0", "gone"), 1: ("h1", "live"), 2: ("h2", "gone"), 3: ("h3", "live")})
    new, _ = release(block, {0, 2})
    assert [a["handle_id"] for a in new["attributes"]] == ["h1", "h3"]
    assert new["allocations"][:4] == [None, 0, None, 1]
    for ordinal, index in enumerate(new["allocations"]):
        if index is not None:
            assert (
                new["attributes"][index]["handle_id"] == block["attributes"][block["allocations"][ordinal]]["handle_id"]
            )


def test_an_attribute_shared_by_ips_stays_until_all_of_them_are_released() -> None:
    block = block_with({0: ("h", "a"), 1: ("h", "a"), 2: ("x", "b")})
    new, handles = release(block, {0})
    assert len(new["attributes"]) == 2 and new["allocations"][1] == 0
    assert handles == {"h": 1}


def test_release_never_writes_a_block_worse_than_it_read() -> None:
    """Ordinal 1 is both allocated and listed in `unallocated` (damaged data): after its release
    it is listed once, not twice."""
    block = block_with({1: ("h1", "a"), 2: ("h2", "b")})
    block["unallocated"].append(1)
    new, _ = release(block, {1})
    assert new["unallocated"].count(1) == 1
    assert sorted(new["unallocated"]) == [o for o, index in enumerate(new["allocations"]) if index is None]


def test_release_keeps_fields_it_does_not_know() -> None:
    block = block_with({1: ("h1", "a")}, futureField={"x": [1, 2]}, affinity_claim_time="2026-01-01T00:00:00Z")
    new, _ = release(block, {1})
    assert new["futureField"] == {"x": [1, 2]}
    assert new["affinity_claim_time"] == "2026-01-01T00:00:00Z"
    assert list(new) == list(block), "field order is kept too"


def test_calico_2_blocks_get_no_sequence_fields_added() -> None:
    block = block_with({1: ("h1", "a")})
    del block["sequenceNumber"], block["sequenceNumberForAllocation"], block["deleted"]
    new, _ = release(block, {1})
    assert set(new) == set(block)


def test_windows_reserved_allocations_are_never_released_and_do_not_count() -> None:
    block = block_with({0: ("windows-reserved-ipam-handle", "a"), 1: ("h1", "a")})
    new, _ = release(block, {0, 1})
    assert new["allocations"][0] is not None
    assert is_empty(new)


def test_releasing_a_free_ordinal_changes_nothing() -> None:
    block = block_with({1: ("h1", "a")})
    new, handles = release(block, {5})
    assert new == block and not handles


def test_without_affinity_clears_the_claim_and_bumps_the_sequence() -> None:
    new = without_affinity(block_with({1: ("h1", "b")}, affinity_claim_time="t"))
    assert new["affinity"] is None and "affinity_claim_time" not in new and new["sequenceNumber"] == 51


def test_handles_are_lowered_to_what_blocks_hold_and_deleted_when_empty() -> None:
    handle = {"block": {"10.1.0.0/29": 2, "10.2.0.0/29": 1}, "deleted": False}
    assert lowered_handle(handle, {"10.1.0.0/29": 1, "10.2.0.0/29": None}) == {
        "block": {"10.1.0.0/29": 1, "10.2.0.0/29": 1},
        "deleted": False,
    }
    assert lowered_handle(handle, {"10.1.0.0/29": 0, "10.2.0.0/29": 0}) is None
    # Absolute targets: lowering twice changes nothing more, and counts are never raised.
    once = lowered_handle(handle, {"10.1.0.0/29": 1})
    assert once is not None and lowered_handle(once, {"10.1.0.0/29": 1}) == once
    assert lowered_handle({"block": {"10.1.0.0/29": 1}}, {"10.1.0.0/29": 3}) == {"block": {"10.1.0.0/29": 1}}


def test_handle_counts_that_are_not_whole_numbers_are_named() -> None:
    assert handle_problem({"block": {"10.1.0.0/29": 1}}) is None
    assert (
        handle_problem({"block": {"10.1.0.0/29": "one"}}) == "handle count for 10.1.0.0/29 is 'one', not a whole number"
    )
    assert handle_problem({"block": {"10.1.0.0/29": None}}) is not None
    assert handle_problem({"block": []}) is not None
    assert handle_problem("text") is not None


def test_block_shape_problems_are_named() -> None:
    assert block_shape_problem(block_with({})) is None
    assert block_shape_problem([]) == "block value is not a JSON object"
    assert "cidr" in (block_shape_problem({**block_with({}), "cidr": "nope"}) or "")
    assert "size" in (block_shape_problem({**block_with({}), "allocations": [None]}) or "")
    assert "missing attribute" in (block_shape_problem({**block_with({}), "allocations": [9] + [None] * 7}) or "")
    flagged = {**block_with({}), "allocations": [True] + [None] * 7}
    assert "missing attribute True" in (block_shape_problem(flagged) or "")
    assert "ordinals" in (block_shape_problem({**block_with({}), "unallocated": [1, False]}) or "")
    # What Calico's Go types cannot read either: a handle_id that is not a string, a secondary not an object.
    odd = block_with({1: ("h1", "a")})
    odd["attributes"][0]["handle_id"] = 5
    assert block_shape_problem(odd) == "block attribute handle_id is 5, not a string"
    odd["attributes"][0].update(handle_id=None, secondary="node=a")
    assert block_shape_problem(odd) == "block attribute secondary is not an object"
    odd["attributes"][0].update(secondary=None)
    assert block_shape_problem(odd) is None


def test_scanning_a_block_gives_the_summary_summarize_block_gives() -> None:
    """BlockScan.add summarises a block in the pass it scans it in: the same summary as
    summarize_block, and `touched` (with the handles to keep) for allocations of hosts not live."""
    data = block_with({1: ("h1", "a"), 2: ("h2", "b"), 3: ("ipip-tunnel-addr-c", ""), 4: ("h4", ""), 5: ("h1", "a")})
    data["attributes"].append({"handle_id": None, "secondary": None})
    data["allocations"][6] = len(data["attributes"]) - 1
    for live, touched, wanted in (({"a", "b", "c"}, True, {"h4"}), ({"a"}, True, {"h4", "h2", "ipip-tunnel-addr-c"})):
        scan = BlockScan(frozenset(live), owner_live=live.__contains__)
        assert scan.add(data["cidr"], data) == (*summarize_block(data), touched)
        assert scan.wanted == wanted
    scan = BlockScan(frozenset({"a"}), owner_live={"a", "b", "c"}.__contains__)
    del data["allocations"][4:7]
    data["allocations"] += [None] * 3
    assert scan.add(data["cidr"], data) == (*summarize_block(data), False) and not scan.wanted
    assert scan.node_allocated == {"a": 2, "b": 1} and scan.allocated == {data["cidr"]: 3}


@pytest.mark.parametrize(
    "text",
    ["10.0.0.0/26", "10.0.0.1/26", "10.0.0.0/026", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0", "010.0.0.0/8", "0.0.0.0/0",
     "255.255.255.255/32", "10.0.0.0/2\u00b2", "10.0.0.0/-1", " 10.0.0.0/8", "fd00::/122", "fd00::1/122", "", "x/8",
     "FD00:0096:0000::0040/122", "fd00:96::40/0122", "fd00::/129", "::/0", "1:0:0:2::/64", "1:2:3:4:5:6:7::/128",
     "::ffff:10.0.0.0/120", "::ffff:a00:0/120", "fe80::%eth0/64", "fd00:::/64", "1::2::/64", "12345::/16",
     "10::1.2.3.4/128", "1.2.3.4/8:",
     # More digits than int() converts (4,300), which ended the read in a ValueError:
     "10.0.0.0/" + "2" * 5000, "10.0.0.0/" + "0" * 4999 + "26", "fd00::/" + "0" * 4999 + "122"],
)  # fmt: skip
@pytest.mark.parametrize("strict", [True, False])
def test_a_cidr_is_read_as_ipaddress_reads_it(text: str, strict: bool) -> None:
    try:
        network = ipaddress.ip_network(text, strict=strict)
        expected = (str(network), network.version, int(network.network_address), network.prefixlen)
    except ValueError:
        expected = None
    parsed = parse_cidr(text, strict)
    assert (None if parsed is None else (parsed.text, parsed.version, parsed.base, parsed.length)) == expected


@pytest.mark.parametrize(
    "text",
    ["10.0.1.23", "0.0.0.0", "255.255.255.255", "256.0.0.1", "010.0.0.1", "1.2.3", "1.2.3.4.5", "1.2.3.4/32",
     " 1.2.3.4", "1.2.3.4\x00", "1.2.3.\u0664", "fd00::1", "::ffff:1.2.3.4", "", "x", "FD00:96::40", "1:2:3:4:5:6:7::",
     "::", "fe80::1%eth0", "fd00::1/128", "fd00::\u0664", ":fd00::1", "fd00::1:", "1:2:3:4:5:6:7:8:9", "0001:2::"],
)  # fmt: skip
def test_an_endpoint_ip_is_numbered_as_the_pure_core_numbers_it(text: str) -> None:
    """The adapters' ip_number (inet_pton) and the core's address_number agree, odd text included."""
    assert ip_number(text) == address_number(text)


def test_ipv6_is_read_as_ipaddress_reads_it_by_every_path() -> None:
    """A dual-stack read numbers 100,000 endpoint IPv6 addresses by the C library (ip_number) and
    parses each block's CIDR once (parse_cidr's cache): over seeded random addresses in every form
    ipaddress writes, and the same with a character added, each path reads an address or a CIDR
    as ipaddress reads it (or refuses it as it does), and a block's address and a Calico Node's
    (bare_ip) are written as it writes them."""
    rng = random.Random(6)
    for _ in range(20_000):
        number = rng.getrandbits(128) >> rng.choice((0, 16, 64, 96, 112)) << rng.choice((0, 16, 48))
        number &= (1 << 128) - 1
        address = ipaddress.IPv6Address(number)
        assert address_in(f"{ipaddress.IPv6Network((number, 128))}")(0) == str(address)
        text = rng.choice((str(address), address.exploded, str(address).upper()))
        if rng.random() < 0.5:
            at = rng.randrange(len(text) + 1)
            text = text[:at] + rng.choice("0fF:.%/g ") + text[at:]
        try:
            expected: tuple[int, int] | None = (6, int(ipaddress.IPv6Address(text)))
        except ValueError:
            expected = None
        assert address_number(text) == expected == ip_number(text), text
        length = rng.choice(("", "/64", "/128", "/129"))
        try:
            interface: str | None = str(ipaddress.ip_interface(text + length).ip)
        except ValueError:
            interface = None
        assert bare_ip(text + length) == interface, text + length
        cidr = f"{text}/{rng.choice((0, 64, 122, 128))}"
        try:
            network = ipaddress.ip_network(cidr, strict=False)
            read = (str(network), network.version, int(network.network_address), network.prefixlen)
        except ValueError:
            read = None
        parsed = parse_cidr(cidr, strict=False)
        assert (None if parsed is None else (parsed.text, parsed.version, parsed.base, parsed.length)) == read, cidr


def test_values_that_are_not_utf8_are_malformed_not_a_crash() -> None:
    """Read as text (build_inventory, etcd v2), bytes that are not UTF-8 become surrogates, which
    no msgspec decoder takes: an endpoint, a handle and a Node so read are problems or kept, as
    any value of another shape."""
    bad = "\udcff"
    items = [
        StoredItem(f"{WORKLOAD_ENDPOINTS}ns/pod-eth0", 1, '{"spec":{"node":"n' + bad + '"}}'),
        StoredItem("/calico/ipam/v2/handle/h1", 1, '{"block":{"10.0.0.0/26":1},"x":"' + bad + '"}'),
        StoredItem("/calico/resources/v3/projectcalico.org/nodes/n1", 1, '{"spec":"' + bad + '"}'),
    ]
    inventory = build_inventory(iter(items), lambda: 1)
    kinds = {(p.key.rsplit("/", 1)[1], p.kind) for p in inventory.problems}
    assert {("pod-eth0", "malformed_value"), ("n1", "malformed_value")} <= kinds
    assert "h1" in inventory.handles


def test_a_handle_that_is_not_utf8_is_kept_for_the_planner_not_a_crash() -> None:
    """In a lean read a handle whose text is not Calico's is decoded to judge what it counts; one
    with bytes that are not UTF-8 is kept (the planner says what is wrong with it)."""
    collected = Collected(live=lambda _: True)
    scanning(collected).held.add("h1", "10.0.0.0/26")
    raw = b'{"block": {"10.0.0.0/26": 1}, "note": "\xff"}'
    collect_page(collected, HANDLES, [KeyValue(key=(HANDLES + "h1").encode(), mod_revision=1, value=raw)])
    assert "h1" in collected.handles and collected.named_read == 1


def test_a_block_value_that_is_not_utf8_is_malformed_not_a_crash() -> None:
    seed = CalicoSeed()
    seed.block("100.96.9.0/26", "gone")
    key = next(k for k in seed.keys if k.startswith(BLOCKS))
    raw = seed.keys[key].replace('"host:gone"', '"host:gone\\u00ff"').encode().replace(b"\\u00ff", b"\xff")
    collected = Collected()
    collect_page(collected, BLOCKS, [KeyValue(key=key.encode(), mod_revision=1, value=raw)])
    assert collected.malformed_blocks == ["100.96.9.0/26"] and not collected.blocks
    assert [(p.kind, p.message) for p in collected.problems] == [
        ("malformed_value", "not valid JSON: bytes that are not UTF-8")
    ]


def _plan(seed: CalicoSeed, name: str) -> list[tuple[str, str | None]]:
    inventory = build_inventory(iter(StoredItem(k, 1, v) for k, v in seed.keys.items()), lambda: 1)
    host = next(h for h in inventory.hosts if h.name == name)
    steps, problem = host_steps(host, build_index(inventory))
    assert problem is None
    return [(w.key, w.value) for step in steps for w in step.writes]


def test_gone_hosts_own_empty_block_is_deleted_with_its_affinity_and_handle_in_one_step() -> None:
    seed = CalicoSeed()
    seed.block("10.9.0.0/26", "gone")
    seed.node("gone", tunnel_ip="10.9.0.1")
    inventory = build_inventory(iter(StoredItem(k, 1, v) for k, v in seed.keys.items()), lambda: 1)
    steps, _ = host_steps(inventory.hosts[0], build_index(inventory))
    first = steps[0]
    assert [(w.key, w.value) for w in first.writes] == [
        ("/calico/ipam/v2/handle/ipip-tunnel-addr-gone", None),  # the handle it frees, first
        ("/calico/ipam/v2/assignment/ipv4/block/10.9.0.0-26", None),
        ("/calico/ipam/v2/host/gone/ipv4/block/10.9.0.0-26", None),
    ]


def test_block_lending_ips_to_live_nodes_is_kept_without_affinity() -> None:
    seed = CalicoSeed()
    seed.block("10.9.0.0/26", "gone")
    seed.node("gone")
    seed.node("live")
    seed.pod("live", "ns", "p", "10.9.0.7")
    seed.pod("gone", "ns", "q", "10.9.0.8")
    writes = dict(_plan(seed, "gone"))
    block = json.loads(writes["/calico/ipam/v2/assignment/ipv4/block/10.9.0.0-26"] or "null")
    assert block["affinity"] is None
    assert block["allocations"][7] == 0 and block["allocations"][8] is None
    assert [a["secondary"]["pod"] for a in block["attributes"]] == ["p"]


def test_borrowed_ip_in_a_live_nodes_block_is_released_and_the_block_kept() -> None:
    seed = CalicoSeed()
    seed.block("10.9.0.0/26", "live")
    seed.node("gone")
    seed.node("live")
    seed.pod("gone", "ns", "q", "10.9.0.8")
    writes = dict(_plan(seed, "gone"))
    block = json.loads(writes["/calico/ipam/v2/assignment/ipv4/block/10.9.0.0-26"] or "null")
    assert block["affinity"] == "host:live" and block["allocations"][8] is None


def test_unclaimed_block_emptied_by_the_release_is_deleted() -> None:
    seed = CalicoSeed()
    seed.block("10.9.0.0/26", None)
    seed.node("gone")
    seed.pod("gone", "ns", "q", "10.9.0.8")
    assert ("/calico/ipam/v2/assignment/ipv4/block/10.9.0.0-26", None) in _plan(seed, "gone")


def test_stale_endpoint_ip_now_owned_by_a_live_pod_is_not_released() -> None:
    seed = CalicoSeed()
    seed.block("10.9.0.0/26", "live")
    seed.node("gone")
    seed.node("live")
    seed.pod("live", "ns", "new-owner", "10.9.0.8")
    seed.resource(
        "workloadendpoints",
        "gone-k8s-old-eth0",
        "WorkloadEndpoint",
        {"node": "gone", "ipNetworks": ["10.9.0.8/32"]},
        namespace="ns",
    )
    keys = [key for key, _ in _plan(seed, "gone")]
    assert "/calico/ipam/v2/assignment/ipv4/block/10.9.0.0-26" not in keys
    assert "/calico/resources/v3/projectcalico.org/workloadendpoints/ns/gone-k8s-old-eth0" in keys


def test_handles_of_released_ips_are_deleted_or_decremented() -> None:
    seed = CalicoSeed()
    seed.block("10.9.0.0/26", "live")
    seed.node("gone")
    seed.node("live")
    seed.allocate("10.9.0.2", "shared-handle", "gone")
    seed.allocate("10.9.0.3", "shared-handle", "live")
    writes = dict(_plan(seed, "gone"))
    assert json.loads(writes["/calico/ipam/v2/handle/shared-handle"] or "null") == {
        "block": {"10.9.0.0/26": 1},
        "deleted": False,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"kind":"WorkloadEndpoint","metadata":{"name":"w"},"spec":{"node":"n1"}}', ("n1", [])),
        (
            '{"metadata":{"labels":{"spec":"x"}},"spec":{"node":"n1","ipNetworks":["10.0.0.1/32"]}}',
            ("n1", ["10.0.0.1/32"]),
        ),
        ('{"spec":{"node":"n1"},"metadata":{"annotations":{"spec":{"node":"n2"}}}}', ("n1", [])),
        (
            '{"spec": {"ipNetworks": ["fd00::1/128", "10.0.0.1/32"], "node": "n1"} }',
            ("n1", ["fd00::1/128", "10.0.0.1/32"]),
        ),
        ('{"spec":{"node":""}}', None),
        ('{"spec":{"node":5}}', None),
        ('{"spec":{"node":"n1","ipNetworks":null}}', None),
        ('{"spec":{"node":"n1","ipNetworks":["10.0.0.1/32",7]}}', None),
        ('{"spec":null}', None),
        ('{"metadata":{}}', None),
        ("[]", None),
        ("not json", None),
        ("", None),
    ],
)
def test_endpoint_spec_takes_only_the_usual_shape(text: str, expected: object) -> None:
    assert endpoint_spec(text) == expected


def test_an_endpoint_of_another_shape_is_read_whole_and_what_is_wrong_is_said() -> None:
    """The typed fast path (endpoint_spec) and the whole parse it falls back to agree: an odd
    value is filed by its node with the IPs that are text, or named as a problem."""
    values = {
        "a": '{"spec":{"node":"n1","ipNetworks":["10.0.0.1/32",7,null]}}',
        "b": '{"spec":{"node":"n1","ipNetworks":null}}',
        "c": '{"spec":{"node":""}}',
        "d": '{"spec":{"node":["n1"]}}',
        "e": '{"spec":null}',
        "f": "not json",
        "g": '{"spec":{"node":"n1","ipNetworks":["10.0.0.2/32"]}}',
    }
    items = [StoredItem(f"{WORKLOAD_ENDPOINTS}ns/{name}", 1, value) for name, value in values.items()]
    inventory = build_inventory(iter(items), lambda: 1)
    # etcd v3 answers bytes, which the read never makes text (collect_page): the same result.
    collected = Collected()
    page = [KeyValue(key=i.key.encode(), mod_revision=1, value=(i.value or "").encode()) for i in items]
    collect_page(collected, WORKLOAD_ENDPOINTS, page)
    assert assemble(collected, 1) == inventory
    (host,) = inventory.hosts
    assert host.name == "n1"
    assert {e.item.key.rsplit("/", 1)[1]: e.ips for e in host.workload_endpoints} == {
        "a": ("10.0.0.1",),
        "b": (),
        "g": ("10.0.0.2",),
    }
    problems = {p.key.rsplit("/", 1)[1]: (p.kind, p.message) for p in inventory.problems}
    assert problems["c"] == problems["d"] == ("malformed_value", "workload endpoint without spec.node")
    assert problems["f"][0] == "malformed_value" and "not valid JSON" in problems["f"][1]
    assert "e" not in problems  # a null spec says nothing to act on, as before


def test_allocate_is_the_inverse_of_release_and_adds_no_field_calico_2_lacks() -> None:
    from job.core.ipam import allocate, release

    block = {
        "cidr": "10.0.0.0/30",
        "affinity": "host:a",
        "allocations": [0, 1, None, 0],
        "unallocated": [2],
        "attributes": [{"handle_id": "h1"}, {"handle_id": "h2"}],
        "sequenceNumber": 7,
        "sequenceNumberForAllocation": {"0": 1, "1": 2, "3": 3},
    }
    freed, _ = release(block, {1, 3})
    back = allocate(freed, {1: {"handle_id": "h2"}, 3: {"handle_id": "h1"}})
    owners = {o: back["attributes"][i] for o, i in enumerate(back["allocations"]) if i is not None}
    assert owners == {0: {"handle_id": "h1"}, 1: {"handle_id": "h2"}, 3: {"handle_id": "h1"}}
    assert sorted(back["unallocated"]) == [2] and len(back["attributes"]) == 2  # h1 shared again
    assert back["sequenceNumber"] == 9 and back["sequenceNumberForAllocation"] == {"0": 1, "1": 8, "3": 8}
    taken = allocate(freed, {0: {"handle_id": "other"}})  # ordinal 0 is allocated: left as it is
    assert taken == freed
    calico2 = {k: v for k, v in block.items() if not k.startswith("sequence")}
    back2 = allocate(release(calico2, {1})[0], {1: {"handle_id": "h2"}})
    assert set(back2) == set(calico2)


def test_block_owners_read_as_the_plain_mapping_they_replace() -> None:
    """model.Owners keeps the affine host's ordinals as bits: it must read as {ordinal: node}, in
    ordinal order, with the others (another node, or none) where they are."""
    seed = CalicoSeed()
    seed.block("100.96.9.0/26", "mine")
    seed.allocate("100.96.9.9", "h9", "mine")
    seed.allocate("100.96.9.2", "h2", "other")
    seed.allocate("100.96.9.1", "ipip-tunnel-addr-mine", "")
    seed.allocate("100.96.9.40", "h40", "mine")
    block = json.loads(next(v for k, v in seed.keys.items() if "/assignment/" in k))
    block["attributes"][block["allocations"][2]]["secondary"] = {}  # names no node
    host, owners = summarize_block(block)
    assert host == "mine" and dict(owners) == {1: "mine", 2: None, 9: "mine", 40: "mine"}
    assert list(owners) == [1, 2, 9, 40] and len(owners) == 4 and owners == {1: "mine", 2: None, 9: "mine", 40: "mine"}
    assert 3 not in owners and owners.get(2, "x") is None
    assert owners.nodes() == {"mine"} and summarize_block({**block, "affinity": None})[1].nodes() == {"mine"}
    with pytest.raises(KeyError):
        owners[-1]
    assert owners.of("mine") == {1, 9, 40} and owners.of("other") == set()


@given(st.lists(st.none() | st.integers(0, 4), max_size=64), st.lists(st.sampled_from(["h0", "h1", None]), min_size=5))
def test_a_blocks_holdings_are_what_it_holds_for_each_handle(allocations: list[int | None], ids: list[Any]) -> None:
    """ipam.holdings counts a block once for all its handles: the same as held_by for each."""
    block = {"allocations": allocations, "attributes": [{"handle_id": h} if h else {} for h in ids]}
    counts = holdings(block)
    for handle in ("h0", "h1", "h2"):
        assert counts[handle] == held_by(block, handle)
    assert not holdings(None) and held_by(None, "h0") == 0


@given(
    st.sampled_from(["a", "b", None]),
    st.integers(0, 2**64 - 1),
    st.none() | st.dictionaries(st.integers(0, 70), st.sampled_from(["a", "b", "c", None]), max_size=8),
)
def test_owners_of_a_node_are_the_ordinals_the_mapping_gives_it(host: str | None, bits: int, others: Any) -> None:
    """Owners.of reads the bits and the exceptions directly: the same as asking each ordinal."""
    owners = Owners(host, bits, others)
    for node in ("a", "b", "c"):
        assert owners.of(node) == {o for o, n in owners.items() if n == node}


def test_a_blocks_editors_leave_the_parsed_block_they_are_given_as_it_was() -> None:
    """A host's plan parses each block once (ipam._parsed) and hands that one dict to the keep rule,
    to release (with and without a cooldown), to without_affinity and to the handles' counts: each
    must edit a copy, or a second edit of the block would start from the first one's result."""
    import copy
    from datetime import UTC, datetime

    from job.core.ipam import collect_cooled, release
    from job.core.model import Cooldown

    block = block_with({1: ("h1", "a"), 2: ("h1", "a"), 3: ("h2", "b"), 5: ("h3", "a")})
    block["attributes"].append({"releasedAt": "2026-11-30T11:00:00Z"})
    block["allocations"][6] = len(block["attributes"]) - 1
    block["unallocated"].remove(6)
    block["sequenceNumberForAllocation"] = {str(o): 40 + o for o in (1, 2, 3, 5, 6)}
    before = copy.deepcopy(block)
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    for cooldown in (None, Cooldown(0, now), Cooldown(600, now), Cooldown(7200, now)):
        edited, lost = release(block, {1, 2, 5}, cooldown)
        assert lost == {"h1": 2, "h3": 1} and edited != before
        collect_cooled(dict(block), Cooldown(600, now))  # on a shallow copy, as _edit_block does
    assert without_affinity(block)["affinity"] is None
    assert holdings(block) == {"h1": 2, "h2": 1, "h3": 1, None: 1}
    assert block == before


def test_held_counts_by_hash_and_compares_handles_as_calico_writes_them() -> None:
    held = Held()
    for handle, cidr in (("a", "10.0.0.0/26"), ("b", "10.0.0.0/26"), ("b", "10.0.0.0/26"), ("c", "10.0.0.0/26")):
        held.add(handle, cidr)
    held.add("c", "fd00::/122")
    assert held.counts("a") == {"10.0.0.0/26": 1} and held.counts("b") == {"10.0.0.0/26": 2}
    assert held.counts("c") == {"10.0.0.0/26": 1, "fd00::/122": 1} and held.counts("z") == {} and len(held) == 3
    assert held.exact("a", '{"block":{"10.0.0.0/26":1},"deleted":false}')
    assert held.exact("b", '{"block":{"10.0.0.0/26":2},"deleted":false}')
    assert not held.exact("b", '{"block":{"10.0.0.0/26":1},"deleted":false}')
    assert not held.exact("z", "{}")
    # As Python's json.dumps writes them (a tool rewrote the keys): the same answers, not parsed.
    assert held.exact("a", json.dumps({"block": {"10.0.0.0/26": 1}, "deleted": False}))
    assert held.exact("b", json.dumps({"block": {"10.0.0.0/26": 2}, "deleted": False}))
    assert not held.exact("b", json.dumps({"block": {"10.0.0.0/26": 1}, "deleted": False}))
    assert not held.exact("a", json.dumps({"block": {"10.0.0.0/26": 1}, "deleted": True}))
    assert not held.exact("a", json.dumps({"block": {"10.0.0.0/26": 1}, "deleted": False}, indent=1))
    # A dual-stack pod's handle names two blocks, in the order Go writes a map's keys (sorted): its
    # text is built from the two cidrs, in either form. In another order (no Go encoder's), or
    # counting other than one in each, it is no text built here: the caller decodes it.
    assert held.exact("c", '{"block":{"10.0.0.0/26":1,"fd00::/122":1},"deleted":false}')
    assert held.exact("c", json.dumps({"block": {"10.0.0.0/26": 1, "fd00::/122": 1}, "deleted": False}))
    assert not held.exact("c", '{"block":{"fd00::/122":1,"10.0.0.0/26":1},"deleted":false}')
    assert not held.exact("c", '{"block":{"10.0.0.0/26":1,"fd00::/122":2},"deleted":false}')
    assert not held.exact("c", '{"block":{"10.0.0.0/26":1,"fd00::/122":1},"deleted":true}')
    assert not held.exact("c", '{"block":{"10.0.0.0/26":1},"deleted":false}')
    # Sorted as Go sorts a map's keys, byte by byte, whatever order the blocks were read in.
    held.add("f", "192.168.0.0/26")
    held.add("f", "1000::/122")
    assert held.exact("f", '{"block":{"1000::/122":1,"192.168.0.0/26":1},"deleted":false}')
    assert not held.exact("f", '{"block":{"192.168.0.0/26":1,"1000::/122":1},"deleted":false}')
    assert "a" in held and "z" not in held and held.in_blocks({hash("c")}) == {"10.0.0.0/26": 1, "fd00::/122": 1}
    # One allocation in each of two blocks is kept as their two cidrs; a second in one of them, or a
    # third block, counts as a dict would.
    assert held.holds_exactly("c", {"10.0.0.0/26": 1, "fd00::/122": 1})
    assert not held.holds_exactly("c", {"10.0.0.0/26": 1}) and not held.holds_exactly("c", {"fd00::/122": 1})
    assert not held.holds_exactly("c", {"10.0.0.0/26": 1, "fd00::/122": 2})
    for handle, cidr in (("d", "10.0.0.0/26"), ("d", "fd00::/122"), ("d", "10.0.0.64/26"), ("e", "fd00::/122")):
        held.add(handle, cidr)
    assert held.counts("d") == {"10.0.0.0/26": 1, "fd00::/122": 1, "10.0.0.64/26": 1}
    held.add("c", "fd00::/122")
    held.add("e", "10.0.0.0/26")
    held.add("e", "fd00::/122")
    assert held.counts("c") == {"10.0.0.0/26": 1, "fd00::/122": 2}
    assert held.counts("e") == {"fd00::/122": 2, "10.0.0.0/26": 1}
    assert held.holds_exactly("c", {"fd00::/122": 2, "10.0.0.0/26": 1})
    assert held.in_blocks({hash("d"), hash("c")}) == {"10.0.0.0/26": 2, "fd00::/122": 3, "10.0.0.64/26": 1}


@pytest.mark.parametrize(
    "text",
    ["10.0.1.23/19", "10.0.1.23", "010.0.0.1", "1.2.3.4/33", "1.2.3", "1.2.3.4/", "256.1.1.1", "1.2.3.4/-1",
     " 1.2.3.4", "1.2.3.4/00032", "fd00::1/64", "::ffff:1.2.3.4", "", "x",
     # A prefix in digits Python's int() reads but ipaddress does not (the first crashed the run):
     "1.2.3.4/\u00b2", "1.2.3.4/\u0663", "fd00::1/\u00b2", "fd00::1/\u0663",
     "fd00::1/0128", "fd00::1/129", "FD00:0:0::1/64", "::ffff:1.2.3.4/96", "fe80::1%eth0/64", "fe80::1%eth0",
     "1::2::3", "fd00::1/", "fd00::1/ 64",
     # A NUL, which the C library refuses with a ValueError (the first crashed the run):
     "10.0.0.1\u0000", "fd00::1\u0000", "\u0000",
     # More digits than int() converts (4,300), which ended the run in a ValueError:
     "10.0.0.1/" + "3" * 5000, "10.0.0.1/" + "0" * 4999 + "32", "fd00::1/" + "0" * 4999 + "64"],
)  # fmt: skip
def test_a_node_address_is_read_as_ipaddress_reads_it(text: str) -> None:
    """A Calico Node's address (`spec.bgp.ipv4Address`, `ipv6Address`): its IP as ipaddress writes
    it, or None where ipaddress refuses it."""
    try:
        expected: str | None = str(ipaddress.ip_interface(text).ip)
    except ValueError:
        expected = None
    assert bare_ip(text) == expected


def test_endpoint_ips_clear_their_ordinals_before_and_after_every_block_is_read() -> None:
    """Endpoint IPs that come before the last block wait as numbers (IPv4 and IPv6 alike) and are
    looked up once the blocks are in; later ones at once; text that is no address is passed over."""
    live = frozenset({"a"})
    four = block_with({1: ("h1", "a"), 2: ("h2", "a"), 3: ("h3", "a")})
    for attribute in four["attributes"]:
        attribute["secondary"].update(namespace="ns", pod=attribute["handle_id"])
    six = {**four, "cidr": "fd00::/125"}
    scan = BlockScan(live)
    scan.held_by_endpoints(["10.1.0.1", "fd00::2", "not an ip", "10.9.9.9"])  # before the blocks
    scan.add(four["cidr"], four)
    scan.add(six["cidr"], six)
    assert scan.unheld == {"10.1.0.0/29": 0b1110, "fd00::/125": 0b1110}
    scan.blocks_read()
    assert scan.unheld == {"10.1.0.0/29": 0b1100, "fd00::/125": 0b1010}
    scan.held_by_endpoints(["10.1.0.3", "fd00::1"])  # after
    assert scan.unheld == {"10.1.0.0/29": 0b0100, "fd00::/125": 0b1000}


def test_cooling_addresses_with_a_release_time_that_is_not_a_time_are_counted_and_never_freed() -> None:
    """A `releasedAt` of another shape (a number) is counted as cooling, is no oldest, and is never
    taken for cooled: kept, as Calico would keep what it cannot read."""
    from datetime import UTC, datetime

    from job.core.ipam import collect_cooled
    from job.core.model import Cooldown

    seed = CalicoSeed()
    block = seed.block("10.7.0.0/26", "live")
    block["attributes"] += [
        {"releasedAt": 123},
        {"releasedAt": "2026-11-30T11:00:00Z"},
        {"releasedAt": "2026-11-30T10:00:00Z"},
    ]
    for ordinal, index in ((5, 0), (6, 1), (7, 2)):
        block["allocations"][ordinal] = index
        block["unallocated"].remove(ordinal)
    scan = BlockScan(frozenset({"live"}))
    scan.add("10.7.0.0/26", block)
    assert scan.cooling == {"10.7.0.0/26": (3, datetime(2026, 11, 30, 10, tzinfo=UTC))}
    collect_cooled(block, Cooldown(600, datetime(2026, 11, 30, 12, tzinfo=UTC)))
    assert block["attributes"] == [{"releasedAt": 123}] and block["allocations"][5] == 0
    assert block["allocations"][6] is None and block["unallocated"][-2:] == [6, 7]


def test_a_handle_as_calico_or_json_dumps_writes_one_is_read_without_the_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan of 500 gone hosts reads 10,000 handles: those of the two common encoders skip json.loads."""

    def refused(text: str) -> None:
        raise AssertionError(f"decoded {text!r}")

    monkeypatch.setattr(json, "loads", refused)
    for value in ({"block": {"10.0.0.0/26": 3}, "deleted": False}, {"block": {"fd00::/122": 0}, "deleted": False}):
        assert parse_handle(json.dumps(value, separators=(",", ":"))) == value
        assert parse_handle(json.dumps(value)) == value
    with pytest.raises(AssertionError, match="decoded"):
        parse_handle(json.dumps({"block": {"10.0.0.0/26": 1}, "deleted": False}, indent=1))


@pytest.mark.parametrize(
    "text",
    [
        '{"block":{"10.0.0.0/26":1},"deleted":false}',  # as Calico writes one
        '{"block":{"fd00::/122":0},"deleted":false}',
        '{"block":{"10.0.0.0/26":123456789012345678},"deleted":false}',
        '{"block":{"10.0.0.0/26":01},"deleted":false}',  # not JSON
        '{"block":{"10.0.0.0/26":-1},"deleted":false}',
        '{"block":{"10.0.0.0/26":1.0},"deleted":false}',
        '{"block":{"10.0.0.\\u0030/26":1},"deleted":false}',  # an escape
        '{"block":{"10.0.0.0/26\t":1},"deleted":false}',  # a raw control character: not JSON
        '{"block":{"10.0.0.0/26":1},"deleted":true}',
        '{"block":{"10.0.0.0/26":1,"10.0.1.0/26":2},"deleted":false}',
        '{"block": {"10.0.0.0/26": 1}, "deleted": false}',  # as json.dumps writes one
        '{"block": {"10.0.0.0/26": 1}, "deleted": true}',
        '{"block":{"10.0.0.0/26": 1},"deleted": false}',  # mixed spacing: still JSON
        '{"block":  {"10.0.0.0/26": 1}, "deleted": false}',
        '{"deleted":false,"block":{"10.0.0.0/26":1}}',  # another field order
        '{"block":{"10.0.0.0/26":1},"deleted":false} ',
        "",
        "null",
    ],
)
def test_a_handle_reads_as_the_json_decoder_reads_it(text: str) -> None:
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = None
    parsed = parse_handle(text)
    assert parsed == decoded and type(parsed) is type(decoded)
    if isinstance(decoded, dict):
        assert [type(v) for v in (decoded.get("block") or {}).values()] == [
            type(v) for v in (parsed.get("block") or {}).values()
        ]


def test_an_address_is_found_in_its_block_among_blocks_of_both_families_and_sizes() -> None:
    """Networks finds an address's block and ordinal by family and prefix length; a copy is its
    own (a re-plan edits one), and a block discarded is found no more."""
    networks = Networks()
    for cidr in ("10.0.0.0/26", "10.0.1.0/28", "fd00::/122", "fd00::1:0/122", "0.0.0.0/26"):
        networks.add(cidr)
    assert networks.locate("10.0.0.63") == ("10.0.0.0/26", 63)
    assert networks.locate("10.0.1.15") == ("10.0.1.0/28", 15)
    assert networks.locate("10.0.1.16") is None
    assert networks.locate("fd00::1:3f") == ("fd00::1:0/122", 63)
    assert networks.locate("::5") is None  # the IPv6 address of IPv4 0.0.0.5's number: another family
    assert networks.locate("0.0.0.5") == ("0.0.0.0/26", 5)
    assert networks.locate("not an address") is None
    copied = networks.copy()
    copied.discard("10.0.0.0/26")
    assert copied.locate("10.0.0.1") is None
    assert networks.locate("10.0.0.1") == ("10.0.0.0/26", 1)
    assert copied.locate("fd00::2") == ("fd00::/122", 2)

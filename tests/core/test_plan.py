"""Pure planning with plain data: orphans, grace, conflicts, guards, caps."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from job.adapters.datastores.etcdv3 import build_inventory
from job.config import Config
from job.core.inventory import Inventory
from job.core.ipam import IpamIndex
from job.core.model import Action, BlockAffinity, CalicoHost, ClusterInfo, KubeNode, StoredItem, WorkloadEndpoint
from job.core.plan import build_index, plan_run, read_first, refreshed, reindexed
from tests.support.scenario import cross_borrowing_fleet

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NO_GRACE = Config(grace_period=timedelta(0), max_orphan_fraction=1.0)


def host(name: str, k8s: str | None = "", ipv4: str | None = None, **kw: object) -> CalicoHost:
    node = StoredItem(f"nodes/{name}", 7, "{}")
    return CalicoHost(name, node, (k8s or name) if k8s is not None else None, ipv4=ipv4, **kw)  # type: ignore[arg-type]


def nodes(*names: str) -> tuple[KubeNode, ...]:
    return tuple(KubeNode(n) for n in names)


def inventory(*hosts: CalicoHost, ready: bool | None = True) -> Inventory:
    return Inventory(hosts=hosts, cluster=ClusterInfo("guid", ready))


def decisions(
    plan_hosts: Inventory,
    k8s: tuple[KubeNode, ...],
    config: Config = NO_GRACE,
    state: dict[str, datetime] | None = None,
) -> dict[str, tuple[str, str]]:
    plan = plan_run(plan_hosts, k8s, state or {}, NOW, config)
    return {d.host.name: (str(d.action), d.reason) for d in plan.decisions}


LIVE = [host(f"live-{i}") for i in range(4)]
K8S = nodes(*(f"live-{i}" for i in range(4)))


@pytest.mark.parametrize(
    ("extra", "config", "expected"),
    [
        (host("gone"), NO_GRACE, ("would_delete", "k8s_node_missing")),
        (host("calico-name", k8s="gone-k8s-name"), NO_GRACE, ("would_delete", "k8s_node_missing")),
        (host("old", k8s=None), NO_GRACE, ("skipped", "no_k8s_orchref")),
        (host("old", k8s=None), replace(NO_GRACE, unreferenced="match-name"), ("would_delete", "name_not_in_k8s")),
        (host("rr-1"), replace(NO_GRACE, exclude=("rr-.*",)), ("skipped", "excluded")),
        (host("gone", felix_alive=True), NO_GRACE, ("skipped", "felix_alive")),
        (host("gone"), replace(NO_GRACE, grace_period=timedelta(minutes=30)), ("waiting_grace", "grace_period")),
        (host("gone"), replace(NO_GRACE, max_deletions=0), ("deferred", "max_deletions")),
        (host("gone", problem="bad json"), NO_GRACE, ("skipped", "malformed_data")),
    ],
)
def test_each_kind_of_host_gets_its_decision(extra: CalicoHost, config: Config, expected: tuple[str, str]) -> None:
    assert decisions(inventory(*LIVE, extra), K8S, config)[extra.name] == expected


def test_live_hosts_are_not_in_the_plan() -> None:
    assert decisions(inventory(*LIVE, host("gone")), K8S) == {"gone": ("would_delete", "k8s_node_missing")}


def test_unreferenced_host_whose_name_is_a_live_node_is_live_under_match_name() -> None:
    config = replace(NO_GRACE, unreferenced="match-name")
    assert decisions(inventory(*LIVE, host("live-0", k8s=None)), K8S, config) == {}


def test_names_are_matched_exactly_never_shortened() -> None:
    hosts = inventory(*LIVE, host("live-0.ec2.internal", k8s=None))
    config = replace(NO_GRACE, unreferenced="match-name")
    assert decisions(hosts, K8S, config)["live-0.ec2.internal"][0] == "would_delete"


def test_grace_elapses_from_the_first_sighting() -> None:
    config = replace(NO_GRACE, grace_period=timedelta(minutes=30))
    hosts = inventory(*LIVE, host("gone"))
    assert decisions(hosts, K8S, config, {"gone": NOW - timedelta(minutes=29)})["gone"][0] == "waiting_grace"
    assert decisions(hosts, K8S, config, {"gone": NOW - timedelta(minutes=30)})["gone"][0] == "would_delete"


def test_next_state_keeps_first_sightings_and_drops_hosts_no_longer_orphaned() -> None:
    earlier = NOW - timedelta(minutes=5)
    state = {"gone": earlier, "back-again": earlier}
    plan = plan_run(inventory(*LIVE, host("gone"), host("new-orphan")), K8S, state, NOW, NO_GRACE)
    assert plan.next_grace_state == {"gone": earlier, "new-orphan": NOW}


def test_felix_alive_and_excluded_hosts_do_not_run_the_grace_clock() -> None:
    config = replace(NO_GRACE, exclude=("keep",))
    plan = plan_run(inventory(*LIVE, host("alive", felix_alive=True), host("keep")), K8S, {}, NOW, config)
    assert plan.next_grace_state == {}


def test_orphan_holding_a_new_nodes_ip_is_a_conflict_with_its_own_grace() -> None:
    config = replace(NO_GRACE, grace_period=timedelta(hours=1), conflict_grace_period=timedelta(0))
    k8s = (*K8S, KubeNode("new-node", ("10.0.0.9",)))
    plan = plan_run(inventory(*LIVE, host("old-node", ipv4="10.0.0.9"), host("other-orphan")), k8s, {}, NOW, config)
    by_name = {d.host.name: d for d in plan.decisions}
    assert by_name["old-node"].action is Action.WOULD_DELETE and by_name["old-node"].conflict
    assert by_name["other-orphan"].action is Action.WAITING_GRACE
    assert [(c.ip, c.orphan, c.blocks, c.kind) for c in plan.conflicts] == [
        ("10.0.0.9", "old-node", "new-node", "orphan_holds_live_node_ip")
    ]


def test_conflicts_are_deleted_before_older_orphans_when_capped() -> None:
    config = replace(NO_GRACE, max_deletions=1)
    k8s = (*K8S, KubeNode("new-node", ("10.0.0.9",)))
    state = {"older": NOW - timedelta(days=9)}
    result = decisions(inventory(*LIVE, host("older"), host("old-node", ipv4="10.0.0.9")), k8s, config, state)
    assert result == {"older": ("deferred", "max_deletions"), "old-node": ("would_delete", "k8s_node_missing")}


def test_two_live_hosts_sharing_an_ip_are_reported_and_never_acted_on() -> None:
    hosts = inventory(replace(LIVE[0], ipv4="10.0.0.5"), replace(LIVE[1], ipv4="10.0.0.5"), *LIVE[2:])
    plan = plan_run(hosts, K8S, {}, NOW, NO_GRACE)
    assert plan.decisions == ()
    assert [(c.orphan, c.kind) for c in plan.conflicts] == [(None, "live_hosts_share_ip")]


def test_orphan_sharing_an_ip_with_another_host_is_a_conflict() -> None:
    hosts = inventory(replace(LIVE[0], ipv4="10.0.0.5"), *LIVE[1:], host("gone", ipv4="10.0.0.5"))
    plan = plan_run(hosts, K8S, {}, NOW, NO_GRACE)
    assert [(c.orphan, c.blocks, c.kind) for c in plan.conflicts] == [("gone", "live-0", "orphan_shares_host_ip")]


@pytest.mark.parametrize(
    ("hosts", "k8s", "guard"),
    [
        (inventory(*LIVE), (), "empty_k8s_node_list"),
        (inventory(*LIVE, host("gone"), ready=False), K8S, "datastore_locked"),
        (inventory(host("a"), host("b")), nodes("x", "y", "z", "a"), "foreign_datastore"),
        (inventory(*LIVE, host("g1"), host("g2"), host("g3"), host("g4"), host("g5")), K8S, "orphan_fraction"),
    ],
)
def test_guards_refuse_the_run_but_keep_the_full_plan(hosts: Inventory, k8s: tuple[KubeNode, ...], guard: str) -> None:
    plan = plan_run(hosts, k8s, {}, NOW, replace(NO_GRACE, max_orphan_fraction=0.5))
    assert guard in [g.name for g in plan.guards]
    assert plan.refused
    if k8s:
        assert plan.decisions, "a refused run still reports what it would have done"


@pytest.mark.parametrize(
    ("hosts", "k8s"), [(inventory(), K8S), (inventory(host("a"), host("b")), nodes("x", "y", "z", "a"))]
)
def test_a_foreign_datastore_is_refused_with_the_settings_to_check(hosts: Inventory, k8s: tuple[KubeNode, ...]) -> None:
    plan = plan_run(hosts, k8s, {}, NOW, NO_GRACE)
    (guard,) = [g for g in plan.guards if g.name == "foreign_datastore"]
    assert "ETCD_ENDPOINTS" in guard.message and "DATASTORE_TYPE" in guard.message
    assert all(kind in guard.message for kind in ("etcdv3", "etcdv2", "kubernetes")), "all three types named"


def test_orphan_fraction_message_names_the_flag_to_raise() -> None:
    plan = plan_run(
        inventory(*LIVE[:1], host("g1"), host("g2")), K8S[:1], {}, NOW, replace(NO_GRACE, max_orphan_fraction=0.5)
    )
    assert "--max-orphan-fraction" in plan.guards[0].message


def test_orphan_fraction_at_the_limit_is_allowed() -> None:
    plan = plan_run(
        inventory(*LIVE[:2], host("g1"), host("g2")), K8S[:2], {}, NOW, replace(NO_GRACE, max_orphan_fraction=0.5)
    )
    assert not plan.refused


def test_the_node_is_deleted_last_in_every_plan() -> None:
    plan = plan_run(inventory(*LIVE, host("gone")), K8S, {}, NOW, NO_GRACE)
    (decision,) = plan.decisions
    assert decision.steps[-1].writes[0].key == "nodes/gone"
    assert decision.steps[-1].writes[0].revision == 7


# Properties

names = st.text(alphabet="abcdefgh-.", min_size=1, max_size=6)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Inventory, tuple[KubeNode, ...], dict[str, datetime], Config]:
    calico_names = draw(st.lists(names, unique=True, max_size=12))
    k8s_names = draw(st.lists(names, unique=True, max_size=12))
    hosts = []
    for name in calico_names:
        ref = draw(st.one_of(st.none(), st.just(""), names))
        hosts.append(
            host(
                name,
                k8s=ref,
                ipv4=draw(st.sampled_from([None, "10.0.0.1", "10.0.0.2"])),
                felix_alive=draw(st.booleans()),
            )
        )
    state = {n: NOW - timedelta(minutes=draw(st.integers(0, 120))) for n in draw(st.lists(names, max_size=6))}
    config = Config(
        grace_period=timedelta(minutes=draw(st.integers(0, 90))),
        conflict_grace_period=timedelta(minutes=draw(st.integers(0, 90))),
        max_deletions=draw(st.integers(0, 5)),
        max_orphan_fraction=1.0,
        unreferenced=draw(st.sampled_from(["skip", "match-name"])),
    )
    k8s = tuple(KubeNode(n, (draw(st.sampled_from(["10.0.0.1", "10.0.0.3"])),)) for n in k8s_names)
    return inventory(*hosts), k8s, state, config


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_host_whose_kubernetes_node_exists_is_never_planned_for_deletion(
    world: tuple[Inventory, tuple[KubeNode, ...], dict[str, datetime], Config],
) -> None:
    hosts, k8s, state, config = world
    live = {n.name for n in k8s}
    for decision in plan_run(hosts, k8s, state, NOW, config).decisions:
        if decision.action is Action.WOULD_DELETE:
            assert (decision.host.k8s_node or decision.host.name) not in live
            assert decision.host.name not in live or decision.host.k8s_node is not None
            assert not decision.host.felix_alive


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_host_is_deleted_before_its_grace_period(
    world: tuple[Inventory, tuple[KubeNode, ...], dict[str, datetime], Config],
) -> None:
    hosts, k8s, state, config = world
    plan = plan_run(hosts, k8s, state, NOW, config)
    deletions = [d for d in plan.decisions if d.action is Action.WOULD_DELETE]
    assert len(deletions) <= config.max_deletions
    for decision in deletions:
        grace = config.conflict_grace_period if decision.conflict else config.grace_period
        assert decision.host.name in state or grace == timedelta(0)
        assert decision.orphaned_since is not None and NOW - decision.orphaned_since >= grace


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_planning_is_deterministic(world: tuple[Inventory, tuple[KubeNode, ...], dict[str, datetime], Config]) -> None:
    hosts, k8s, state, config = world
    first = plan_run(hosts, k8s, state, NOW, config)
    again = plan_run(
        Inventory(hosts=tuple(reversed(hosts.hosts)), cluster=hosts.cluster),
        tuple(reversed(k8s)),
        dict(reversed(list(state.items()))),
        NOW,
        config,
    )
    assert first.decisions == again.decisions
    assert first.conflicts == again.conflicts
    assert first.next_grace_state == again.next_grace_state


def test_a_malformed_orphan_does_not_take_a_deletion_slot() -> None:
    config = replace(NO_GRACE, max_deletions=1)
    state = {"a-broken": NOW - timedelta(days=2)}  # the longest orphaned, so considered first
    affinity = BlockAffinity(StoredItem("affinity/a-broken", 3, ""), "a-broken", "10.9.0.0/26")
    hosts = Inventory(
        hosts=(*LIVE, host("a-broken", affinities=(affinity,)), host("b-fine"), host("c-later")),
        malformed_blocks=("10.9.0.0/26",),
        cluster=ClusterInfo("guid", True),
    )
    plan = plan_run(hosts, K8S, state, NOW, config)
    assert [(d.host.name, str(d.action), d.reason) for d in plan.decisions] == [
        ("a-broken", "skipped", "malformed_data"),
        ("b-fine", "would_delete", "k8s_node_missing"),
        ("c-later", "deferred", "max_deletions"),
    ]
    assert not plan.decisions[2].steps, "no work is done for deferred hosts"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(0, 4), st.data())
def test_a_plan_of_a_read_that_kept_the_hosts_read_first_left_out_lean_decides_as_a_whole_one(
    broken: list[bool], max_deletions: int, data: st.DataObject
) -> None:
    """(issue 31, memory with many gone hosts) The gone hosts read_first leaves out are read lean
    (Inventory.partial). The plan then decides as it does from a whole read, or, where it reaches
    one of them before --max-deletions (the hosts read whole were skipped: here, those whose
    only block is malformed), takes none of them and says so (Plan.unread): the run reads again."""
    names = [f"gone-{i:02d}" for i in range(len(broken))]
    state = {name: NOW - timedelta(minutes=data.draw(st.integers(0, 120))) for name in names}
    config = replace(
        NO_GRACE, grace_period=timedelta(minutes=data.draw(st.integers(0, 60))), max_deletions=max_deletions
    )
    affinity = {
        name: BlockAffinity(StoredItem(f"affinity/{name}", 3, ""), name, f"10.9.{i}.0/26")
        for i, name in enumerate(names)
    }
    hosts = Inventory(
        hosts=(*LIVE, *(host(name, affinities=(affinity[name],)) for name in names)),
        malformed_blocks=tuple(affinity[name].cidr for name, bad in zip(names, broken, strict=True) if bad),
        cluster=ClusterInfo("guid", True),
    )
    whole = plan_run(hosts, K8S, state, NOW, config)
    lean_ones = frozenset(names) - read_first(hosts.hosts, K8S, state, NOW, config)
    lean = plan_run(replace(hosts, partial=lean_ones), K8S, state, NOW, config)
    assert not any(d.action is Action.WOULD_DELETE and d.host.name in lean_ones for d in lean.decisions)
    if lean.unread:  # the hosts it reached with a deletion left, in its order
        assert set(lean.unread) <= lean_ones
        taken = [d for d in lean.decisions if d.action is Action.WOULD_DELETE]
        assert len(taken) < max_deletions and set(taken) <= set(whole.decisions)  # as the whole plan takes them
    else:
        assert lean.decisions == whole.decisions and lean.next_grace_state == whole.next_grace_state


def test_read_first_names_the_hosts_a_plan_takes_first_twice_as_many_as_it_may_delete() -> None:
    config = replace(NO_GRACE, grace_period=timedelta(hours=1), conflict_grace_period=timedelta(0), max_deletions=1)
    k8s = (*K8S, KubeNode("new-node", ("10.0.0.9",)), KubeNode("live-with-ip"))
    state = {"b-older": NOW - timedelta(days=2), "c-old": NOW - timedelta(days=1), "d-old": NOW - timedelta(days=1)}
    hosts = (
        *LIVE,
        host("live-with-ip", ipv4="10.0.0.7"),
        host("h-shares", ipv4="10.0.0.7"),  # shares a live host's IP: a conflict too (given the live hosts)
        host("a-new"),  # waits out its grace period
        host("b-older"),
        host("c-old"),
        host("d-old"),  # after c-old, by name: past the two a plan may take first
        host("e-conflict", ipv4="10.0.0.9"),  # a conflict goes first, its grace none
        host("f-excluded"),
        host("g-felix", felix_alive=True),
    )
    excluded = replace(config, exclude=("f-.*",))
    state |= {"f-excluded": NOW - timedelta(days=3), "g-felix": NOW - timedelta(days=3)}
    assert read_first(hosts, k8s, state, NOW, excluded) == {"e-conflict", "h-shares"}
    assert read_first(hosts, k8s, state, NOW, replace(excluded, max_deletions=2)) == {
        "e-conflict",
        "h-shares",
        "b-older",
        "c-old",
    }
    assert read_first(hosts, k8s, state, NOW, replace(excluded, max_deletions=3)) == {
        "e-conflict",
        "h-shares",
        "b-older",
        "c-old",
        "d-old",
    }
    assert read_first(hosts, k8s, state, NOW, replace(excluded, max_deletions=0)) == set()


def test_a_plan_that_reaches_a_host_read_lean_takes_none_and_says_so() -> None:
    config = replace(NO_GRACE, max_deletions=1)
    state = {"a-broken": NOW - timedelta(days=3), "b-broken": NOW - timedelta(days=2)}
    broken = {
        name: (BlockAffinity(StoredItem(f"affinity/{name}", 3, ""), name, cidr),)
        for name, cidr in (("a-broken", "10.9.0.0/26"), ("b-broken", "10.9.1.0/26"))
    }
    endpoint = WorkloadEndpoint(StoredItem("workloadendpoints/shop/c-fine-k8s-cart-eth0", 4, "{}"), "c-fine", ())
    hosts = Inventory(
        hosts=(
            *LIVE,
            host("a-broken", affinities=broken["a-broken"]),
            host("b-broken", affinities=broken["b-broken"]),
            host("c-fine", workload_endpoints=(endpoint,)),
            host("d-later"),
        ),
        malformed_blocks=("10.9.0.0/26", "10.9.1.0/26"),
        cluster=ClusterInfo("guid", True),
    )
    assert read_first(hosts.hosts, K8S, state, NOW, config) == {"a-broken", "b-broken"}
    whole = plan_run(hosts, K8S, state, NOW, config)
    # Read lean, c-fine has none of its endpoints: taken so, they would stay behind it.
    lean = replace(
        hosts, hosts=(*hosts.hosts[:-2], host("c-fine"), host("d-later")), partial=frozenset({"c-fine", "d-later"})
    )
    plan = plan_run(lean, K8S, state, NOW, config)
    assert plan.unread == ("c-fine", "d-later") and not whole.unread  # each reached with a deletion left
    assert {d.host.name: str(d.action) for d in plan.decisions} == {
        "a-broken": "skipped",
        "b-broken": "skipped",
        "c-fine": "deferred",
        "d-later": "deferred",
    }
    taken = next(d for d in whole.decisions if d.host.name == "c-fine")
    assert taken.action is Action.WOULD_DELETE
    assert endpoint.item.key in {w.key for step in taken.steps for w in step.writes}


def _normal(index: IpamIndex) -> tuple[object, ...]:
    """An index as what it says, not how its lists were appended to."""
    lists = [{k: sorted(v) for k, v in table.items() if v} for table in (index.owned, index.affine)]
    networks = {shape: bases for shape, bases in index.networks._bases.items() if bases}
    return index.blocks, dict(index.handles), *lists, sorted(map(str, index.malformed_networks)), networks


@pytest.mark.parametrize("change", ["edited", "claimed by others", "gone", "unreadable", "all three"])
def test_a_re_plan_indexes_only_the_blocks_that_changed_and_indexes_them_as_a_full_build(change: str) -> None:
    """IpamIndex.updated (via reindexed), after a conflict, equals indexing the refreshed
    inventory from scratch: blocks edited, taken over by hosts that already own and claim other
    blocks (their lists must be copied, not appended to), deleted and made unreadable."""
    scenario = cross_borrowing_fleet(3)
    items = [StoredItem(k, 1, v) for k, v in sorted(scenario.seed.keys.items())]
    inventory = build_inventory(iter(items), lambda: 1)
    index = build_index(inventory)
    blocks = [b for b in inventory.blocks if b.owners]
    edited, gone, unreadable = blocks[0], blocks[1], blocks[2]
    keys = {b.item.key for b in (edited, gone, unreadable)}
    now = {b.item.key: b.item for b in inventory.blocks if b.item.key in keys}
    if change in ("edited", "all three"):
        value = json.loads(edited.item.value or "")
        ordinal = next(o for o, i in enumerate(value["allocations"]) if i is not None)
        value["allocations"][ordinal] = None  # an IP released under the job
        value["unallocated"].append(ordinal)
        now[edited.item.key] = StoredItem(edited.item.key, 2, json.dumps(value))
    if change == "claimed by others":
        value = json.loads(edited.item.value or "")
        # Hosts whose other blocks are not read again: only their lists in the index show the change.
        untouched = [b for b in blocks if b.item.key not in keys]
        other = next(b for b in untouched if b.affine_host not in (None, edited.affine_host))
        owner = next(o for b in untouched for o in b.owners.values() if o and o not in edited.owners.values())
        value["affinity"] = f"host:{other.affine_host}"  # claimed by a host that claims another block
        ordinal = value["unallocated"].pop(0)  # and an IP given to a node that owns IPs elsewhere
        value["attributes"].append({"handle_id": "k8s-pod-network.new", "secondary": {"node": owner}})
        value["allocations"][ordinal] = len(value["attributes"]) - 1
        now[edited.item.key] = StoredItem(edited.item.key, 2, json.dumps(value))
    if change in ("gone", "all three"):
        del now[gone.item.key]
    if change in ("unreadable", "all three"):
        now[unreadable.item.key] = StoredItem(unreadable.item.key, 2, "{not json")
    host = inventory.hosts[0].name
    after = refreshed(inventory, now, keys, host)
    assert _normal(reindexed(index, after, keys)) == _normal(build_index(after))
    assert _normal(index) == _normal(build_index(inventory)), "the index it started from is not changed"

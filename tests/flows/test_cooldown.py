"""IP cooldown (Calico 3.32+, IPAMConfig ipCooldownSeconds): a released address points at an
attribute holding only `releasedAt` until it has cooled, and only then goes back on
`unallocated` (libcalico-go/lib/ipam/ipam_block.go). calico-gc never frees one early, never
counts one as garbage, releases in a block that stays as Calico does, and frees what has cooled in
the blocks it writes anyway. On the Kubernetes datastore, in both API groups, and on etcd v3."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

from tests.adapters.test_kdd import GONE, kdd, seed_kdd
from tests.conftest import NOW, Harness, hosts_by_name
from tests.support import scenario as s
from tests.support.groups import Group
from tests.support.kubeapi import KubeApiServer

LIVE_A_BLOCK = "100-96-1-0-26"
GONE_BLOCK = "100-96-9-0-26"  # the gone node's own, lending nothing


def cooldown(kubeapi: KubeApiServer, group: Group, seconds: int) -> None:
    spec = {"autoAllocateBlocks": True, "strictAffinity": False, "ipCooldownSeconds": seconds}
    kubeapi.put(f"{group.path}/{group.ipam_configs}", {"metadata": {"name": "default"}, "spec": spec})


def cooling(kubeapi: KubeApiServer, group: Group, ordinals: tuple[int, ...], released_ago: timedelta) -> None:
    """Addresses of live-a's block released `released_ago`, as Calico's release leaves them."""
    block = copy.deepcopy(kubeapi.get(f"{group.path}/ipamblocks", LIVE_A_BLOCK))
    assert block is not None
    spec = block["spec"]
    spec["attributes"].append({"releasedAt": (NOW - released_ago).strftime("%Y-%m-%dT%H:%M:%SZ")})
    for ordinal in ordinals:
        spec["allocations"][ordinal] = len(spec["attributes"]) - 1
        spec["unallocated"].remove(ordinal)
    kubeapi.put(f"{group.path}/ipamblocks", block)


def block_spec(kubeapi: KubeApiServer, group: Group) -> dict[str, Any]:
    block = kubeapi.get(f"{group.path}/ipamblocks", LIVE_A_BLOCK)
    assert block is not None
    return dict(block["spec"])


def test_a_cooling_address_is_no_garbage_and_is_never_freed_early(harness: Harness, group: Group) -> None:
    """Cooling 2 minutes before the first run, with a 20-minute cooldown: at 16 minutes the ghost
    pod's leak is released in the same block, and the cooling addresses stay all the same."""
    seed_kdd(harness.kubeapi, group)
    cooldown(harness.kubeapi, group, 1200)
    cooling(harness.kubeapi, group, (30, 31), timedelta(minutes=2))
    config = kdd(harness, apply=True, release_leaked_ips=True, max_leak_releases=50, grace_period=timedelta(hours=2))
    for _ in range(3):  # 2, 10 and 18 minutes after the release
        report, code = harness.run(config)
        assert code == 0, report["errors"]
        audit = report["audit"]
        assert audit["cooling"]["count"] == 2 and audit["cooling"]["cooldown_s"] == 1200
        assert audit["dangling_allocations"]["count"] == 0
        assert {e["ip"] for e in audit["leaked_ips"]["sample"]} == {"100.96.1.9"}, "the ghost pod's only"
        spec = block_spec(harness.kubeapi, group)
        assert spec["allocations"][30] is not None and 30 not in spec["unallocated"]
        harness.now += timedelta(minutes=8)
    assert audit["cooling"]["oldest_age_s"] == 18 * 60 and audit["cooling"]["blocks_not_collected"]["count"] == 0
    assert spec["allocations"][9] is not None and spec["attributes"][spec["allocations"][9]].get("releasedAt"), (
        "the block was written meanwhile: the ghost's address went into cooldown beside them"
    )


def test_a_release_in_a_block_that_stays_is_a_cooldown_and_what_has_cooled_is_freed(
    harness: Harness, group: Group
) -> None:
    """The gone node borrowed 100.96.1.40 from live-a's block: calico-gc writes that block anyway,
    so it releases the address as Calico does (into cooldown) and frees what has cooled there."""
    seed_kdd(harness.kubeapi, group)
    cooldown(harness.kubeapi, group, 600)
    cooling(harness.kubeapi, group, (30,), timedelta(minutes=11))  # cooled: 11 minutes > 10
    cooling(harness.kubeapi, group, (31,), timedelta(minutes=4))  # still cooling
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    spec = block_spec(harness.kubeapi, group)
    attributes = spec["attributes"]
    borrowed = attributes[spec["allocations"][40]]
    assert borrowed == {"releasedAt": "2026-11-30T12:00:00Z"}, "released as Calico does: into cooldown"
    assert 40 not in spec["unallocated"]
    assert spec["allocations"][30] is None and spec["unallocated"][-1] == 30, "cooled: freed"
    assert "30" not in spec["sequenceNumberForAllocation"]
    assert attributes[spec["allocations"][31]]["releasedAt"] == "2026-11-30T11:56:00Z", "still cooling: kept"
    assert not any(a.get("handle_id") == "k8s-pod-network.cart-2" for a in attributes)
    # The gone node's own block keeps its affinity while what it held cools (own_block_cools).
    own = harness.kubeapi.get(f"{group.path}/ipamblocks", GONE_BLOCK)
    assert own is not None and own["spec"]["affinity"] == f"host:{GONE}"
    # The handle went with the address, at once, as Calico's release lowers it.
    assert harness.kubeapi.get(f"{group.path}/ipamhandles", "k8s-pod-network.cart-2") is None


def test_a_gone_nodes_own_block_keeps_its_affinity_until_its_addresses_have_cooled(
    harness: Harness, group: Group
) -> None:
    """As kube-controllers holds it: the addresses the gone node held go into cooldown in its
    block, which keeps the node's affinity, for a new claim of the CIDR would hand them out at
    once. Until they have cooled the node is `skipped` (addresses_cooling); then the block and
    its affinity go."""
    seed_kdd(harness.kubeapi, group)
    cooldown(harness.kubeapi, group, 600)
    config = kdd(harness, apply=True)
    report, code = harness.run(config)
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    own = harness.kubeapi.get(f"{group.path}/ipamblocks", GONE_BLOCK)
    assert own is not None and own["spec"]["affinity"] == f"host:{GONE}"
    spec = own["spec"]
    held = [i for i, index in enumerate(spec["allocations"]) if index is not None]
    assert held and all(
        spec["attributes"][spec["allocations"][i]] == {"releasedAt": "2026-11-30T12:00:00Z"} for i in held
    )
    assert f"{GONE}-{GONE_BLOCK}" in harness.kubeapi.objects[f"{group.path}/blockaffinities"]
    harness.now += timedelta(minutes=9)
    report, code = harness.run(config)
    decision = hosts_by_name(report)[GONE]
    assert code == 0 and (decision["action"], decision["reason"]) == ("skipped", "addresses_cooling"), decision
    assert harness.kubeapi.get(f"{group.path}/ipamblocks", GONE_BLOCK) is not None, "still cooling: 9 minutes of 10"
    harness.now += timedelta(minutes=2)
    report, code = harness.run(config)
    assert code == 0 and hosts_by_name(report)[GONE]["action"] == "deleted"
    assert harness.kubeapi.get(f"{group.path}/ipamblocks", GONE_BLOCK) is None, "cooled: the block goes"
    assert not any(name.startswith(GONE) for name in harness.kubeapi.objects[f"{group.path}/blockaffinities"])


def test_a_block_whose_cooled_addresses_nothing_frees_is_reported(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)
    cooldown(harness.kubeapi, group, 300)
    cooling(harness.kubeapi, group, (30,), timedelta(minutes=11))  # cooled long ago: kube-controllers not writing
    report, code = harness.run(kdd(harness))
    assert code == 0
    stuck = report["audit"]["cooling"]["blocks_not_collected"]
    assert stuck == {
        "count": 1,
        "sample": [{"cidr": "100.96.1.0/26", "cooling": 1, "oldest_released_at": "2026-11-30T11:49:00Z"}],
    }
    assert block_spec(harness.kubeapi, group)["allocations"][30] is not None, "a dry run writes nothing"


def test_without_a_cooldown_a_release_frees_at_once(harness: Harness, group: Group) -> None:
    seed_kdd(harness.kubeapi, group)  # no IPAMConfig: a cooldown of 0, as Calico reads it
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and report["audit"]["cooling"]["cooldown_s"] == 0
    spec = block_spec(harness.kubeapi, group)
    assert spec["allocations"][40] is None and 40 in spec["unallocated"]


def test_a_restore_takes_back_an_address_its_run_released_into_cooldown(harness: Harness, group: Group) -> None:
    """The run released the gone node's borrowed address into cooldown; its restore undoes that
    release (the address is no one's), and the cooldown attribute nothing points at goes."""
    seed_kdd(harness.kubeapi, group)
    cooldown(harness.kubeapi, group, 600)
    before = copy.deepcopy(block_spec(harness.kubeapi, group))
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and report["kept_as"]
    assert block_spec(harness.kubeapi, group)["attributes"][-1] == {"releasedAt": "2026-11-30T12:00:00Z"}
    document, code = harness.restore(kdd(harness, apply=True))
    assert code == 0, document
    spec = block_spec(harness.kubeapi, group)
    assert spec["attributes"][spec["allocations"][40]] == before["attributes"][before["allocations"][40]]
    assert not any("releasedAt" in a for a in spec["attributes"]) and 40 not in spec["unallocated"]


# On etcd calico-gc does not read the cooldown (docs/calico-data.md): --ip-cooldown-seconds says
# it, and without it a cooling address anywhere means the longest Calico allows, 1200 s.
ETCD_LIVE_BLOCK = "/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26"  # the gone host borrowed .40


def etcd_cooling_cluster() -> s.Scenario:
    """The kops cluster with two addresses of a live node's block cooling: .30 released 25 minutes
    before the run, .31 15 minutes before."""
    scenario = s.kops_cluster()
    scenario.seed.cooling(("100.96.0.30",), "2026-11-30T11:35:00Z")
    scenario.seed.cooling(("100.96.0.31",), "2026-11-30T11:45:00Z")
    return scenario


def etcd_block(harness: Harness) -> dict[str, Any]:
    return dict(json.loads(harness.dump()[ETCD_LIVE_BLOCK][0]))


def released(block: dict[str, Any], ordinal: int) -> str | None:
    """When an ordinal went into cooldown; None where it is free (and KeyError where it is in use)."""
    index = block["allocations"][ordinal]
    return None if index is None else block["attributes"][index]["releasedAt"]


def test_on_etcd_a_cooling_address_means_the_longest_cooldown_until_one_is_set(harness: Harness) -> None:
    harness.seed(etcd_cooling_cluster())
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and hosts_by_name(report)[s.POD_ORPHAN]["action"] == "deleted"
    cooling = report["audit"]["cooling"]
    assert (cooling["count"], cooling["cooldown_s"], cooling["cooldown_source"]) == (2, 1200, "assumed")
    block = etcd_block(harness)
    assert released(block, 40) == "2026-11-30T12:00:00Z", "the borrowed address went into cooldown, not free"
    assert released(block, 30) is None and 30 in block["unallocated"], "25 minutes: past any cooldown"
    assert released(block, 31) == "2026-11-30T11:45:00Z", "15 minutes: a cooldown may be up to 20"


def test_on_etcd_the_cooldown_set_is_followed(harness: Harness) -> None:
    harness.seed(etcd_cooling_cluster())
    report, code = harness.run(harness.config(apply=True, ip_cooldown_seconds=600))
    assert code == 0
    assert (report["audit"]["cooling"]["cooldown_s"], report["audit"]["cooling"]["cooldown_source"]) == (600, "setting")
    block = etcd_block(harness)
    assert released(block, 40) == "2026-11-30T12:00:00Z"
    assert released(block, 30) is None and released(block, 31) is None, "both past 10 minutes"


def test_on_etcd_with_nothing_cooling_and_no_setting_a_release_frees_at_once(harness: Harness) -> None:
    """Every Calico before 3.32: an attribute holding only releasedAt would be a handle-less
    allocation to it, never reused."""
    harness.seed(s.kops_cluster())
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["audit"]["cooling"]["cooldown_source"] is None
    block = etcd_block(harness)
    assert released(block, 40) is None and 40 in block["unallocated"]
    assert not any("releasedAt" in attribute for attribute in block["attributes"])


def test_on_etcd_a_gone_hosts_own_block_goes_once_what_it_held_has_cooled(harness: Harness) -> None:
    """The conflicting orphan's own block holds only its tunnel address: under the assumed
    cooldown it stays, with the host's affinity, until that address has cooled; a run after
    that deletes both, though the host's Calico Node went in the first run."""
    harness.seed(etcd_cooling_cluster())
    config = harness.config(apply=True)
    block = "/calico/ipam/v2/assignment/ipv4/block/100.96.13.0-26"
    affinity = f"/calico/ipam/v2/host/{s.CONFLICT_ORPHAN}/ipv4/block/100.96.13.0-26"
    report, code = harness.run(config)
    assert code == 0 and hosts_by_name(report)[s.CONFLICT_ORPHAN]["action"] == "deleted"
    kept = harness.dump()
    assert affinity in kept and block in kept
    assert json.loads(kept[block][0])["attributes"] == [{"releasedAt": "2026-11-30T12:00:00Z"}]
    harness.now += timedelta(minutes=19)
    report, code = harness.run(config)
    decision = hosts_by_name(report)[s.CONFLICT_ORPHAN]
    assert code == 0 and (decision["action"], decision["reason"]) == ("skipped", "addresses_cooling"), decision
    harness.now += timedelta(minutes=2)
    report, code = harness.run(config)
    assert code == 0 and hosts_by_name(report)[s.CONFLICT_ORPHAN]["action"] == "deleted"
    left = harness.dump()
    assert block not in left and affinity not in left

"""Calico 2.x on the etcd v2 API: the same planner, guards, report and CLI, another adapter.
Runs against the real etcd with --enable-v2, seeded with a Calico 2.6 (kops 1.8) layout."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from job.adapters.datastores.etcdv2 import build_inventory
from job.cli import main
from job.core.ipam import block_shape_problem
from job.core.model import ClusterInfo, StoredItem
from tests.conftest import Harness, applied_losing_answers, down_at_the_first_write, hosts_by_name
from tests.support import calico2
from tests.support.calico2 import BACKLOG, CONFLICT_ORPHAN, LIVE, NEW_NODE, ORPHAN, kops_18_cluster
from tests.support.cut_link import CutLink
from tests.support.odd_values import ODD_VALUES, replace_one


def seeded(harness: Harness) -> calico2.Calico2Seed:
    seed, k8s = kops_18_cluster()
    seed.load(harness.etcd.url)
    for name, ip in k8s:
        harness.kubeapi.add_node(name, ip)
    return seed


def v2(harness: Harness, **overrides: object) -> object:
    return harness.config(datastore_type="etcdv2", **overrides)


def mine(keys: dict[str, tuple[str, int]], host: str) -> dict[str, tuple[str, int]]:
    return {k: v for k, v in keys.items() if f"/{host}/" in k or k.endswith(f"/{host}")}


def test_dry_run_plans_the_orphans_and_changes_nothing(harness: Harness) -> None:
    seeded(harness)
    before = calico2.dump(harness.etcd.url)
    report, code = harness.run(v2(harness))  # type: ignore[arg-type]
    assert code == 0 and calico2.dump(harness.etcd.url) == before
    assert report["datastore"]["type"] == "etcdv2" and report["datastore"]["cluster_guid"] == "c0ffee0123456789"
    hosts = hosts_by_name(report)
    assert hosts[ORPHAN]["action"] == hosts[CONFLICT_ORPHAN]["action"] == "would_delete"
    assert {hosts[name]["reason"] for name in BACKLOG} == {"no_k8s_orchref"}
    assert report["conflicts"] == [
        {"ip": "10.0.2.13", "orphan": CONFLICT_ORPHAN, "blocks": NEW_NODE, "kind": "orphan_holds_live_node_ip"}
    ]
    changes = {c["key"]: c for c in hosts[ORPHAN]["changes"]}
    assert changes[f"/calico/v1/host/{ORPHAN}/metadata"]["revision"] == before[f"/calico/v1/host/{ORPHAN}/metadata"][1]


def test_apply_removes_exactly_the_orphans_trees_and_ipam_entries(harness: Harness) -> None:
    seeded(harness)
    before = calico2.dump(harness.etcd.url)
    report, code = harness.run(v2(harness, apply=True))  # type: ignore[arg-type]
    after = calico2.dump(harness.etcd.url)
    assert code == 0 and report["summary"]["deleted"] == 2
    assert not mine(after, ORPHAN) and not mine(after, CONFLICT_ORPHAN)
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {
        "/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26",
        "/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26",
    }
    removed = set(before) - set(after)
    assert removed - set(mine(before, ORPHAN)) - set(mine(before, CONFLICT_ORPHAN)) == {
        "/calico/ipam/v2/assignment/ipv4/block/100.96.13.0-26",  # the conflict orphan's empty block
        "/calico/ipam/v2/handle/shop.cart-1",
        "/calico/ipam/v2/handle/shop.cart-2",
    }
    lending = json.loads(after["/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"][0])
    assert lending["affinity"] is None and "sequenceNumber" not in lending
    assert [a["handle_id"] for a in lending["attributes"]] == ["shop.api-1"]
    assert lending["allocations"][1] is None, "the handle-less IPIP tunnel address is released too"
    borrowed = json.loads(after["/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26"][0])
    assert borrowed["allocations"][40] is None and borrowed["affinity"] == f"host:{LIVE[0]}"
    assert not [d for d in calico2.directories(harness.etcd.url) if ORPHAN in d], "its empty directories go too"
    for key, value in before.items():
        if key in after and key not in changed:
            assert after[key] == value


def test_match_name_cleans_the_backlog_registered_before_node_refs(harness: Harness) -> None:
    seeded(harness)
    refused, code = harness.run(v2(harness, apply=True, unreferenced="match-name"))  # type: ignore[arg-type]
    assert code == 3 and "--max-orphan-fraction" in refused["guards"][0]["message"], "4 of 6 hosts: a human look"
    report, code = harness.run(
        v2(harness, apply=True, unreferenced="match-name", max_orphan_fraction=0.7)  # type: ignore[arg-type]
    )
    assert code == 0 and {hosts_by_name(report)[name]["action"] for name in BACKLOG} == {"deleted"}
    after = calico2.dump(harness.etcd.url)
    assert not any(mine(after, name) for name in BACKLOG)
    assert all(mine(after, name) for name in LIVE)


def test_cas_conflict_rereads_and_decides_again(harness: Harness) -> None:
    seeded(harness)

    def calico_touches_the_host() -> None:
        calico2._session().put(
            f"{harness.etcd.url}/v2/keys/calico/v1/host/{ORPHAN}/bird_ip", data={"value": "10.0.2.20"}
        )

    harness.kubeapi.on("GET", f"^/api/v1/nodes/{ORPHAN}$", calico_touches_the_host)
    report, code = harness.run(v2(harness, apply=True))  # type: ignore[arg-type]
    assert code == 0 and hosts_by_name(report)[ORPHAN]["action"] == "deleted"
    assert not mine(calico2.dump(harness.etcd.url), ORPHAN)


@pytest.mark.parametrize(
    ("request_line", "host"),
    [
        (b"DELETE /v2/keys/calico/ipam/v2/handle/shop.cart-2?", ORPHAN),
        (b"PUT /v2/keys/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26?", ORPHAN),
        (b"DELETE /v2/keys/calico/bgp/v1/host/ghost-host/?", "ghost-host"),
    ],
    ids=["delete", "update", "directory"],
)
def test_a_write_whose_answer_was_lost_and_that_is_tried_again_is_reported_as_written(
    harness: Harness, request_line: bytes, host: str
) -> None:
    """etcd does the write, and the connection drops before its answer: the retry's compare fails
    (412, or 404 for a delete or an empty directory's) on the write's own doing, which is a write
    done, not a conflict, and the report lists it as the plan had it."""
    seeded(harness)
    calico2._session().put(
        f"{harness.etcd.url}/v2/keys/calico/bgp/v1/host/ghost-host/ip_addr_v4", data={"value": "10.0.9.9"}
    )  # BGP keys of a name with no Calico host: removed with their directory
    planned, _ = harness.run(v2(harness))  # type: ignore[arg-type]
    report, code, link = applied_losing_answers(harness, v2(harness, apply=True), request_line)  # type: ignore[arg-type]
    assert link.lost.is_set(), "the answer to the write was lost"
    entry = hosts_by_name(report)[host]
    assert code == 0 and entry["action"] == "deleted"
    written = [(c["key"], c["op"], c["step"]) for c in entry["changes"]]
    assert written == [(c["key"], c["op"], c["step"]) for c in hosts_by_name(planned)[host]["changes"]]
    assert not mine(calico2.dump(harness.etcd.url), host)
    assert not [d for d in calico2.directories(harness.etcd.url) if host in d]


def lost_answers(harness: Harness, request_line: bytes) -> tuple[dict[str, object], int, CutLink]:
    """An apply run in which every try of the request that starts with `request_line` loses its answer."""
    config = v2(harness, apply=True)
    report, code, link = applied_losing_answers(harness, config, request_line, harness.retry.attempts)  # type: ignore[arg-type]
    assert link.doomed == harness.retry.attempts, "every try of the write lost its answer"
    return report, code, link


def test_a_write_whose_every_answer_was_lost_is_reported_in_doubt(harness: Harness) -> None:
    """The block's PUT is done at the first try, and no try gets its answer: the host fails, and
    the report lists the PUT apart, in doubt, after the writes whose answers came."""
    seeded(harness)
    block = "/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26"
    report, code, _ = lost_answers(harness, f"PUT /v2/keys{block}?".encode())
    entry = hosts_by_name(report)[ORPHAN]
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    doubted = [c for c in entry["changes"] if c.get("in_doubt")]
    assert [c["key"] for c in doubted] == [block] and doubted[0]["before"] is not None
    assert doubted[0]["step"] == max(c["step"] for c in entry["changes"])
    assert calico2.dump(harness.etcd.url)[block][0] == doubted[0]["after"], "it was done"


def test_a_host_whose_directories_could_not_be_removed_reports_its_calico_node_deleted(harness: Harness) -> None:
    """The Calico Node's keys are deleted; the empty directory left after them cannot be: the
    host fails, and the report still lists the keys that were deleted, for a restore."""
    seeded(harness)
    report, code, _ = lost_answers(harness, f"DELETE /v2/keys/calico/v1/host/{ORPHAN}?dir=true".encode())
    entry = hosts_by_name(report)[ORPHAN]
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    written = {c["key"] for c in entry["changes"] if not c.get("in_doubt")}
    assert f"/calico/v1/host/{ORPHAN}/metadata" in written
    assert not [c for c in entry["changes"] if c.get("in_doubt")], "directories are not data"
    assert f"/calico/v1/host/{ORPHAN}/metadata" not in calico2.dump(harness.etcd.url)


def test_etcd_down_mid_run_fails_the_host_and_leaves_blocks_whole(harness: Harness) -> None:
    seeded(harness)
    harness.kubeapi.on("GET", f"^/api/v1/nodes/{ORPHAN}$", harness.etcd.stop)
    report, code = harness.run(v2(harness, apply=True))  # type: ignore[arg-type]
    assert code == 4 and hosts_by_name(report)[ORPHAN]["reason"] == "datastore_error"
    harness.etcd.start()
    for key, (value, _) in calico2.dump(harness.etcd.url).items():
        if "/assignment/" in key:
            assert block_shape_problem(json.loads(value)) is None


def test_a_write_that_found_no_connection_is_not_in_doubt(harness: Harness) -> None:
    """etcd refuses the connection at every try of the first write: it never reached etcd, so
    the failed host's report lists nothing, in doubt or not."""
    seeded(harness)
    down_at_the_first_write(harness, harness.etcd.stop)
    try:
        report, code = harness.run(v2(harness, apply=True))  # type: ignore[arg-type]
    finally:
        harness.etcd.start()
    failed = [h for h in report["hosts"] if h["action"] == "failed"]
    assert code == 4 and failed and all(h["reason"] == "datastore_error" for h in failed)
    assert all(h["changes"] == [] and "may have been written" not in h["error"] for h in failed)


def test_ready_false_means_locked_and_refuses(harness: Harness) -> None:
    seed, k8s = kops_18_cluster()
    seed.globals(ready=False)
    seed.load(harness.etcd.url)
    for name, ip in k8s:
        harness.kubeapi.add_node(name, ip)
    report, code = harness.run(v2(harness, apply=True))  # type: ignore[arg-type]
    assert code == 3 and [g["name"] for g in report["guards"]] == ["datastore_locked"]


def test_malformed_values_and_unknown_keys_are_reported_not_fatal(harness: Harness) -> None:
    seed, k8s = kops_18_cluster()
    seed.put(f"/calico/v1/host/{ORPHAN}/orchestrator_refs", "{not json")
    seed.put("/calico/ipam/v2/assignment/ipv4/block/garbage", "{}")
    seed.put("/calico/bgp/v1/host/ghost-host/ip_addr_v4", "10.9.9.9")
    # A pool's value a JSON list ended the run in `unexpected` (`.get` of a list); one nested past
    # Python's limit was json's RecursionError: each is said once, as what it is.
    seed.put("/calico/v1/ipam/v4/pool/10.8.0.0-16", "[1]")
    seed.put("/calico/v1/ipam/v4/pool/10.7.0.0-16", "[" * 100_000 + "]" * 100_000)
    seed.load(harness.etcd.url)
    for name, ip in k8s:
        harness.kubeapi.add_node(name, ip)
    report, code = harness.run(v2(harness))  # type: ignore[arg-type]
    assert code == 0
    kinds = {(e["kind"], e["key"].rsplit("/", 1)[-1]) for e in report["errors"]}
    assert ("malformed_value", "orchestrator_refs") in kinds and ("unknown_key", "garbage") in kinds
    pools = sorted((e["key"].rsplit("/", 1)[-1], e["message"]) for e in report["errors"] if "/pool/" in e["key"])
    assert pools == [
        ("10.7.0.0-16", "not valid JSON: nested deeper than calico-gc reads"),
        ("10.8.0.0-16", "IP pool cidr None is not a network"),
    ]
    # BGP keys of a name with no Calico host: an IPAM-only (here BGP-only) host, planned as such.
    ghost = hosts_by_name(report)["ghost-host"]
    assert (ghost["action"], ghost["reason"]) == ("would_delete", "no_calico_node")
    assert [c["key"] for c in ghost["changes"]] == [
        "/calico/bgp/v1/host/ghost-host/ip_addr_v4",
        "/calico/bgp/v1/host/ghost-host/",
    ]
    assert hosts_by_name(report)[ORPHAN]["reason"] == "no_k8s_orchref", "unreadable refs: no link, no action"


def test_unset_datastore_type_with_only_v2_data_is_a_clear_error(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seeded(harness)
    env = {
        "ETCD_ENDPOINTS": harness.etcd.url,
        "KUBECONFIG": str(harness.kubeapi.write_kubeconfig(tmp_path / "k")),
        "CALICO_GC_LOCK": "none",
        "CALICO_GC_STATE_FILE": str(tmp_path / "s.json"),
        "CALICO_GC_OUTPUT": "json",
    }
    assert main([], env) == 2
    report = json.loads(capsys.readouterr().out)
    assert "DATASTORE_TYPE=etcdv2" in report["errors"][0]["message"]
    assert main([], {**env, "DATASTORE_TYPE": "etcdv2"}) == 0
    capsys.readouterr()


def test_the_v2_layout_maps_onto_the_shared_model() -> None:
    seed, _ = kops_18_cluster()
    items = (StoredItem(k, 7, v) for k, (v, _) in seed.keys.items())
    inventory = build_inventory(items, ClusterInfo("g", True))
    host = next(h for h in inventory.hosts if h.name == ORPHAN)
    assert (host.k8s_node, host.ipv4, host.tunnel_ips, host.felix_alive) == (
        ORPHAN,
        "10.0.2.20",
        ("100.96.20.1",),
        False,
    )
    assert sorted(ip for e in host.workload_endpoints for ip in e.ips) == ["100.96.0.40", "100.96.20.5"]
    assert any(k.key.endswith("/peer_v4/10.0.0.250") for k in host.owned)
    backlog = next(h for h in inventory.hosts if h.name == BACKLOG[0])
    assert backlog.k8s_node is None
    live = next(h for h in inventory.hosts if h.name == LIVE[0])
    assert live.felix_alive


@pytest.mark.slow  # a run or two per seed: about 10 s a test
@pytest.mark.parametrize("seed", range(14, 26))  # without the fix to _endpoint 16, 17, 22 fail; to bare_ip 9 of them
def test_a_value_of_any_shape_anywhere_is_said_never_a_crash(harness: Harness, seed: int) -> None:
    """Calico 2.x's keys as a script or an old tool may have left them: in every value of the
    kops 1.8 fixture one value, drawn at random, is replaced by one of another shape (a JSON
    value's leaf; a plain value, such as a host's address, whole), as on etcd v3
    (test_boundaries.py). Every run, dry or applying, ends in a decision, never in `unexpected`.
    Found this way: an endpoint whose `ipv4_nets` is no list, and a host address with a NUL or a
    prefix in digits other than ASCII's (bare_ip). 150 seeds pass with the fixes."""
    rng = random.Random(seed)
    cluster, k8s = kops_18_cluster()
    changed = []
    for key, (text, ttl) in sorted(cluster.keys.items()):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if replace_one(value, rng):
            text = json.dumps(value)
        else:  # a plain value (or an empty container), replaced whole
            odd = rng.choice(ODD_VALUES)
            text = odd if isinstance(odd, str) else json.dumps(odd)
        changed.append((key, text[:60]))
        cluster.keys[key] = (text, ttl)
    cluster.load(harness.etcd.url)
    for name, ip in k8s:
        harness.kubeapi.add_node(name, ip)
    for apply in (False, True):
        report, code = harness.run(v2(harness, apply=apply, max_orphan_fraction=1.0))  # type: ignore[arg-type]
        assert [e for e in report["errors"] if e["kind"] == "unexpected"] == [], changed
        assert code != 1, changed

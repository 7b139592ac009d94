"""Grace state you can trust (issue 8, point 5): damage is reported and costs only what it
touches; a state that cannot be saved fails an apply run; the ConfigMap store builds on its
own writes."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from job.adapters.kube import Kube, api_client
from job.adapters.state import ConfigMapStateStore, decode, encode
from job.flows.run import run
from tests.conftest import Harness, hosts_by_name
from tests.support import scenario as s
from tests.support.odd_values import replace_one

CONFIGMAPS = "/api/v1/namespaces/calico-gc/configmaps"
GRACE = {"grace_period": timedelta(minutes=30), "conflict_grace_period": timedelta(minutes=30)}


def grace_errors(report: dict[str, object]) -> list[str]:
    return [e["message"] for e in report["errors"] if e["kind"] == "grace_state"]  # type: ignore[attr-defined,index]


@pytest.mark.parametrize("text", ["{not json", "[" * 100_000 + "]" * 100_000])
def test_a_corrupt_state_file_is_reported_and_every_wait_restarts(harness: Harness, text: str) -> None:
    """Also a file nested past Python's limit: json's RecursionError ended the run in
    `unexpected` (exit 1)."""
    harness.seed(s.kops_cluster())
    state = harness.tmp / "state.json"
    state.write_text(text)
    report, code = harness.run(harness.config(apply=True, **GRACE))
    assert code == 0 and report["summary"]["deleted"] == 0 and report["summary"]["waiting_grace"] == 2
    (message,) = grace_errors(report)
    assert str(state) in message and "every wait restarts" in message
    assert json.loads(state.read_text())["orphans"], "the state is written anew"


def test_one_bad_entry_costs_only_its_own_sighting(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    long_ago = (harness.now - timedelta(hours=2)).isoformat()
    orphans = {s.POD_ORPHAN: long_ago, s.CONFLICT_ORPHAN: "yesterday-ish"}
    (harness.tmp / "state.json").write_text(json.dumps({"schema": 1, "orphans": orphans}))
    report, code = harness.run(harness.config(apply=True, **GRACE))
    hosts = hosts_by_name(report)
    assert code == 0 and hosts[s.POD_ORPHAN]["action"] == "deleted"
    assert hosts[s.CONFLICT_ORPHAN]["action"] == "waiting_grace"
    (message,) = grace_errors(report)
    assert s.CONFLICT_ORPHAN in message and "'yesterday-ish'" in message


def test_a_state_edited_into_any_shape_loses_only_what_it_touched() -> None:
    """The state is a ConfigMap anyone with access may edit: one to three values anywhere in it
    replaced by values of another shape (support.odd_values), 2,000 documents. Reading it never
    fails; each sighting kept is one the edit left as it was, and each one lost is said."""
    seen = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)
    names = [f"host-{n}" for n in range(4)]
    original = json.loads(encode({name: seen + timedelta(minutes=n) for n, name in enumerate(names)}))
    for seed in range(2000):
        rng, document = random.Random(seed), json.loads(json.dumps(original))
        changed = [replace_one(document, rng) for _ in range(rng.randint(1, 3))]
        loaded = decode(json.dumps(document), "state")
        orphans = document.get("orphans") if isinstance(document, dict) else None
        for name, since in loaded.sightings.items():
            assert since == seen + timedelta(minutes=names.index(name)), changed
        lost = len(orphans) - len(loaded.sightings) if isinstance(orphans, dict) else len(names)
        assert lost == 0 or loaded.problems, changed


def test_a_timestamp_without_a_time_zone_is_read_as_utc(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    naive = (harness.now - timedelta(hours=2)).replace(tzinfo=None).isoformat()
    orphans = {s.POD_ORPHAN: naive, s.CONFLICT_ORPHAN: naive}
    (harness.tmp / "state.json").write_text(json.dumps({"schema": 1, "orphans": orphans}))
    report, code = harness.run(harness.config(apply=True, **GRACE))
    assert code == 0 and report["summary"]["deleted"] == 2 and grace_errors(report) == []


@pytest.mark.parametrize("apply", [False, True], ids=["dry-run", "apply"])
def test_a_state_path_that_cannot_be_used_is_a_clear_error(harness: Harness, apply: bool) -> None:
    harness.seed(s.kops_cluster())
    directory = harness.tmp / "state-dir"
    directory.mkdir()
    report, code = harness.run(harness.config(apply=apply, state_file=directory, **GRACE))
    messages = grace_errors(report)
    assert any(f"cannot read the state file {directory}" in m for m in messages)
    assert any(f"cannot write the state file {directory}" in m for m in messages)
    assert not [e for e in report["errors"] if e["kind"] == "unexpected"]
    # An apply run that cannot remember sightings can never delete: it fails, so alerts fire.
    assert (code, report["outcome"]) == ((1, "error") if apply else (0, "ok"))


def test_the_configmap_store_builds_on_its_own_write(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    config = harness.config(apply=True, keep_reports=0)  # grace 0: one save before deleting, one after
    store = ConfigMapStateStore(Kube(api_client(config), harness.retry), "calico-gc", "calico-gc-state")
    report, code = harness.run(config, state=store)
    assert code == 0 and report["summary"]["deleted"] == 2 and grace_errors(report) == []
    assert harness.kubeapi.count("POST", f"^{CONFIGMAPS}$") == 1, "created once"
    assert harness.kubeapi.count("PUT", f"^{CONFIGMAPS}/calico-gc-state$") == 1, "then replaced with no 409"


# Answers to the state ConfigMap's GET that are no ConfigMap (a proxy's), with the field named.
NOT_A_CONFIGMAP = [
    ({"kind": "ConfigMap", "metadata": {"name": "calico-gc-state", "resourceVersion": "5"}, "data": ["x"]}, "`$.data`"),
    (
        {
            "kind": "ConfigMap",
            "metadata": {"name": "calico-gc-state", "resourceVersion": "5"},
            "data": {"state.json": 5},
        },
        "`$.data[...]`",
    ),
    ({"kind": "ConfigMap", "metadata": {"name": "calico-gc-state"}, "data": {}}, "`resourceVersion`"),
    ({"kind": "ConfigMap", "metadata": [], "data": {}}, "`$.metadata`"),
]


@pytest.mark.parametrize(("answer", "field"), NOT_A_CONFIGMAP)
def test_a_state_configmap_that_is_no_configmap_is_reported_and_every_wait_restarts(
    harness: Harness, answer: dict[str, Any], field: str
) -> None:
    """The state ConfigMap answered in a shape calico-gc cannot read: a `grace_state` line naming
    the field, and every wait restarts, as for a state that is not JSON. Each was a traceback
    (`unexpected`, exit 1): `data` not an object, a value that is not text, no resourceVersion to
    write back, `metadata` not an object."""
    harness.seed(s.kops_cluster())
    config = harness.config(apply=True, keep_reports=0, **GRACE)
    store = ConfigMapStateStore(Kube(api_client(config), harness.retry), "calico-gc", "calico-gc-state")
    harness.kubeapi.fail("GET", f"^{CONFIGMAPS}/calico-gc-state$", 200, body=answer)
    report, code = harness.run(config, state=store)
    assert code == 0 and report["summary"]["waiting_grace"] == 2 and report["summary"]["deleted"] == 0
    [message] = grace_errors(report)
    assert "every wait restarts" in message and "the answer is not a ConfigMap" in message
    assert field in message, message


def test_a_state_write_answered_with_no_configmap_fails_the_save_in_one_line(harness: Harness) -> None:
    """The state ConfigMap's create answered with something that is no ConfigMap (a proxy's): the
    next write could not build on it (no resourceVersion), so the save fails in one line, as any
    save that fails. It was a KeyError (`unexpected`) at the next save."""
    harness.seed(s.kops_cluster())
    config = harness.config(apply=True, keep_reports=0)
    store = ConfigMapStateStore(Kube(api_client(config), harness.retry), "calico-gc", "calico-gc-state")
    harness.kubeapi.fail("POST", f"^{CONFIGMAPS}$", 201, body={"kind": "ConfigMap", "metadata": {"name": "x"}})
    report, code = harness.run(config, state=store)
    assert not [e for e in report["errors"] if e["kind"] == "unexpected"], report["errors"]
    [message] = grace_errors(report)
    assert "the answer is not a ConfigMap" in message and "`resourceVersion`" in message, message
    assert (code, report["outcome"]) == (1, "error"), "an apply run that cannot save its state fails"


@pytest.mark.parametrize(
    ("denied", "overrides", "flag"),
    [
        (
            ("update", "configmaps", "my-state"),
            {"state_file": None, "state_configmap": "my-state"},
            "--state-configmap",
        ),
        (("update", "leases", "my-lock"), {"lock_name": "my-lock"}, "--lock-name"),
        (("update", "configmaps", "my-reports-0-0"), {"report_configmaps": "my-reports"}, "--report-configmaps"),
    ],
)
def test_a_name_rbac_does_not_grant_is_refused_before_anything_is_written(
    harness: Harness, denied: tuple[str, str, str], overrides: dict[str, object], flag: str
) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.denied.add(denied)
    before = harness.dump()
    config = harness.config(apply=True, **overrides)
    report, code = run(config, harness.dependencies(config, lock=True))
    (error,) = report["errors"]
    assert code == 2 and error["kind"] == "config" and flag in error["message"]
    assert harness.dump() == before
    assert harness.kubeapi.count("POST", "^/api/v1/namespaces/calico-gc/configmaps$") == 0


def sightings(harness: Any) -> set[str]:
    return set(json.loads((harness.tmp / "state.json").read_text())["orphans"])


def test_a_repaired_handle_leaves_the_grace_state(harness: Any) -> None:
    """A sighting goes once its object is repaired: the state lists only what is still waiting."""
    from tests.flows.test_audit import HOSTS_ASIDE, over_counted

    key, _ = over_counted(harness)
    config = harness.config(apply=True, exclude=HOSTS_ASIDE)
    harness.run(config)
    handle = key.rsplit("/", 1)[1]
    assert any(s.startswith(f"handle:{handle}@") for s in sightings(harness))
    harness.now += timedelta(minutes=10)
    report, _ = harness.run(config)
    assert report["audit"]["stale_handles"]["repaired"] == 1
    assert not any(s.startswith("handle:") for s in sightings(harness)), sightings(harness)


def test_a_released_leak_leaves_the_grace_state(harness: Any) -> None:
    from tests.flows.test_leaks import RELEASE, WEB0_IP, leak_web0

    leak_web0(harness)
    config = harness.config(apply=True, **RELEASE)
    harness.run(config)
    assert any(s.startswith(f"leak:{WEB0_IP}@") for s in sightings(harness))
    harness.now += timedelta(minutes=16)
    report, _ = harness.run(config)
    assert report["audit"]["leaked_ips"]["released"] == 1
    assert not any(s.startswith("leak:") for s in sightings(harness)), sightings(harness)

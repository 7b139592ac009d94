"""Kept reports: the runs that changed the datastore, in a bounded ring of ConfigMaps; listed,
shown and restored from through the command line."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from job.adapters.keep import MAX_PARTS, PART_BYTES, KeepError, ReportKeeper, all_names, part_name
from job.adapters.kube import Kube, KubeError, api_client
from job.cli import main
from tests.conftest import Harness, no_sleep_retry
from tests.flows.test_cli import environment
from tests.support import calico
from tests.support import scenario as s
from tests.support.kubeapi import MAX_CONFIGMAP_BYTES, KubeApiServer

NAMESPACE = "calico-gc"
ROOT = Path(__file__).resolve().parents[2]


def keeper(harness: Harness, slots: int = 3) -> ReportKeeper:
    config = harness.config()
    return ReportKeeper(Kube(api_client(config), no_sleep_retry()), NAMESPACE, slots)


def document(run_id: str, started: str, payload: str = "") -> dict[str, Any]:
    return {
        "schema": "calico-gc/report/v1",
        "run_id": run_id,
        "started_at": started,
        "mode": "apply",
        "outcome": "ok",
        "summary": {"deleted": 1},
        "hosts": [{"name": "gone", "changes": [{"key": "k", "before": payload}]}],
    }


def noise(size: int) -> str:
    """Text gzip cannot shrink much: what many distinct before-values look like to it."""
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()


def stored_bytes(kubeapi: KubeApiServer, name: str) -> int:
    obj = kubeapi.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps", name)
    return sum(len(base64.b64decode(v)) for v in ((obj or {}).get("binaryData") or {}).values())


def test_the_oldest_kept_report_makes_room_and_the_list_is_newest_first(harness: Harness) -> None:
    store = keeper(harness, slots=2)
    for number in range(3):
        store.keep(document(f"run{number}", f"2026-11-30T1{number}:00:00Z"))
    assert [k["run-id"] for k in store.list()] == ["run2", "run1"]
    assert store.fetch("run1")["run_id"] == "run1" and store.fetch("latest")["run_id"] == "run2"
    with pytest.raises(KeepError, match=r"no kept report of run 'run0' .*kept: run2, run1") as refused:
        store.fetch("run0")
    assert refused.value.kind == "config"
    names = set(harness.kubeapi.objects[f"/api/v1/namespaces/{NAMESPACE}/configmaps"])
    assert names == {part_name(0, 0), part_name(1, 0)}  # two slots, nothing else ever created


def test_a_report_larger_than_a_configmap_is_split_and_read_back_whole(harness: Harness) -> None:
    store = keeper(harness)
    big = document("big", "2026-11-30T10:00:00Z", noise(3 * PART_BYTES))  # gzip: about 2.3 parts
    assert store.keep(big) == f"{NAMESPACE}/{part_name(0, 0)}"
    sizes = [stored_bytes(harness.kubeapi, part_name(0, part)) for part in range(MAX_PARTS)]
    assert sizes[0] == sizes[1] == PART_BYTES and 0 < sizes[2] < PART_BYTES and sizes[3] == 0
    assert store.fetch("big") == big
    # The guard the split answers to: the API server refuses a ConfigMap over 1 MiB.
    kube = Kube(api_client(harness.config()), no_sleep_retry())
    too_big = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one-piece", "namespace": NAMESPACE}}
    too_big["binaryData"] = {"x": base64.b64encode(os.urandom(MAX_CONFIGMAP_BYTES + 1)).decode()}
    with pytest.raises(KubeError) as refused:
        kube.write_config_map(NAMESPACE, too_big)
    assert refused.value.status == 422


def test_a_part_whose_answer_was_lost_is_written_once_and_the_report_kept(harness: Harness) -> None:
    """The create of a part, then the update of another, are carried out and their answers lost:
    each retry conflicts with its own first try (409), which is the write done, not a race lost."""
    store = keeper(harness)
    store.keep(document("first", "2026-11-30T10:00:00Z"))
    configmaps = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    harness.kubeapi.lose("POST", f"^{configmaps}$")  # the second slot's first part
    harness.kubeapi.lose("PUT", f"^{configmaps}/{part_name(0, 0)}$")  # the first slot, reused
    big = document("second", "2026-11-30T11:00:00Z", noise(PART_BYTES))
    assert store.keep(big) == f"{NAMESPACE}/{part_name(1, 0)}"
    third = document("third", "2026-11-30T12:00:00Z")
    with_slots = keeper(harness, slots=2)
    assert with_slots.keep(third) == f"{NAMESPACE}/{part_name(0, 0)}"
    assert [loss.times for loss in harness.kubeapi.losses] == [0, 0], "both answers were lost"
    assert store.fetch("second") == big and store.fetch("third") == third


def test_a_smaller_report_in_a_reused_slot_empties_the_parts_it_does_not_need(harness: Harness) -> None:
    store = keeper(harness, slots=1)
    store.keep(document("big", "2026-11-30T10:00:00Z", noise(3 * PART_BYTES)))
    store.keep(document("small", "2026-11-30T11:00:00Z"))
    assert [stored_bytes(harness.kubeapi, part_name(0, part)) > 0 for part in range(3)] == [True, False, False]
    assert store.fetch("small")["run_id"] == "small"


def test_a_report_too_large_to_keep_is_refused_and_nothing_is_half_written(harness: Harness) -> None:
    store = keeper(harness)
    with pytest.raises(KeepError, match=r"MiB compressed, more than the 4 ConfigMaps .* lower --max-deletions"):
        store.keep(document("huge", "2026-11-30T10:00:00Z", noise(6 * PART_BYTES)))
    assert not harness.kubeapi.objects.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps")


def test_parts_of_two_runs_are_never_mixed(harness: Harness) -> None:
    store = keeper(harness, slots=1)
    store.keep(document("first", "2026-11-30T10:00:00Z", noise(2 * PART_BYTES)))
    collection = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    part = harness.kubeapi.get(collection, part_name(0, 1))
    assert part is not None
    part["metadata"]["annotations"]["calico-gc/run-id"] = "second"  # a later run died while writing its parts
    harness.kubeapi.put(collection, part)
    with pytest.raises(KeepError, match="incomplete: calico-gc-report-0-1 holds another report"):
        store.fetch("first")


def test_a_runs_final_report_replaces_the_one_kept_before_its_writes_and_the_two_never_mix(
    harness: Harness,
) -> None:
    store = keeper(harness, slots=2)
    store.keep(document("older", "2026-11-30T09:00:00Z"))
    started = "2026-11-30T10:00:00Z"
    before_writes = {**document("run", started, noise(2 * PART_BYTES)), "outcome": "unfinished"}
    assert store.keep(before_writes) == f"{NAMESPACE}/{part_name(1, 0)}"
    collection = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    head = harness.kubeapi.get(collection, part_name(1, 0))
    final = {**document("run", started, noise(2 * PART_BYTES)), "finished_at": "2026-11-30T10:01:00Z"}
    # Its own slot, though another holds an older report.
    assert store.keep(final) == f"{NAMESPACE}/{part_name(1, 0)}"
    assert [k["run-id"] for k in store.list()] == ["run", "older"] and store.fetch("run") == final
    # Killed before it wrote part 0 again: part 0 says the first report, the others the final one.
    replaced = harness.kubeapi.get(collection, part_name(1, 0))
    assert head is not None and replaced is not None
    head["metadata"]["resourceVersion"] = replaced["metadata"]["resourceVersion"]
    harness.kubeapi.put(collection, head)
    with pytest.raises(KeepError, match="incomplete: calico-gc-report-1-1 holds another report"):
        store.fetch("run")


@pytest.mark.parametrize(
    ("parts", "said"),
    [
        ("two", "says it has 'two' parts, not 1 to 4"),
        ("\u00b2", "says it has '\u00b2' parts, not 1 to 4"),
        ("-1", "says it has '-1' parts, not 1 to 4"),
        ("0", "says it has '0' parts, not 1 to 4"),
        ("99", "says it has '99' parts, not 1 to 4"),
        # More digits than int() converts (4,300): refused, said in 40 characters, not 5,000
        ("1" * 5000, "says it has '" + "1" * 39 + " parts, not 1 to 4"),
        ("", "cannot be read"),  # no count is one part: the report read is not whole
    ],
)
def test_a_kept_reports_part_count_edited_into_anything_is_refused_in_one_line(
    harness: Harness, parts: str, said: str
) -> None:
    """The head ConfigMap says how many parts the report has (`calico-gc/parts`); anyone with
    access may edit it. A count that is no whole number, or names parts that are not there, is a
    KeepError naming the run, never a crash; one that undercounts reads a report that is not whole,
    which is refused as such."""
    store = keeper(harness, slots=1)
    store.keep(document("first", "2026-11-30T10:00:00Z", noise(2 * PART_BYTES)))
    collection = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    head = harness.kubeapi.get(collection, part_name(0, 0))
    assert head is not None
    head["metadata"]["annotations"]["calico-gc/parts"] = parts
    harness.kubeapi.put(collection, head)
    with pytest.raises(KeepError, match=f"kept report of run first {re.escape(said)}"):
        store.fetch("first")


def test_only_runs_that_changed_the_datastore_are_kept(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    dry, _ = harness.run()
    assert "kept_as" not in dry
    applied, _ = harness.run(harness.config(apply=True))
    assert applied["kept_as"] == f"{NAMESPACE}/{part_name(0, 0)}"
    nothing_left, _ = harness.run(harness.config(apply=True))
    assert nothing_left["summary"]["deleted"] == 0 and "kept_as" not in nothing_left
    off, _ = harness.run(harness.config(apply=True, keep_reports=0))
    assert "kept_as" not in off


def test_a_report_that_cannot_be_kept_is_an_error_but_the_run_stands(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.fail("PUT", "/configmaps/calico-gc-report-", 403, times=100)
    harness.kubeapi.fail("POST", f"/namespaces/{NAMESPACE}/configmaps$", 403, times=100)
    report, code = harness.run(harness.config(apply=True, state_file=None, lock="none"))
    assert code != 0 or report["summary"]["deleted"] == 2
    assert report["summary"]["deleted"] == 2
    kept = [e for e in report["errors"] if e["kind"] == "report_keep"]
    # Neither the report kept before the writes nor the final one: each said, and the run went on.
    assert [e["message"].split(":")[0] for e in kept] == [
        "the report was not kept in the cluster before the writes",
        "the report was not kept in the cluster",
    ]
    assert "kept_as" not in report


def test_a_run_that_wrote_nothing_after_all_still_replaces_the_report_it_kept_before_its_writes(
    harness: Harness,
) -> None:
    """The orphan's Node is back when the run checks again before deleting: it writes nothing,
    and the report it kept before (every planned write in doubt) must not outlive it."""
    harness.seed(s.kops_cluster())
    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", lambda: harness.kubeapi.add_node(s.POD_ORPHAN))
    report, code = harness.run(harness.config(apply=True, exclude=(s.CONFLICT_ORPHAN,)))
    [host] = [h for h in report["hosts"] if h["name"] == s.POD_ORPHAN]
    assert code == 0 and (host["action"], host["reason"], host["changes"]) == ("skipped", "k8s_node_recreated", [])
    kept = keeper(harness).list()
    assert [(k["run-id"], k["outcome"]) for k in kept] == [(report["run_id"], "ok")]


def test_the_role_grants_exactly_the_kept_report_names() -> None:
    documents = list(yaml.safe_load_all((ROOT / "manifests/base/rbac.yaml").read_text()))
    role = next(d for d in documents if d["kind"] == "Role")
    granted = next(r for r in role["rules"] if "calico-gc-report-0-0" in (r.get("resourceNames") or []))
    assert granted["resources"] == ["configmaps"] and sorted(granted["verbs"]) == ["get", "update"]
    assert sorted(granted["resourceNames"]) == sorted(all_names())


def test_list_show_and_restore_from_the_command_line(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness.seed(s.kops_cluster())
    before = calico.semantic({k: v for k, (v, _) in harness.dump().items()})
    env = environment(harness, tmp_path, CALICO_GC_OUTPUT="text", CALICO_GC_GRACE_PERIOD="0s")
    common = ["--state-file", str(tmp_path / "state.json"), "--lock", "none"]
    assert main([*common, "--apply"], env) == 0
    run_id = capsys.readouterr().out.split("run ", 1)[1].split(",", 1)[0]
    assert main(["reports"], env) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split() == ["RUN", "STARTED", "KIND", "OUTCOME", "SUMMARY"]
    assert listing[1].startswith(f"{run_id}  ") and " run " in listing[1] and "deleted=2" in listing[1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", listing[1].split()[1]), "to the second"
    assert main(["reports", "show", run_id, "--output", "json"], env) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["run_id"] == run_id and shown["summary"]["deleted"] == 2
    assert main(["reports", "show", "nosuchrun"], env) == 2
    assert "no kept report of run 'nosuchrun'" in capsys.readouterr().err
    harness.kubeapi.delete_node(s.NEW_NODE)  # else the orphan that held its address is refused
    # CALICO_GC_APPLY does not make a restore write: only its own --apply does.
    assert main(["restore", run_id, *common], {**env, "CALICO_GC_APPLY": "true"}) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"restore dry-run ok (exit 0) of run {run_id}") and "would_restore" in text
    assert main(["restore", "latest", "--apply", *common], env) == 0
    assert "restored" in capsys.readouterr().out
    assert calico.semantic({k: v for k, (v, _) in harness.dump().items()}) == before
    assert main(["reports", "--output", "json"], env) == 0
    kinds = [k["schema"] for k in json.loads(capsys.readouterr().out)]
    assert kinds == ["calico-gc/restore/v1", "calico-gc/report/v1"]
    assert main(["restore"], env) == 2
    assert "give a RUN_ID" in capsys.readouterr().err


def test_a_report_kept_before_reports_listed_warnings_is_summarised(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A version before `kubernetes.warnings` kept its reports without it: `reports show` still
    summarises them, as it does every report of this schema."""
    harness.seed(s.kops_cluster())
    applied, _ = harness.run(harness.config(apply=True))
    older = {**applied, "run_id": "olderrun", "kubernetes": {"node_count": applied["kubernetes"]["node_count"]}}
    keeper(harness, slots=10).keep(older)
    env = environment(harness, tmp_path, CALICO_GC_OUTPUT="text")
    assert main(["reports", "show", "olderrun"], env) == 0
    assert capsys.readouterr().out.startswith("apply ok (exit 0)")


def test_a_kept_report_this_version_cannot_summarise_is_said_in_one_line(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another version's kept report, or one edited: its summary is refused in one line (before,
    a traceback), and `--output json` shows it whole, as kept."""
    env = environment(harness, tmp_path, CALICO_GC_OUTPUT="text")
    odd = {"schema": "calico-gc/report/v1", "run_id": "oddrun", "summary": {"deleted": "two"}, "hosts": [{"name": 5}]}
    keeper(harness, slots=10).keep(odd)
    assert main(["reports", "show", "oddrun"], env) == 1
    err = capsys.readouterr().err
    assert err.startswith("calico-gc: error: the kept report of run oddrun is not one this version can summarise")
    assert len(err.splitlines()) == 1
    assert main(["reports", "show", "oddrun", "--output", "json"], env) == 0
    assert json.loads(capsys.readouterr().out)["hosts"] == [{"name": 5}]


def test_a_kept_report_configmap_that_is_no_configmap_is_one_line(harness: Harness) -> None:
    """A kept report's ConfigMap answered with annotations that are no map (a proxy's): the report
    is not kept, said in one `report_keep` line naming the field, and the run's result stands. It
    was a traceback that escaped the run."""
    harness.seed(s.kops_cluster())
    broken = {"kind": "ConfigMap", "metadata": {"name": part_name(0, 0), "resourceVersion": "5", "annotations": ["x"]}}
    harness.kubeapi.fail(
        "GET", f"^/api/v1/namespaces/{NAMESPACE}/configmaps/{part_name(0, 0)}$", 200, body=broken, times=5
    )
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2
    assert {e["kind"] for e in report["errors"]} == {"report_keep"}
    assert all("the answer is not a ConfigMap" in e["message"] for e in report["errors"])
    assert all("`$.metadata.annotations`" in e["message"] for e in report["errors"]), report["errors"]

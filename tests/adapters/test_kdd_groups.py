"""Which of Calico's two API groups the job reads and writes, chosen as Calico chooses it
(libcalico-go/lib/backend/k8s/discovery.go): CALICO_API_GROUP, else discovery. Both groups at
once (the aggregated API server's view), a migration between them, and every way the choice
can be wrong: each a one-line error naming the group and the setting, exit 2, nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from tests.adapters.test_kdd import GONE, kdd, seed_kdd, snapshot
from tests.conftest import Harness, hosts_by_name
from tests.support import crds
from tests.support.groups import V1, V3, Group
from tests.support.kubeapi import KubeApiServer

pytestmark = pytest.mark.skipif(not crds.available(), reason="Calico's CRDs are not beside the checkout (../shared)")
# The DatastoreMigration CRD is not among the CRD files at hand: a schema of our own that keeps
# what is sent (Calico's type: api/pkg/apis/projectcalico/v3/datastoremigration.go).
MIGRATION_CRD = crds.Crd(
    "projectcalico.org",
    "v3",
    "datastoremigrations",
    "DatastoreMigration",
    False,
    True,
    {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
)


def install(kubeapi: KubeApiServer, *groups: Group) -> None:
    kubeapi.install(*crds.calico(*(g.crd_file for g in groups)))


def test_both_groups_served_means_v1_as_calico_reads_it_unless_calico_api_group_says_v3(harness: Harness) -> None:
    """With both groups served, projectcalico.org/v3 is the aggregated API server over v1 storage:
    Calico's components use v1. Seeded in v1 only here; CALICO_API_GROUP=v3 then finds no data."""
    install(harness.kubeapi, V1, V3)
    seed_kdd(harness.kubeapi, V1)
    report, code = harness.run(kdd(harness))
    assert code == 0 and report["datastore"]["api_group"] == V1.api_version
    assert hosts_by_name(report)[GONE]["action"] == "would_delete"
    told, code = harness.run(kdd(harness, calico_api_group=V3.api_version))
    assert code == 0 and (told["datastore"]["api_group"], told["datastore"]["api_group_from"]) == (
        V3.api_version,
        "CALICO_API_GROUP",
    )
    assert told["hosts"] == []


def only_error(report: dict[str, Any]) -> str:
    (error,) = report["errors"]
    assert "\n" not in error["message"]
    return str(error["message"])


@pytest.mark.parametrize(
    ("served", "setting", "said"),
    [
        ((), "", "serves neither crd.projectcalico.org/v1 nor projectcalico.org/v3"),
        ((V1,), V3.api_version, "CALICO_API_GROUP is projectcalico.org/v3, but the API server at"),
        ((V3,), V1.api_version, "CALICO_API_GROUP is crd.projectcalico.org/v1, but the API server at"),
    ],
    ids=["neither", "v3-named-not-served", "v1-named-not-served"],
)
def test_a_group_that_is_not_served_is_named_with_its_setting(
    harness: Harness, served: tuple[Group, ...], setting: str, said: str
) -> None:
    install(harness.kubeapi, *served)
    if not served:
        harness.kubeapi.uninstalled_groups.update({"crd.projectcalico.org", "projectcalico.org"})
    report, code = harness.run(kdd(harness, calico_api_group=setting))
    assert code == 2 and report["errors"][0]["kind"] == "datastore_type"
    message = only_error(report)
    assert said in message and ("DATASTORE_TYPE" in message or "CALICO_API_GROUP" in message)
    assert not any(method != "GET" for method, _ in harness.kubeapi.requests if "projectcalico" in _)


def test_a_group_served_without_some_of_calicos_kinds_is_named(harness: Harness) -> None:
    harness.kubeapi.install(*(c for c in crds.calico(V3.crd_file) if c.plural != "ipamhandles"))
    report, code = harness.run(kdd(harness))
    assert code == 2
    message = only_error(report)
    assert "projectcalico.org/v3 (chosen by discovery) without its ipamhandles" in message
    assert "CALICO_API_GROUP" in message


@pytest.mark.parametrize("group", [V1, V3], ids=["v1", "v3"])
def test_rbac_refusing_the_chosen_group_is_named(harness: Harness, group: Group) -> None:
    install(harness.kubeapi, group)
    seed_kdd(harness.kubeapi, group)
    harness.kubeapi.fail("GET", f"^{group.path}/blockaffinities$", 403, times=10)
    before = snapshot(harness.kubeapi, group)
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 2 and report["errors"][0]["kind"] == "unauthorized"
    message = only_error(report)
    assert f"{group.path}/blockaffinities" in message and "manifests/kdd" in message
    assert snapshot(harness.kubeapi, group) == before


@pytest.mark.parametrize(
    ("phase", "code"), [("Migrating", 3), ("Converged", 3), ("Pending", 3), (None, 3), ("Complete", 0)]
)
def test_a_migration_between_the_groups_writes_to_neither(harness: Harness, phase: str | None, code: int) -> None:
    install(harness.kubeapi, V1, V3)
    harness.kubeapi.install(*harness.kubeapi.crds, MIGRATION_CRD)
    seed_kdd(harness.kubeapi, V1)
    migration: dict[str, Any] = {"metadata": {"name": "v1-to-v3"}, "spec": {"type": "V1ToV3"}}
    if phase:
        migration["status"] = {"phase": phase, "progress": {"total": 40, "migrated": 12}}
    harness.kubeapi.put(f"{V3.path}/datastoremigrations", migration)
    before = snapshot(harness.kubeapi, V1)
    report, exit_code = harness.run(kdd(harness, apply=True))
    assert exit_code == code
    if code == 3:
        (guard,) = report["guards"]
        assert (
            guard["name"] == "datastore_migrating"
            and f"DatastoreMigration v1-to-v3 is {phase or 'not started'}" in (guard["message"])
        )
        assert snapshot(harness.kubeapi, V1) == before
        assert not any(
            method in ("PUT", "POST", "DELETE") and "projectcalico" in path for method, path in harness.kubeapi.requests
        )
    else:
        assert hosts_by_name(report)[GONE]["action"] == "deleted"


def test_a_report_taken_in_one_group_is_not_restored_into_the_other(harness: Harness) -> None:
    install(harness.kubeapi, V1)
    seed_kdd(harness.kubeapi, V1)
    report, code = harness.run(kdd(harness, apply=True))
    assert code == 0 and report["datastore"]["api_group"] == V1.api_version and report["kept_as"]
    install(harness.kubeapi, V3)  # the cluster migrated to projectcalico.org/v3 since
    document, code = harness.restore(kdd(harness, apply=True))
    assert code == 2
    (error,) = document["errors"]
    assert error["message"].startswith(
        f"run {report['run_id']} was taken in crd.projectcalico.org/v1, and Calico's data is now in "
        "projectcalico.org/v3"
    )
    assert not any(method == "POST" and path.startswith(V3.path) for method, path in harness.kubeapi.requests)


def test_a_v1_shaped_affinity_written_into_v3_is_refused_by_the_server(kubeapi: KubeApiServer) -> None:
    """What the job must never send: v1's string `deleted` where v3 wants a boolean."""
    install(kubeapi, V3)
    v1_shaped = {
        "metadata": {"name": "n1-10-0-0-0-26"},
        "spec": {"cidr": "10.0.0.0/26", "node": "n1", "state": "confirmed", "deleted": "false"},
    }
    with pytest.raises(AssertionError, match=r'spec\.deleted in body must be of type boolean: "string"'):
        kubeapi.put(f"{V3.path}/blockaffinities", v1_shaped)
    with pytest.raises(AssertionError, match=r"spec.affinity in body should match '\^\(host\|virtual\)"):
        kubeapi.put(
            f"{V3.path}/ipamblocks",
            {
                "metadata": {"name": "10-0-0-0-26"},
                "spec": {
                    "cidr": "10.0.0.0/26",
                    "affinity": "node:n1",
                    "allocations": [],
                    "unallocated": [],
                    "attributes": [],
                    "strictAffinity": False,
                },
            },
        )

"""The whole run against a real etcd and the Kubernetes API test server."""

from __future__ import annotations

from tests.conftest import Harness, hosts_by_name
from tests.support import scenario as s


def test_dry_run_reports_the_plan_and_changes_nothing(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()
    report, code = harness.run()
    assert code == 0
    assert harness.dump() == before
    hosts = hosts_by_name(report)
    assert hosts[s.CONFLICT_ORPHAN]["action"] == "would_delete"
    assert hosts[s.POD_ORPHAN]["action"] == "would_delete"
    assert hosts[s.UNREFERENCED]["reason"] == "no_k8s_orchref"
    assert report["conflicts"] == [{"ip": "10.0.1.13", "orphan": s.CONFLICT_ORPHAN, "blocks": s.NEW_NODE,
                                    "kind": "orphan_holds_live_node_ip"}]

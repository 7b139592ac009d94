"""IPAM accounting is exact after any crash, conflict or re-plan (issue 8, point 1).

The job runs as a real process behind a relay that counts etcd write transactions. At every
write index it is killed with SIGKILL before the write reaches etcd, or after etcd committed
it but before the answer came back; or the write's compare is made to fail by a concurrent
writer. A resumed run must then leave exactly the keyspace one clean run leaves, with every
block valid and every handle counting exactly what its blocks hold.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from job.model import Action
from tests.conftest import Harness
from tests.support import calico
from tests.support.job_process import job_argv, run_job
from tests.support.scenario import Scenario, cross_borrowing_fleet
from tests.support.write_relay import Action as RelayAction
from tests.support.write_relay import Trigger, WriteRelay


@pytest.fixture
def relay(harness: Harness) -> Iterator[WriteRelay]:
    relay = WriteRelay(harness.etcd.url)
    yield relay
    relay.close()


def values(harness: Harness) -> dict[str, str]:
    return {key: value for key, (value, _) in harness.dump().items()}


def reseed(harness: Harness, scenario: Scenario) -> None:
    calico.wipe(harness.etcd.url)
    calico.load(harness.etcd.url, scenario.seed.keys)


def run_job_process(harness: Harness, relay: WriteRelay, trigger: Trigger | None) -> int:
    argv = job_argv(harness.kubeapi, relay, harness.tmp, "--lock=none")
    finished = run_job(argv, relay, trigger)
    if trigger is not None and trigger.action in ("kill_before", "kill_after"):
        assert finished.code == -signal.SIGKILL
    else:
        assert "Traceback" not in finished.stderr, finished.stderr[-2000:]
    return finished.code


def resume(harness: Harness) -> None:
    report, code = harness.run(harness.config(apply=True, max_orphan_fraction=1.0, max_deletions=100))
    assert code == 0, report["errors"]
    assert all(h["action"] != Action.FAILED for h in report["hosts"])


def clean_reference(harness: Harness, relay: WriteRelay, scenario: Scenario) -> tuple[dict[str, str], int]:
    """The keyspace after one clean, uninterrupted run, and how many writes that run made."""
    reseed(harness, scenario)
    assert run_job_process(harness, relay, None) == 0
    reference, writes = values(harness), relay.writes
    assert calico.ipam_problems(reference) == []
    reseed(harness, scenario)
    resume(harness)  # the in-process flow that resumes below reaches the same end state
    assert values(harness) == reference
    return reference, writes


def check_every_write(harness: Harness, relay: WriteRelay, orphans: int, action: RelayAction) -> None:
    scenario = cross_borrowing_fleet(orphans)
    for name, ip in scenario.k8s_nodes:
        harness.kubeapi.add_node(name, ip)
    reference, writes = clean_reference(harness, relay, scenario)
    assert writes >= 4 * orphans  # blocks with their handles, endpoints and config, the Node
    for index in range(writes):
        reseed(harness, scenario)
        code = run_job_process(harness, relay, Trigger(index, action))
        if action == "conflict":
            assert code == 0, f"a compare conflict at write {index} must be re-planned, not fail the run"
        resume(harness)
        final = values(harness)
        assert calico.ipam_problems(final) == [], f"{action} at write {index}"
        assert final == reference, f"{action} at write {index}: the end state differs from a clean run's"


def test_one_clean_run_leaves_no_handle_counting_a_freed_ip(harness: Harness) -> None:
    """Orphan A's pod IPs lie in orphans B's and C's blocks: B commits its own block, then
    conflicts on the block A changed and is planned again. Every handle still goes."""
    scenario = cross_borrowing_fleet(3)
    harness.seed(scenario)
    report, code = harness.run(harness.config(apply=True, max_orphan_fraction=1.0))
    assert code == 0
    assert {h["name"]: h["action"] for h in report["hosts"]} == {f"gone-{i}": "deleted" for i in range(3)}
    final = values(harness)
    assert calico.ipam_problems(final) == []
    assert not [k for k in final if "gone-" in k]
    live_block = final["/calico/ipam/v2/assignment/ipv4/block/100.64.2.0-26"]  # lends .9 to live-1
    assert '"affinity":null' in live_block and "api-1" in live_block


@pytest.mark.parametrize("action", ["kill_before", "kill_after", "conflict"])
def test_crash_or_conflict_at_every_write_of_two_orphans(
    harness: Harness, relay: WriteRelay, action: RelayAction
) -> None:
    check_every_write(harness, relay, 2, action)


@pytest.mark.slow
@pytest.mark.parametrize("action", ["kill_before", "kill_after", "conflict"])
def test_crash_or_conflict_at_every_write_of_a_fleet(harness: Harness, relay: WriteRelay, action: RelayAction) -> None:
    check_every_write(harness, relay, 6, action)

"""The previous log's digest (`log_digest`): what a crash-looping calico-node's log is held as
until the run ends. The causes decided on it are the causes decided on the whole log. And how
long a Node has been NetworkUnavailable where nothing says since when."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from job.core.health import (
    CONFLICT_LINES,
    EVIDENCE_LINES,
    LOG_LINE_CHARS,
    CalicoNodePod,
    calico_node_findings,
    log_conflicts,
    log_digest,
    network_unavailable,
    unavailable_seconds,
)
from job.core.model import KubeNode, NetworkUnavailable

CONFLICT = "2026-11-30 11:58:01.123 [WARNING][9] startup.go 102: Calico node '{}' is already using the IPv4 address {}."
LINES = st.one_of(
    st.builds(
        CONFLICT.format, st.sampled_from(["old-1", "old-2", "me"]), st.sampled_from(["10.0.1.13", "10.0.1.999", "::1"])
    ),
    st.just("2026-11-30 11:58:01.123 [ERROR][9] startup/utils.go 43: Failed to set NetworkUnavailable; will retry"),
    st.just("W1130 11:58:01 dial tcp 100.64.0.1:443: i/o timeout"),
    st.sampled_from(["[ERROR] bird: socket error", "panic: runtime error", "Fatal: no route", "[INFO] ok", "", "  "]),
    # halves of a match, which the whole text's patterns must not join across a line break
    st.sampled_from(
        [
            "dial tcp 100.64.0.1",
            ":443: i/o timeout",
            "Calico node 'a",
            "b' is already using the IPv4 address 10.0.1.13.",
        ]
    ),
    st.sampled_from(["xerror", "error", "x" * (LOG_LINE_CHARS - 5) + "error", "e" * LOG_LINE_CHARS]),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),  # \r, \x85, \u2028: line breaks too
)


def _decided(log: str) -> tuple[Any, ...]:
    """Everything the diagnosis says of a crash-looping pod with this previous log."""
    pod = CalicoNodePod("kube-system", "calico-node-x", "me", "Running", False, 9, "CrashLoopBackOff", previous_log=log)
    findings, _ = calico_node_findings([pod], [], [], {"old-1"}, 5)
    return findings[0]["cause"], findings[0]["evidence"], findings[0].get("holder"), log_conflicts([pod], 5)


API_TIMEOUT = "dial tcp 100.64.0.1:443: i/o timeout"


@settings(max_examples=400, deadline=None)
@given(st.lists(LINES, max_size=60), st.sampled_from(["\n", "\r\n"]))
# A match across a line break would take one of the five places of the lines that match alone.
@example([API_TIMEOUT] * 5 + ["dial tcp 100.64.0.1", ":443: i/o timeout"], "\n")
@example(["Calico node 'a", "b' is already using the IPv4 address 10.0.1.13."], "\n")
def test_the_causes_decided_on_a_logs_digest_are_those_of_the_whole_log(lines: list[str], end: str) -> None:
    """Lines within LOG_LINE_CHARS, at most CONFLICT_LINES naming a conflict (calico-node exits
    at its first): the cause, its evidence, the holder and every conflict the planner is told of
    are the same. A line that runs on (`st.text` draws \\r and \\u2028) is split as the whole
    log's reading splits it."""
    log = end.join(lines)
    conflicts = sum("is already using" in line for line in log.splitlines())
    if conflicts <= CONFLICT_LINES:
        assert _decided(log_digest(log)) == _decided(log)


def test_a_logs_digest_is_bounded_whatever_the_log() -> None:
    """Held per crash-looping pod for the whole run: at most the lines the causes read, each cut.
    The last conflict (the one calico-node exits on) is still the cause, and lines past
    LOG_LINE_CHARS are cut where the report shows them."""
    noise = ["[ERROR] " + "e" * 5000, "dial tcp 1.2.3.4:443: i/o timeout " + "t" * 5000, "[INFO] " + "i" * 5000]
    log = "\n".join([*noise * 3000, CONFLICT.format("old-1", "10.0.1.13") + "x" * 6000] * 20)
    digest = log_digest(log)
    assert len(digest) <= (CONFLICT_LINES + 3 * EVIDENCE_LINES) * (LOG_LINE_CHARS + 1) < len(log) // 1000
    cause, evidence, holder, conflicts = _decided(digest)
    assert (cause, holder) == ("ip_conflict_orphan", "old-1") and len(evidence[0]) == LOG_LINE_CHARS
    assert [(c.ip, c.orphan) for c in conflicts] == [("10.0.1.13", "old-1")]


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("created", "state", "at_most"),
    [
        ("2026-11-30T11:58:00Z", "transient", 120),  # a kubelet registered it with the taint 2 minutes ago
        ("2026-11-30T11:50:00Z", "stuck", 600),  # the threshold itself: stuck, as a known duration is
        ("2026-11-30T09:00:00Z", "stuck", 10800),
        ("2026-11-30T12:05:00Z", "transient", 0),  # the API server's clock ahead of the job's
        (None, "stuck", None),  # not even the age is known: stuck, as before
        ("yesterday", "stuck", None),
    ],
)
def test_a_taint_that_says_no_time_is_bounded_by_its_nodes_age(created: str | None, state: str, at_most: int) -> None:
    """A taint without timeAdded and no condition: the Node's age is how long at most. A Node
    younger than the threshold cannot have been unavailable that long, so it is not stuck."""
    taint = NetworkUnavailable(since=None, node_created=created)
    (finding,) = network_unavailable([KubeNode("n", (), taint)], NOW, 600.0)
    assert (finding["state"], finding["duration_seconds"]) == (state, None)
    assert finding["duration_at_most_seconds"] == unavailable_seconds(finding) == at_most
    assert finding["node_created"] == created


def test_a_known_time_is_the_duration_whatever_the_nodes_age() -> None:
    condition = NetworkUnavailable(since="2026-11-30T11:59:00Z", condition=True, node_created="2026-11-01T00:00:00Z")
    (finding,) = network_unavailable([KubeNode("n", (), condition)], NOW, 600.0)
    assert (finding["state"], finding["duration_at_most_seconds"]) == ("transient", None)
    assert finding["duration_seconds"] == unavailable_seconds(finding) == 60

"""The report as written: the same JSON text as `json.dumps`, written a piece at a time, with the
before-values a dry run does not hold fetched a batch of hosts at a time, as they are written."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from job.adapters.datastores.base import Datastore
from job.core import report
from job.flows.run import report_befores, run
from tests.conftest import Harness, validate_report
from tests.support import calico
from tests.support import scenario as s

DOCUMENTS: list[dict[str, Any]] = [
    {},
    {"hosts": []},
    {"a": [1, {"b": "two\nlines"}], "e": {}, "hosts": [{"name": "h", "changes": [{"key": "k", "before": "v"}]}]},
]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("indent", [2, 0, None])
def test_the_streamed_report_is_the_json_of_the_document_with_a_host_a_line(
    document: dict[str, Any], indent: int | None
) -> None:
    text = "".join(report.chunks(document, indent=indent))
    assert json.loads(text) == document
    if indent is None:
        assert text == json.dumps(document, separators=(",", ":"))
        return
    without_hosts = {k: v for k, v in document.items() if k != "hosts"}
    lines = text.splitlines()
    for host in document.get("hosts") or []:  # each on its own line, whole
        assert any(line.strip().rstrip(",") == json.dumps(host, separators=(",", ":")) for line in lines)
    if not document.get("hosts"):
        assert text == json.dumps(document, indent=indent, separators=(",", ": "))
    else:
        assert len(lines) == len(json.dumps({**without_hosts, "hosts": [0]}, indent=indent).splitlines())


def _dry_run(harness: Harness) -> tuple[dict[str, Any], Datastore]:
    """A dry run's document as the run returns it, and its datastore, still open."""
    harness.seed(s.kops_cluster())
    config = harness.config()
    deps = harness.dependencies(config)
    document, code = run(config, deps)
    assert code == 0
    return document, deps.datastore


def test_a_dry_run_holds_no_endpoint_values_and_the_report_fetches_them_a_batch_of_hosts_at_a_time(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    document, datastore = _dry_run(harness)
    planned = [h for h in document["hosts"] if h["changes"]]
    held = [c for h in planned for c in h["changes"] if c["before"] is not None]
    assert len(planned) == 2 and not any("workloadendpoints" in c["key"] for c in held), "endpoint values not held"
    fetch = report_befores(datastore)
    asked: list[set[str]] = []

    def counted(wanted: Sequence[tuple[str, int]]) -> Mapping[str, str]:
        asked.append({key for key, _ in wanted})
        return fetch(wanted)

    monkeypatch.setattr(report, "HOSTS_PER_FETCH", 1)
    text = io.StringIO()
    report.write(document, text, counted)
    datastore.close()
    written = json.loads(text.getvalue())
    validate_report(written)
    stored = harness.dump()
    missing = [{c["key"] for c in h["changes"] if c["before"] is None} for h in planned]
    assert asked == [keys for keys in missing if keys], "one fetch per host that misses values, no other"
    for host in written["hosts"]:
        for change in host["changes"]:
            assert (change["before"], change["revision"]) == stored[change["key"]]
    unchanged = all(c["before"] is None for h in planned for c in h["changes"] if "workloadendpoints" in c["key"])
    assert unchanged, "the run's own document is left as it was"


def test_a_key_written_after_the_read_gets_no_before_value_in_the_report(harness: Harness) -> None:
    document, datastore = _dry_run(harness)
    (endpoint, *_) = [c["key"] for h in document["hosts"] for c in h["changes"] if "workloadendpoints" in c["key"]]
    stored = harness.dump()
    calico.load(harness.etcd.url, {endpoint: stored[endpoint][0].replace("eth0", "eth1")})
    text = io.StringIO()
    report.write(document, text, report_befores(datastore))
    datastore.close()
    written = {c["key"]: c for h in json.loads(text.getvalue())["hosts"] for c in h["changes"]}
    assert written[endpoint]["before"] is None, "the value a write at that revision would remove is unknown"
    others = [c for key, c in written.items() if key != endpoint]
    assert others and all(c["before"] == stored[c["key"]][0] for c in others)


def test_a_datastore_gone_before_the_report_is_written_costs_the_values_not_the_report(harness: Harness) -> None:
    document, datastore = _dry_run(harness)
    harness.etcd.stop()
    text = io.StringIO()
    fetch = report_befores(datastore)
    with capture_logs() as logs:
        report.write(document, text, fetch)
        assert fetch([(s.POD_ORPHAN, 1)]) == {}
    datastore.close()
    written = json.loads(text.getvalue())
    validate_report(written)
    events = [entry["event"] for entry in logs]
    assert [e for e in events if e != "retrying"] == ["report_values_unavailable"], "one warning"
    assert events.count("retrying") == harness.retry.attempts - 1, "and no further tries"
    assert written["summary"]["would_delete"] == 2
    assert any(c["before"] is None for h in written["hosts"] for c in h["changes"])

"""The report as written: the same JSON text as `json.dumps`, written a piece at a time, with the
before-values a dry run does not hold (on etcd v3, a gone host's endpoint values past the read's
budget) fetched a batch of hosts at a time, as they are written."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from job.adapters.datastores import etcdv3
from job.adapters.datastores.base import Datastore
from job.adapters.report_file import json_line
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


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),  # any text: lone surrogates, DEL, controls
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(JSON_VALUES)
def test_the_fast_host_encoder_writes_what_json_writes(value: Any) -> None:
    assert json_line(value) == json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("text", ["plain", 'tab\tquote"', "\x7f", "\u00e9", "\udcff", "\U0001f600"])
def test_the_fast_host_encoder_hands_json_the_texts_it_would_write_otherwise(text: str) -> None:
    host = {"name": "h", "changes": [{"key": "k", "revision": 2**64, "before": text, "in_doubt": True}]}
    assert json_line(host) == json.dumps(host, separators=(",", ":"))


def _dry_run(harness: Harness) -> tuple[dict[str, Any], Datastore]:
    """A dry run's document as the run returns it, and its datastore, still open."""
    harness.seed(s.kops_cluster())
    config = harness.config()
    deps = harness.dependencies(config)
    document, code = run(config, deps)
    assert code == 0
    return document, deps.datastore


def _endpoint_changes(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [c for h in document["hosts"] for c in h["changes"] if "workloadendpoints" in c["key"]]


@pytest.fixture
def fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read keeps no gone host's endpoint values (a budget of none): the report fetches them."""
    monkeypatch.setattr(etcdv3, "ORPHAN_VALUE_BYTES", 0)


def _written(document: Mapping[str, Any], befores: report.Befores) -> dict[str, Any]:
    text = io.StringIO()
    report.write(document, text, befores)
    written: dict[str, Any] = json.loads(text.getvalue())
    validate_report(written)
    return written


def test_a_dry_run_holds_its_gone_hosts_endpoint_values_and_the_report_fetches_none(harness: Harness) -> None:
    document, datastore = _dry_run(harness)
    datastore.close()
    stored = harness.dump()
    changes = [c for h in document["hosts"] for c in h["changes"]]
    assert len(_endpoint_changes(document)) == 3, "the pod orphan's three endpoints"
    assert all((c["before"], c["revision"]) == stored[c["key"]] for c in changes), "every value, from the read"

    def refused(wanted: Sequence[tuple[str, int]]) -> Mapping[str, str]:
        raise AssertionError(f"fetched {wanted}")

    assert _written(document, refused)["hosts"] == document["hosts"]


def test_past_its_budget_the_read_keeps_no_further_endpoint_value(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.seed(s.kops_cluster())
    stored = harness.dump()
    named = s.POD_ORPHAN.replace("-", "--")  # as in an endpoint's name
    sizes = sorted(len(stored[key][0]) for key in stored if "workloadendpoints" in key and named in key)
    monkeypatch.setattr(etcdv3, "ORPHAN_VALUE_BYTES", sizes[0] + sizes[1] - 1)  # room for one of three
    document, datastore = _dry_run(harness)
    datastore.close()
    held = [c for c in _endpoint_changes(document) if c["before"] is not None]
    assert len(held) == 1 and held[0]["before"] == stored[held[0]["key"]][0]


def test_a_dry_run_without_the_values_has_the_report_fetch_them_a_batch_of_hosts_at_a_time(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, fetched: None
) -> None:
    document, datastore = _dry_run(harness)
    planned = [h for h in document["hosts"] if h["changes"]]
    assert len(planned) == 2 and all(c["before"] is None for c in _endpoint_changes(document))
    fetch = report_befores(datastore)
    asked: list[set[str]] = []

    def counted(wanted: Sequence[tuple[str, int]]) -> Mapping[str, str]:
        asked.append({key for key, _ in wanted})
        return fetch(wanted)

    monkeypatch.setattr(report, "HOSTS_PER_FETCH", 1)
    written = _written(document, counted)
    datastore.close()
    stored = harness.dump()
    missing = [{c["key"] for c in h["changes"] if c["before"] is None} for h in planned]
    assert asked == [keys for keys in missing if keys], "one fetch per host that misses values, no other"
    for host in written["hosts"]:
        for change in host["changes"]:
            assert (change["before"], change["revision"]) == stored[change["key"]]
    assert all(c["before"] is None for c in _endpoint_changes(document)), "the run's own document is left as it was"


def test_a_key_written_after_the_read_keeps_the_value_a_write_at_its_revision_removes(harness: Harness) -> None:
    document, datastore = _dry_run(harness)
    endpoint = _endpoint_changes(document)[0]
    stored = harness.dump()
    calico.load(harness.etcd.url, {endpoint["key"]: stored[endpoint["key"]][0].replace("eth0", "eth1")})
    written = _written(document, report_befores(datastore))
    datastore.close()
    (kept,) = [c for h in written["hosts"] for c in h["changes"] if c["key"] == endpoint["key"]]
    assert kept["before"] == stored[endpoint["key"]][0] != harness.dump()[endpoint["key"]][0]


def test_a_key_written_after_the_read_gets_no_fetched_before_value(harness: Harness, fetched: None) -> None:
    document, datastore = _dry_run(harness)
    endpoint = _endpoint_changes(document)[0]["key"]
    stored = harness.dump()
    calico.load(harness.etcd.url, {endpoint: stored[endpoint][0].replace("eth0", "eth1")})
    written = {c["key"]: c for h in _written(document, report_befores(datastore))["hosts"] for c in h["changes"]}
    datastore.close()
    assert written[endpoint]["before"] is None, "the value a write at that revision would remove is unknown"
    others = [c for key, c in written.items() if key != endpoint]
    assert others and all(c["before"] == stored[c["key"]][0] for c in others)


def test_a_datastore_gone_before_the_report_is_written_costs_the_values_not_the_report(
    harness: Harness, fetched: None
) -> None:
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

"""The JSON report: the only place that formats a run's outcome for people and machines."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TextIO, TypeVar

from job.config import Config, format_duration
from job.core.model import Action, DataProblem, HostDecision, Plan, Step, Write

SCHEMA_VERSION = "calico-gc/report/v1"
SCHEMA_PATH = Path(__file__).parent.parent / "report.schema.json"  # the report's public contract, at the top
MAX_WARNINGS = 20  # distinct API server warnings a report lists (the schema's `kubernetes.warnings` maxItems)
HOSTS_PER_FETCH = 100  # hosts whose missing before-values are fetched together as the report is written
UNFINISHED = "unfinished"  # the outcome, and each planned host's reason, of the report kept before the writes
UNFINISHED_ERROR = (
    "the run did not finish (killed, or its node lost) before it reported this host: each write listed may have "
    "been done; a restore of this report reads what is there, and the next run finishes the host"
)

T = TypeVar("T")
# Given (key, revision) pairs, the values those keys held at those revisions, where still known.
Befores = Callable[[Sequence[tuple[str, int]]], Mapping[str, str]]
# Hosts held back with no IP conflict (deferred past --max-deletions, or in their grace period): a
# backlog is decided so on every run, thousands of hosts. The readable summary and the logs count
# them by action and reason and name the first HELD_BACK_NAMED; the JSON report lists each one.
HELD_BACK = (str(Action.DEFERRED), str(Action.WAITING_GRACE))
HELD_BACK_NAMED = 20
# A report's host entry as JSON on one line (chunks); an adapter may give a faster encoder that
# writes the same text (report_file.json_line).
Encode = Callable[[Any], str]
compact: Encode = json.JSONEncoder(separators=(",", ":")).encode


def timestamp(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


@dataclass
class RunRecord:
    """What a run learnt along the way, filled in as it goes and rendered at the end."""

    run_id: str
    started_at: datetime
    config: Config
    datastore: dict[str, Any] = field(default_factory=dict)
    k8s_node_count: int | None = None
    k8s_warnings: list[dict[str, str]] = field(default_factory=list)  # what the API server warned of
    lock: dict[str, Any] = field(default_factory=dict)
    plan: Plan | None = None
    decisions: Sequence[HostDecision] = ()
    errors: list[dict[str, str]] = field(default_factory=list)
    outcome: str = "ok"
    health: dict[str, Any] | None = None
    audit: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase, as measured
    kept_unfinished: bool = False  # a report kept before the writes, that the final report must replace

    def error(self, kind: str, message: str, key: str | None = None) -> None:
        self.errors.append({"kind": kind, "message": message, **({"key": key} if key else {})})

    def problems(self, problems: Sequence[DataProblem]) -> None:
        for problem in problems:
            self.error(problem.kind, problem.message, problem.key)


def _changes(decision: HostDecision) -> list[dict[str, Any]]:
    # Those in doubt last, as the step that failed: done or not, a restore finds out.
    steps: list[tuple[tuple[Write, ...], dict[str, bool]]] = [(step.writes, {}) for step in decision.steps]
    steps += [(step.writes, {"in_doubt": True}) for step in decision.in_doubt]
    return [
        {
            "key": w.key,
            "op": "delete" if w.value is None else "update",
            "revision": w.revision,
            "before": w.before,
            **({"after": w.value} if w.value is not None else {}),
            "step": number,  # writes of one step were one transaction (a restore keeps them together)
            **doubt,
        }
        for number, (writes, doubt) in enumerate(steps)
        for w in writes
    ]


def _host(decision: HostDecision) -> dict[str, Any]:
    host = decision.host
    entry: dict[str, Any] = {
        "name": host.name,
        "k8s_node": host.k8s_node,
        "ipv4": host.ipv4,
        "ipv6": host.ipv6,
        "tunnel_ips": list(host.tunnel_ips),
        "action": str(decision.action),
        "reason": decision.reason,
        "orphaned_since": timestamp(decision.orphaned_since),
        "conflict": decision.conflict,
        # What a dry run would write, or what a run wrote, whatever the host's action: a host
        # skipped after a conflict (its Node back, its Felix alive) keeps what was written before.
        "changes": _changes(decision),
    }
    if decision.error:
        entry["error"] = decision.error
    return entry


def in_progress(decision: HostDecision, done: tuple[Step, ...] = ()) -> HostDecision:
    """A host as the report kept before the writes lists it: `failed` until the run says better,
    with the steps it wrote already and every write it plans in doubt."""
    return replace(
        decision, action=Action.FAILED, reason=UNFINISHED, error=UNFINISHED_ERROR, steps=done, in_doubt=decision.steps
    )


def unfinished(record: RunRecord, hosts: Sequence[HostDecision], now: datetime, version: str) -> dict[str, Any]:
    """The report kept before a run's first write (and again where a host is planned anew), for
    a run that never gets to keep its own (SIGKILL, OOM, its node lost): the hosts `in_progress`
    and no exit code. A restore of it puts back what was done and finds the rest as the run found
    it, as it does for any write in doubt."""
    return build(replace(record, decisions=hosts, outcome=UNFINISHED), now, None, version)


def build(record: RunRecord, finished_at: datetime, exit_code: int | None, version: str) -> dict[str, Any]:
    config, plan = record.config, record.plan
    actions = Counter(str(d.action) for d in record.decisions)
    summary: dict[str, Any] = {
        "calico_hosts": (plan.live_hosts + len(plan.decisions)) if plan else None,
        "live": plan.live_hosts if plan else None,
        "orphaned": len(plan.orphans) if plan else None,
        **{str(action): actions.get(str(action), 0) for action in Action},
        "conflicts": len(plan.conflicts) if plan else 0,
        "errors": len(record.errors),
        "refused": bool(plan and plan.refused),
    }
    return {
        "schema": SCHEMA_VERSION,
        "tool": {"name": "calico-gc", "version": version},
        "run_id": record.run_id,
        "started_at": timestamp(record.started_at),
        "finished_at": timestamp(finished_at),
        "mode": "apply" if config.apply else "dry-run",
        "outcome": record.outcome,
        "exit_code": exit_code,
        "datastore": record.datastore,
        "kubernetes": {"node_count": record.k8s_node_count, "warnings": record.k8s_warnings},
        "lock": record.lock,
        "settings": {
            "grace_period": format_duration(config.grace_period),
            "conflict_grace_period": format_duration(config.conflict_grace_period),
            "max_deletions": config.max_deletions,
            "max_orphan_fraction": config.max_orphan_fraction,
            "unreferenced": config.unreferenced,
            "exclude": list(config.exclude),
        },
        "summary": summary,
        "guards": [{"name": g.name, "message": g.message} for g in plan.guards] if plan else [],
        "conflicts": [{"ip": c.ip, "orphan": c.orphan, "blocks": c.blocks, "kind": c.kind} for c in plan.conflicts]
        if plan
        else [],
        "errors": record.errors,
        "hosts": [_host(d) for d in record.decisions],
        "health": record.health,
        "audit": record.audit,
        "timings": {
            "total": round((finished_at - record.started_at).total_seconds(), 3),
            **{phase: round(seconds, 3) for phase, seconds in record.timings.items()},
        },
    }


def chunks(
    report: Mapping[str, Any], befores: Befores | None = None, indent: int | None = 2, one_line: Encode = compact
) -> Iterator[str]:
    """The report as JSON text, piece by piece: what `json.dumps` gives, but that an indented
    report has each host on one line. A host carries every value it removed (megabytes, at
    hundreds of hosts), and indented JSON goes through Python's pure encoder: one line a host is
    the C encoder's (500 planned hosts: 16 MB), or `one_line`'s. Hosts are encoded a batch at a
    time, and a dry run's before-values (which the run does not hold: at 1,500 planned hosts they
    are ~30 MB) are fetched with `befores` for that batch only."""
    pretty = indent is not None
    encode = json.JSONEncoder(indent=indent, separators=(",", ": ") if pretty else (",", ":")).encode
    inner = "\n" + " " * (indent or 0) if pretty else ""
    deeper = inner + inner[1:]
    colon = ": " if pretty else ":"
    if not report:
        yield "{}"
        return
    yield "{"
    for number, (key, value) in enumerate(report.items()):
        yield ("," if number else "") + inner + json.dumps(key) + colon
        if key == "hosts" and value:
            yield "["
            for index, host in enumerate(_with_befores(value, befores)):
                yield ("," if index else "") + deeper + one_line(host)
            yield inner + "]"
        else:
            yield encode(value).replace("\n", inner)
    yield inner[:1] + "}"


def _with_befores(hosts: Sequence[Mapping[str, Any]], befores: Befores | None) -> Iterator[Mapping[str, Any]]:
    if befores is None:
        yield from hosts
        return
    for start in range(0, len(hosts), HOSTS_PER_FETCH):
        batch = hosts[start : start + HOSTS_PER_FETCH]
        wanted = [(c["key"], c["revision"]) for h in batch for c in h["changes"] if c["before"] is None]
        values = befores(wanted) if wanted else {}
        for host in batch:
            if not values:
                yield host
                continue
            changes = [{**c, "before": values.get(c["key"], c["before"])} for c in host["changes"]]
            yield {**host, "changes": changes}


def write(report: Mapping[str, Any], out: TextIO, befores: Befores | None = None, one_line: Encode = compact) -> None:
    """The JSON report to a stream, never held as one string: a report of hundreds of deleted
    hosts carries every value they had and runs to tens of megabytes."""
    for chunk in chunks(report, befores, one_line=one_line):
        out.write(chunk)
    out.write("\n")
    out.flush()


class HeldBack(NamedTuple):
    """Hosts held back alike, summed: their action and reason, how many, the first names."""

    action: str
    reason: str
    hosts: int
    first: list[str]


def held_back(hosts: Iterable[T], fields: Callable[[T], tuple[str, str, str, bool]]) -> tuple[list[T], list[HeldBack]]:
    """`hosts` but those held back with no IP conflict (HELD_BACK), in their order; and those,
    summed by action and reason, naming the first HELD_BACK_NAMED. `fields` gives a host's name,
    action, reason and whether it is in an IP conflict."""
    others: list[T] = []
    held: dict[tuple[str, str], list[str]] = {}
    for host in hosts:
        name, action, reason, conflict = fields(host)
        if action in HELD_BACK and not conflict:
            held.setdefault((action, reason), []).append(name)
        else:
            others.append(host)
    return others, [HeldBack(a, r, len(names), names[:HELD_BACK_NAMED]) for (a, r), names in held.items()]


def render_text(report: dict[str, Any]) -> str:
    """The report for a person: what was (or would be) done to each host, what held the run
    back, what failed, and the network findings with their next step. `--output json` and
    `--report-file` carry everything else."""
    lines = [summary_line(report)]
    datastore = report["datastore"]
    lines.append(
        f"calico-gc {report['tool']['version']}, run {report['run_id']}, {datastore['type']} at "
        f"{', '.join(datastore.get('endpoints') or []) or '?'}"
    )
    conflicts = {c["orphan"]: c for c in report["conflicts"] if c["orphan"]}
    shown, held = held_back(report["hosts"], lambda h: (h["name"], h["action"], h["reason"], h["conflict"]))
    if shown:
        width = max(len(h["name"]) for h in shown)
        lines += ["", f"{'HOST':<{width}}  {'ACTION':<13}  {'REASON':<22}  KEYS  NOTE"]
        for host in shown:
            conflict = conflicts.get(host["name"])
            note = f"holds {conflict['ip']}, needed by {conflict['blocks']}" if conflict else host.get("error") or ""
            keys = str(len(host["changes"])) if host["changes"] else "-"
            row = f"{host['name']:<{width}}  {host['action']:<13}  {host['reason']:<22}  {keys:>4}  {note}"
            lines.append(row.rstrip())
    if held:
        lines.append("")
    for group in held:
        more = f" and {group.hosts - len(group.first)} more" if group.hosts > len(group.first) else ""
        lines.append(f"{group.hosts} {group.action} ({group.reason}): {', '.join(group.first)}{more}")
    for guard in report["guards"]:
        lines.append(f"held back by {guard['name']}: {guard['message']}")
    for error in report["errors"]:
        lines.append(f"error ({error['kind']}): {error['message']}")
    for warned in report["kubernetes"].get("warnings") or ():  # none in a report an earlier version kept
        lines.append(f"the API server warned: {warned['warning']} ({warned['request']})")
    # An apply that wrote: what was read before the writes is labelled so (the table says what changed).
    before = " (as read before this run's writes)" if _wrote(report) else ""
    audit = report.get("audit")
    if audit:
        lines += ["", ipam_line(audit).replace("ipam:", f"ipam{before}:", 1)]
    health = report.get("health")
    if health:
        lines += ["", f"network health{before}: {health['status']}"]
        lines += [f"  - {advice}" for advice in health["recommendations"]]
    if report.get("kept_as"):
        undo = f"`calico-gc restore {report['run_id']}` undoes this run"
        lines += ["", f"report kept in ConfigMap {report['kept_as']}: {undo}"]
    if report["mode"] == "dry-run" and report["summary"]["would_delete"]:
        lines += ["", "dry run: nothing was written; --apply (CALICO_GC_APPLY=true) deletes what is listed above"]
    return "\n".join(lines) + "\n"


def _wrote(report: dict[str, Any]) -> bool:
    """Whether the run wrote to the datastore: a host deleted, a handle repaired, a leaked IP released."""
    audit = report.get("audit") or {}
    repaired = (audit.get("stale_handles") or {}).get("repaired") or 0
    released = (audit.get("leaked_ips") or {}).get("released") or 0
    return report["mode"] == "apply" and bool(report["summary"].get("deleted") or repaired or released)


def ipam_line(audit: dict[str, Any]) -> str:
    """The IPAM check in one line: how full the pools are, and what garbage it found."""
    pools = ", ".join(f"{p['cidr']} {p['utilisation']:.2%} full" for p in audit["pools"]) or "no pools read"

    def found(entry: dict[str, Any]) -> str:
        actions = Counter(item["action"] for item in entry["sample"])
        detail = f" ({', '.join(f'{a} {n}' for a, n in sorted(actions.items()))})" if actions else ""
        return f"{'not checked' if entry['count'] is None else entry['count']}{detail}"

    unattributed = (audit.get("unattributed_allocations") or {}).get("count")  # none in an earlier version's
    return (
        f"ipam: {audit['blocks']} blocks, {audit['allocated']} IPs allocated; {pools}; "
        f"IPAM-only hosts {audit['ipam_only_hosts']['count']}; stale handles {found(audit['stale_handles'])}; "
        f"allocations without a handle {audit['dangling_allocations']['count']}; "
        f"leaked pod IPs {found(audit['leaked_ips'])}"
        + (f"; allocations naming no node that stay in gone hosts' blocks {unattributed}" if unattributed else "")
    )


def summary_line(report: dict[str, Any]) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in report["summary"].items() if v not in (None, 0, False))
    group = report["datastore"].get("api_group")  # the Kubernetes datastore: which of Calico's two groups
    code = report["exit_code"]  # none in a report kept before the writes, of a run that did not finish
    line = f"{report['mode']} {report['outcome']}" + (f" (exit {code})" if code is not None else "")
    line += f" in {group}" if group else ""
    line += f": {counts or 'nothing found'}"
    if report["errors"]:  # what failed, in its own words
        first = report["errors"][0]
        line += f"; {first['kind']}: {first['message']}"
    return line

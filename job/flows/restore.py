"""`calico-gc restore`: undo a run from its kept report. Read the report's keys as they are now,
plan what is left (job/core/restore.py, pure), commit one step, and plan again from a fresh
read, until nothing is left; then report. Dry run unless the command itself says --apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from job import __version__
from job.adapters.datastores.base import Datastore, DatastoreError
from job.adapters.datastores.kdd import V1, KddDatastore
from job.adapters.keep import KeepError
from job.adapters.kube import KubeError
from job.config import Config
from job.core.model import Step, Write
from job.core.report import SCHEMA_VERSION, timestamp
from job.core.restore import HostRestore, RemovedHost, ReportShapeError, plan_host, removed_hosts
from job.flows.apply import INTERRUPTED, LOCK_LOST, failure
from job.flows.run import USAGE_KINDS, Dependencies, ExitCode

log = structlog.get_logger("calico_gc.restore")
RESTORE_SCHEMA = "calico-gc/restore/v1"
MAX_STEPS_PER_KEY = 4  # a restore commits one step per plan: a bound on plans, conflicts included


@dataclass
class HostOutcome:
    name: str
    action: str
    written: list[Write] = field(default_factory=list)
    planned: list[Write] = field(default_factory=list)
    plan: HostRestore | None = None  # the last plan: what could not be restored
    already: int = 0  # keys already as the run found them before this restore began
    error: str | None = None


def _source_problem(source: Mapping[str, Any], datastore: Datastore) -> str | None:
    if source.get("schema") != SCHEMA_VERSION:
        return f"not a calico-gc run report (schema {source.get('schema')!r}, expected {SCHEMA_VERSION})"
    if source.get("mode") != "apply":
        return f"run {source.get('run_id')} was a dry run: it removed nothing"
    kept = source.get("datastore")
    if not isinstance(kept, dict):  # a report edited by hand: said, as any other shape
        return f"run {source.get('run_id')}'s report has datastore {kept!r}, not an object"
    if kept.get("type") != datastore.type:
        return f"run {source.get('run_id')} worked on a {kept.get('type')} datastore, this one is {datastore.type}"
    if isinstance(datastore, KddDatastore):
        # Reports from before Calico's v3 CRDs name no group: they were all taken in v1.
        taken, now = kept.get("api_group") or V1.api_version, datastore.group.api_version
        if taken != now:
            return (
                f"run {source.get('run_id')} was taken in {taken}, and Calico's data is now in {now} (migrated "
                f"since?): its objects are {taken}'s, so they are not written into {now}; restore by hand from the "
                "report if you must"
            )
    return None


def _restore_host(host: RemovedHost, deps: Dependencies, addresses: Mapping[str, str], apply: bool) -> HostOutcome:
    outcome = HostOutcome(host.name, "nothing_to_restore")
    keys = host.keys()
    for _ in range(MAX_STEPS_PER_KEY * max(len(keys), 1)):
        plan = plan_host(host, deps.datastore.current(keys), addresses)
        if outcome.plan is None:
            outcome.already = plan.already
        outcome.plan = plan
        if plan.refused:
            outcome.action = "refused"
            return outcome
        if not plan.steps:
            outcome.action = "restored" if outcome.written else "nothing_to_restore"
            return outcome
        if not apply:
            outcome.action, outcome.planned = "would_restore", [w for s in plan.steps for w in s.writes]
            return outcome
        step: Step = plan.steps[0]
        try:
            applied = deps.datastore.commit(step)
        except DatastoreError as error:
            outcome.written += step.writes[: error.applied]
            outcome.action, outcome.error = "failed", failure(error, bool(error.in_doubt))
            return outcome
        outcome.written += step.writes[:applied]
        for write in step.writes[:applied]:
            log.info("restored", host=host.name, key=write.key, op="create" if write.before is None else "update")
        if applied < len(step.writes):
            log.warning("restore_conflict", host=host.name, step=step.purpose)  # read again, plan again
    outcome.action, outcome.error = "failed", "the data kept changing; run the restore again"
    return outcome


def restore(
    config: Config, deps: Dependencies, load: Callable[[], Mapping[str, Any]], only: Iterable[str] = ()
) -> tuple[dict[str, Any], int]:
    """Restore what the run of the report `load` returns removed (its hosts in `only`, or all);
    the restore's own report and exit code. Never raises for expected failures."""
    started = deps.clock()
    source: Mapping[str, Any] = {"run_id": config.command.run_id}
    outcomes: list[HostOutcome] = []
    errors: list[dict[str, str]] = []
    code = ExitCode.OK
    structlog.contextvars.bind_contextvars(run_id=deps.run_id)
    log.info("restore_started", mode="apply" if config.apply else "dry-run")
    try:
        source = load()
        log.info("restore_source", source=source.get("run_id"), schema=source.get("schema"))
        problem = _source_problem(source, deps.datastore)
        if problem is not None:
            raise ReportShapeError(problem)
        hosts = removed_hosts(source, only)
        holder = deps.lock.acquire() if deps.lock else None
        if holder is not None:
            raise KubeError(f"the Lease is held by {holder}: a run is in progress; try again when it ends")
        try:
            outcomes = _restore_all(hosts, deps, config.apply)
        finally:
            if deps.lock is not None:
                deps.lock.release()
    except ReportShapeError as error:
        errors.append({"kind": "config", "message": str(error)})
        code = ExitCode.USAGE
    except (KubeError, DatastoreError, KeepError) as error:
        log.error("restore_failed", kind=error.kind, error=str(error))
        errors.append({"kind": error.kind, "message": str(error)})
        code = ExitCode.USAGE if error.kind in USAGE_KINDS else ExitCode.ERROR
    unfinished = any(o.action in ("failed", "refused") for o in outcomes)
    conflicts = any(o.plan and o.plan.conflicts for o in outcomes)
    if code == ExitCode.OK and (unfinished or conflicts):
        code = ExitCode.PARTIAL_FAILURE  # something of the run could not (or would not) be put back
    if deps.stopping.is_set() and code in (ExitCode.OK, ExitCode.PARTIAL_FAILURE):
        code = ExitCode.INTERRUPTED
    document = _document(config, deps, source, started, outcomes, errors, int(code))
    log.info("restore_finished", outcome=document["outcome"], exit_code=int(code), summary=document["summary"])
    return document, int(code)


def _restore_all(hosts: tuple[RemovedHost, ...], deps: Dependencies, apply: bool) -> list[HostOutcome]:
    inventory = deps.datastore.read()
    # Who holds each node address now: a Kubernetes Node whose calico-node cannot start yet has
    # no Calico host, and is exactly the node a restored orphan would break again.
    addresses = {ip: n.name for n in deps.nodes.list_nodes() for ip in n.internal_ips}
    addresses |= {ip: h.name for h in inventory.hosts for ip in (h.ipv4, h.ipv6) if ip}
    outcomes = []
    halted: str | None = None
    # The last host first, as any undo: where two hosts wrote one key (an orphan's IP freed from
    # another orphan's block, which that one then deleted), the later write's value before is
    # the earlier's value after, so the key comes back whole only in that order.
    for host in reversed(hosts):
        if halted is None and deps.stopping.is_set():
            halted = INTERRUPTED
        if halted is None and apply and deps.lock is not None and not deps.lock.still_held():
            halted = LOCK_LOST
        if halted is not None:
            outcomes.append(HostOutcome(host.name, "skipped", error=halted))
            continue
        try:
            outcomes.append(_restore_host(host, deps, addresses, apply))
        except DatastoreError as error:
            outcomes.append(HostOutcome(host.name, "failed", error=str(error)))
    return outcomes


def _change(write: Write) -> dict[str, Any]:
    return {
        "key": write.key,
        "op": "create" if write.before is None else "update",
        "before": write.before,
        "after": write.value,
    }


def _document(
    config: Config,
    deps: Dependencies,
    source: Mapping[str, Any],
    started: Any,
    outcomes: list[HostOutcome],
    errors: list[dict[str, str]],
    code: int,
) -> dict[str, Any]:
    hosts = []
    for o in outcomes:
        entry: dict[str, Any] = {
            "name": o.name,
            "action": o.action,
            "changes": [_change(w) for w in (o.written if config.apply else o.planned)],
            "already": o.already,
            "conflicts": [{"key": f.key, "message": f.message} for f in o.plan.conflicts] if o.plan else [],
        }
        if o.error or (o.plan and o.plan.refused):
            entry["error"] = o.error or (o.plan.refused if o.plan else None)
        hosts.append(entry)
    actions = [h["action"] for h in hosts]
    summary = {
        "hosts": len(hosts),
        **{a: actions.count(a) for a in ("restored", "would_restore", "nothing_to_restore", "refused", "failed")},
        "skipped": actions.count("skipped"),
        "keys_written": sum(len(h["changes"]) for h in hosts) if config.apply else 0,
        "keys_to_write": sum(len(h["changes"]) for h in hosts) if not config.apply else 0,
        "conflicts": sum(len(h["conflicts"]) for h in hosts),
        "errors": len(errors),
    }
    outcome = "error" if errors else "interrupted" if code == ExitCode.INTERRUPTED else "ok"
    if outcome == "ok" and (summary["conflicts"] or summary["failed"] or summary["refused"]):
        outcome = "partial"
    return {
        "schema": RESTORE_SCHEMA,
        "tool": {"name": "calico-gc", "version": __version__},
        "run_id": deps.run_id,
        "source_run_id": run_id if isinstance(run_id := source.get("run_id"), str) else None,
        "started_at": timestamp(started),
        "finished_at": timestamp(deps.clock()),
        "mode": "apply" if config.apply else "dry-run",
        "outcome": outcome,
        "exit_code": code,
        "datastore": deps.datastore.describe(),
        "summary": summary,
        "errors": errors,
        "hosts": hosts,
    }


def render_text(document: Mapping[str, Any]) -> str:
    """The restore for a person: per host what was (or would be) put back, and what was not."""
    counts = ", ".join(f"{k}={v}" for k, v in document["summary"].items() if v)
    lines = [
        f"restore {document['mode']} {document['outcome']} (exit {document['exit_code']}) of run "
        f"{document['source_run_id']}: {counts or 'nothing to restore'}"
    ]
    for error in document["errors"]:
        lines.append(f"error ({error['kind']}): {error['message']}")
    if document["hosts"]:
        width = max(len(h["name"]) for h in document["hosts"])
        lines += ["", f"{'HOST':<{width}}  {'ACTION':<18}  KEYS  ALREADY  CONFLICTS  NOTE"]
        for host in document["hosts"]:
            lines.append(
                f"{host['name']:<{width}}  {host['action']:<18}  {len(host['changes']):>4}  {host['already']:>7}  "
                f"{len(host['conflicts']):>9}  {host.get('error') or ''}".rstrip()
            )
        for host in document["hosts"]:
            for conflict in host["conflicts"]:
                lines.append(f"not restored ({host['name']}): {conflict['key']}: {conflict['message']}")
    if document["mode"] == "dry-run" and document["summary"]["would_restore"]:
        lines += ["", "dry run: nothing was written; `restore ... --apply` writes what is listed above"]
    return "\n".join(lines) + "\n"

"""Carry out a plan: per host, re-check Kubernetes, then commit its steps in order.

A step whose compare fails is never patched up here: the host's keys are read again and the
pure planner decides that host again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache, partial
from typing import Protocol

import structlog

from job.adapters.datastores.base import Datastore, DatastoreError
from job.adapters.kube import KubeError
from job.adapters.retry import describe_error
from job.config import Config
from job.core.inventory import Inventory
from job.core.ipam import IpamIndex
from job.core.leaks import (
    LEAK_CHANGED,
    LEAK_DEFERRED,
    LEAK_FAILED,
    LEAK_POD_BACK,
    LEAK_RELEASED,
    LeakRelease,
)
from job.core.model import Action, HandleRepair, HostDecision, Plan, PodInfo, Step
from job.core.plan import (
    HANDLE_CHANGED,
    HANDLE_DEFERRED,
    HANDLE_FAILED,
    HANDLE_REPAIRED,
    build_index,
    host_items,
    k8s_link,
    refreshed,
    reindexed,
    replan_host,
)

log = structlog.get_logger("calico_gc.apply")
MAX_REPLANS = 5
K8S_NODE_RECREATED = "k8s_node_recreated"
LOCK_LOST = "lock_lost"
INTERRUPTED = "interrupted"
ALREADY_GONE = "already_gone"  # removed by someone else (another run, calicoctl) meanwhile
CALICO_NODE_WRITTEN = "calico_node_written"  # its Calico Node written meanwhile: a calico-node back?
UNEXPECTED = "unexpected"


# A host planned again after a conflict: its new plan (before-values in), and the steps it wrote.
Replanned = Callable[[HostDecision, tuple[Step, ...]], None]


class NodeChecker(Protocol):
    def node_exists(self, name: str) -> bool: ...


def _log_step(host: str, step: Step) -> None:
    for write in step.writes:
        log.info(
            "write", host=host, op="delete" if write.value is None else "update", key=write.key, revision=write.revision
        )


def failure(error: DatastoreError, in_doubt: bool) -> str:
    """A failed write's error, saying where it may have been done all the same."""
    if not in_doubt:
        return str(error)
    return f"{error}; no answer came to a try of it, so it may have been written: the next run reads what is there"


def before_values(datastore: Datastore, wanted: Sequence[tuple[str, int]]) -> dict[str, str]:
    """The values of keys still at the revision a plan saw them at: what a write there removes.
    A key written since is left out; its write cannot commit (it is conditional on that revision),
    so its value is never a before-value. Asking for the current value, not the value at the read's
    revision, keeps this working when etcd compacts during a long run."""
    seen = dict(wanted)
    now = datastore.current(sorted(seen))
    return {key: item.value for key, item in now.items() if item.revision == seen[key] and item.value is not None}


def with_befores(decisions: Sequence[HostDecision], datastore: Datastore) -> list[HostDecision]:
    """Hosts' writes with the before-values the read did not keep, in one read for them all:
    the report and a restore need them. Fetched before the writes, for the hosts a run will
    delete (at most --max-deletions), and again for a host planned anew."""
    missing = [(w.key, w.revision) for d in decisions for step in d.steps for w in step.writes if w.before is None]
    if not missing:
        return list(decisions)
    values = before_values(datastore, missing)

    def filled(step: Step) -> Step:
        writes = tuple(replace(w, before=values.get(w.key)) if w.before is None else w for w in step.writes)
        return replace(step, writes=writes)

    return [replace(d, steps=tuple(filled(step) for step in d.steps)) for d in decisions]


def ignore_replans(decision: HostDecision, done: tuple[Step, ...]) -> None:
    """A Replanned for a run that keeps no report before its writes: nothing to tell."""


def apply_host(
    decision: HostDecision,
    datastore: Datastore,
    nodes: NodeChecker,
    config: Config,
    inventory: Inventory,
    run_index: Callable[[], IpamIndex],
    replanned: Replanned,
) -> HostDecision:
    """Delete one host; the result says deleted, skipped or failed, with what was committed.
    `run_index` gives the inventory's IPAM index (built once a run, at the first conflict);
    `replanned` is told what the host will write once planned again, before it writes."""
    index: IpamIndex | None = None
    host = decision.host.name
    link = k8s_link(decision.host, config) or host
    committed: list[Step] = []
    in_doubt: tuple[Step, ...] = ()

    def outcome(action: Action, reason: str, error: str | None = None) -> HostDecision:
        log.info("host_result", host=host, action=str(action), reason=reason, error=error)
        return replace(decision, action=action, reason=reason, steps=tuple(committed), error=error, in_doubt=in_doubt)

    def record(step: Step, applied: int) -> None:
        """What really was written, also of a step cut short, so that the report misses nothing."""
        if applied:
            done = step if applied == len(step.writes) else replace(step, writes=step.writes[:applied])
            _log_step(host, done)
            committed.append(done)

    def recheck() -> HostDecision | None:
        """The host's outcome where its Node is back (or cannot be checked); None where it is gone."""
        try:
            if nodes.node_exists(link):
                return outcome(Action.SKIPPED, K8S_NODE_RECREATED)
        except KubeError as error:
            return outcome(Action.FAILED, "k8s_recheck_failed", str(error))
        return None

    current: HostDecision | None = decision
    for attempt in range(MAX_REPLANS):
        assert current is not None
        # Before the first write, and again after each conflict: a conflict may be the sign of a
        # Node that came back, its calico-node writing its own data again.
        if (back := recheck()) is not None:
            return back
        try:
            [current] = with_befores([current], datastore)
            if attempt:
                replanned(current, tuple(committed))
            for step in current.steps:
                try:
                    applied = datastore.commit(step)
                except DatastoreError as error:
                    record(step, error.applied)
                    doubted = step.writes[error.applied : error.applied + error.in_doubt]
                    in_doubt = (replace(step, writes=doubted),) if doubted else ()
                    for write in doubted:
                        log.warning("write_in_doubt", host=host, key=write.key, revision=write.revision)
                    raise
                record(step, applied)
                if applied < len(step.writes):
                    log.warning("write_conflict", host=host, step=step.purpose)
                    break
            else:
                return outcome(Action.DELETED, decision.reason)
            # Read again only what this host's steps touch, and decide the host again from that.
            keys = {w.key for step in current.steps for w in step.writes} | {i.key for i in host_items(current.host)}
            now = datastore.current(sorted(key for key in keys if not key.endswith("/")))
            inventory = refreshed(inventory, now, keys, host)
            index = reindexed(index or run_index(), inventory, keys)
            planned = current.host.node
            current = replan_host(inventory, current, index)
        except DatastoreError as error:
            return outcome(Action.FAILED, "datastore_error", failure(error, bool(in_doubt)))
        if current is None:
            if not committed:
                return outcome(Action.SKIPPED, ALREADY_GONE)
            return outcome(Action.DELETED, decision.reason)
        if current.action is Action.SKIPPED:
            return outcome(Action.SKIPPED, current.reason, current.error)
        if planned is not None and current.host.node is not None and current.host.node.revision != planned.revision:
            # Whoever wrote it may be a calico-node back, under this Node's name or another's: the
            # next run reads its orchRef afresh and decides from that.
            return recheck() or outcome(Action.SKIPPED, CALICO_NODE_WRITTEN)
    return outcome(Action.FAILED, "conflicts_persisted", f"data kept changing over {MAX_REPLANS} re-reads")


def _apply_guarded(
    decision: HostDecision,
    datastore: Datastore,
    nodes: NodeChecker,
    config: Config,
    inventory: Inventory,
    run_index: Callable[[], IpamIndex],
    replanned: Replanned,
) -> HostDecision:
    """A bug met while deleting one host fails that host, never the run: the others go on and
    the report says what really happened to each."""
    try:
        return apply_host(decision, datastore, nodes, config, inventory, run_index, replanned)
    except Exception as error:
        log.exception("unexpected_error", host=decision.host.name)
        return replace(decision, action=Action.FAILED, reason=UNEXPECTED, steps=(), error=describe_error(error))


def apply_plan(
    plan: Plan,
    inventory: Inventory,
    datastore: Datastore,
    nodes: NodeChecker,
    config: Config,
    still_held: Callable[[], bool],
    stopping: Callable[[], bool] = lambda: False,
    replanned: Replanned = ignore_replans,
) -> tuple[HostDecision, ...]:
    """Every planned deletion, one host at a time; one failure never stops the others. A lost
    lock (another run took over) stops all that remain, so two runs never act at once, and so
    does a stop signal: the host in flight is finished, no new one is started."""
    results = []
    halted: str | None = None
    run_index = cache(
        partial(build_index, inventory, plan.keep, plan.cooldown)
    )  # for re-plans after conflicts, made at the first
    for decision in plan.decisions:
        if decision.action is Action.WOULD_DELETE:
            if halted is None and stopping():
                halted = INTERRUPTED
            if halted is None and not still_held():
                halted = LOCK_LOST
            if halted is not None:
                log.warning("host_not_started", host=decision.host.name, reason=halted)
                decision = replace(decision, action=Action.SKIPPED, reason=halted, steps=())
            else:
                decision = _apply_guarded(decision, datastore, nodes, config, inventory, run_index, replanned)
        results.append(decision)
    return tuple(results)


def apply_repairs(
    repairs: Sequence[HandleRepair],
    datastore: Datastore,
    still_held: Callable[[], bool],
    stopping: Callable[[], bool],
) -> tuple[tuple[HandleRepair, ...], list[str]]:
    """Commit each planned handle repair, each a compare-and-swap on the revision it was seen
    at twice: a handle written meanwhile is `changed` and seen afresh by the next run. Returns
    the repairs with what happened, and the errors to report."""
    done: list[HandleRepair] = []
    errors: list[str] = []
    for repair in repairs:
        if repair.step is None:
            done.append(repair)
            continue
        if stopping() or not still_held():
            done.append(replace(repair, action=HANDLE_DEFERRED, step=None))
            continue
        try:
            applied = datastore.commit(repair.step)
        except DatastoreError as error:
            errors.append(f"handle {repair.handle_id}: {failure(error, bool(error.in_doubt))}")
            done.append(replace(repair, action=HANDLE_FAILED))
            continue
        if applied:
            _log_step(repair.handle_id, repair.step)
        done.append(replace(repair, action=HANDLE_REPAIRED if applied else HANDLE_CHANGED))
    return tuple(done), errors


class PodChecker(Protocol):
    def pod(self, namespace: str, name: str) -> PodInfo | None: ...


def apply_leaks(
    releases: Sequence[LeakRelease],
    datastore: Datastore,
    pods: PodChecker,
    still_held: Callable[[], bool],
    stopping: Callable[[], bool],
) -> tuple[dict[str, str], list[str]]:
    """Release each block's leaked IPs, after a fresh GET of each of their pods: a pod that holds
    its IP again (or could not be checked) keeps the whole block out of this run. Returns what
    happened to each IP, and the errors to report."""
    actions: dict[str, str] = {}
    errors: list[str] = []
    for release in releases:
        ips = [leak.ip for leak in release.leaks]
        if stopping() or not still_held():
            actions.update((ip, LEAK_DEFERRED) for ip in ips)
            continue
        try:
            back = [
                leak for leak in release.leaks if (pod := pods.pod(leak.namespace, leak.pod)) and leak.settled_by(pod)
            ]
        except KubeError as error:
            errors.append(f"block {release.cidr}: the pods could not be re-checked: {error}")
            actions.update((ip, LEAK_DEFERRED) for ip in ips)
            continue
        if back:
            actions.update((ip, LEAK_DEFERRED) for ip in ips)
            actions.update((leak.ip, LEAK_POD_BACK) for leak in back)
            continue
        try:
            applied = datastore.commit(release.step)
        except DatastoreError as error:
            errors.append(f"block {release.cidr}: {failure(error, bool(error.in_doubt))}")
            actions.update((ip, LEAK_FAILED) for ip in ips)
            continue
        if applied == len(release.step.writes):
            _log_step(release.cidr, release.step)
            actions.update((ip, LEAK_RELEASED) for ip in ips)
        else:
            actions.update((ip, LEAK_CHANGED) for ip in ips)
    return actions, errors

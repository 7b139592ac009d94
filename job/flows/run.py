"""One run, start to end: lock, read, plan, record grace, apply, report.

Everything outside is injected (clients, state store, lock, clock), so tests drive the real
flow against real servers without patching anything.
"""

from __future__ import annotations

import contextvars
import gc
import threading
import time
from collections.abc import Callable, Mapping, Sequence, Set
from concurrent.futures import Future, wait
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import IntEnum
from functools import partial
from typing import Any, NamedTuple, Protocol, TypeVar

import structlog

from job import __version__
from job.adapters.datastores.base import Datastore, DatastoreError, Scope
from job.adapters.keep import KeepError, worth_keeping
from job.adapters.kube import KubeError
from job.adapters.metrics import DEFAULT_CLUSTER, push
from job.adapters.state import Loaded, StateError, StateStore
from job.config import Config, effective
from job.core.audit import ipam_audit, with_outcomes
from job.core.health import HealthInputs, after_writes, at_or_above, diagnose, log_conflicts
from job.core.inventory import Inventory
from job.core.ipam import stale_handles
from job.core.kept import KubeVirt
from job.core.leaks import LEAK_RELEASED, Allocation, LeakPlan, as_listed, plan_leaks, settler
from job.core.model import (
    Action,
    CalicoHost,
    HandleRepair,
    HostDecision,
    IpamBlock,
    IpamHandle,
    KubeNode,
    Plan,
    PodInfo,
    Step,
)
from job.core.plan import HANDLE_REPAIRED, plan_run, read_first
from job.core.report import (
    UNFINISHED,
    Befores,
    RunRecord,
    build,
    held_back,
    in_progress,
    unfinished,
)
from job.core.scan import BlockScan, scan_blocks
from job.flows.apply import (
    NodeChecker,
    Replanned,
    apply_leaks,
    apply_plan,
    apply_repairs,
    before_values,
    ignore_replans,
    with_befores,
)

log = structlog.get_logger("calico_gc")


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    REFUSED = 3
    PARTIAL_FAILURE = 4
    UNHEALTHY = 5
    INTERRUPTED = 143  # SIGTERM or SIGINT: what was started was finished, nothing new begun


T = TypeVar("T")
STOP_POLL_S = 0.05  # how often a waiting read looks at the stop flag
RELEASE_ON_STOP_S = 2.0  # the longest a stopped run waits to give its Lease up
# Leak candidates of at most this many pods are settled by a GET of each, not by listing every pod.
PODS_FETCHED_EACH = 50

# Error kinds that a setting fixes (exit 2); the rest are servers failing (exit 1).
USAGE_KINDS = frozenset({"datastore_type", "config", "tls", "unauthorized", "admission", "bad_answer"})


class Lock(Protocol):
    def acquire(self) -> str | None:
        """None when taken; otherwise who holds it."""
        ...

    def still_held(self) -> bool:
        """Renew if due; False when the lock was lost (another run took it over)."""
        ...

    def release(self) -> None: ...


class ReportStore(Protocol):
    def keep(self, report: Mapping[str, Any]) -> str:
        """Keep the report; where it is kept. Raises KeepError."""
        ...

    def fetch(self, run_id: str) -> dict[str, Any]: ...


class NodeSource(NodeChecker, Protocol):
    def list_nodes(self) -> tuple[KubeNode, ...]: ...

    def each_pod(self, take: Callable[[tuple[str, str], PodInfo], None], one_ip_each: bool = False) -> None: ...

    def pod(self, namespace: str, name: str) -> PodInfo | None: ...

    def allowed(self, verb: str, group: str, resource: str, namespace: str, name: str) -> bool | None: ...

    def kubevirt(self) -> KubeVirt: ...

    def warnings(self) -> list[dict[str, str]]: ...


class KubernetesRead(NamedTuple):
    """What a run reads of the Kubernetes API beside the datastore."""

    nodes: tuple[KubeNode, ...]
    health: HealthInputs
    kubevirt: KubeVirt
    seconds: float


@dataclass(frozen=True)
class Dependencies:
    nodes: NodeSource
    datastore: Datastore
    state: StateStore
    lock: Lock | None
    clock: Callable[[], datetime]
    run_id: str
    health: Callable[[Config], HealthInputs]  # the read side of the network-health diagnosis
    events: Callable[[dict[str, Any]], str | None] | None = None  # posts a finished run's Events
    reports: ReportStore | None = None  # where reports that changed the datastore are kept
    stopping: threading.Event = field(default_factory=threading.Event)  # set by SIGTERM/SIGINT


class Stopped(Exception):
    """A stop signal came while the run was reading: it ends at once (reads change nothing)."""

    def __init__(self, reading: str) -> None:
        super().__init__(reading)
        self.reading = reading


def _in_background(fn: Callable[..., T], *args: Any) -> Future[T]:
    """`fn` in a daemon thread of its own, with this run's log context. A daemon thread, not a
    pool's: a read that hangs is abandoned when the run stops, and the process does not wait for it."""
    future: Future[T] = Future()
    context = contextvars.copy_context()

    def work() -> None:
        try:
            future.set_result(context.run(fn, *args))
        except BaseException as error:  # handed to whoever waits on it
            future.set_exception(error)

    threading.Thread(target=work, name=getattr(fn, "__name__", "read"), daemon=True).start()
    return future


def _read(deps: Dependencies, reading: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, a read, in a thread of its own (_await)."""
    return _await(deps, reading, _in_background(fn, *args))


def _await(deps: Dependencies, reading: str, future: Future[T]) -> T:
    """The result of a read, or Stopped as soon as a stop signal comes: a server that accepts a
    call and never answers must not keep a stopped run (and its Lease) alive."""
    while not future.done():
        if deps.stopping.is_set():
            raise Stopped(reading)
        wait([future], timeout=STOP_POLL_S)
    return future.result()


def run(config: Config, deps: Dependencies) -> tuple[dict[str, Any], int]:
    """Do one run; return its report and exit code. Never raises for expected failures."""
    record = RunRecord(deps.run_id, deps.clock(), config, datastore={**deps.datastore.describe(), "cluster_guid": None})
    record.lock = {"mode": config.lock, "acquired": False, "holder": None}
    structlog.contextvars.bind_contextvars(run_id=deps.run_id)
    log.info(
        "run_started",
        mode="apply" if config.apply else "dry-run",
        datastore=config.datastore_type,
        version=__version__,
        config=effective(config),
    )
    plaintext = [e.url for e in config.etcd_endpoints if e.scheme == "http"]
    if config.etcd_username and plaintext and config.datastore_type != "kubernetes":
        log.warning("etcd_password_in_the_clear", endpoints=plaintext, effect="use https:// endpoints")
    try:
        code = _run_locked(config, deps, record)
    except Stopped as stop:
        log.warning("run_interrupted", reading=stop.reading)
        record.error("interrupted", f"stopped by a signal while reading {stop.reading}; nothing was written")
        record.outcome, code = "interrupted", ExitCode.INTERRUPTED
    except (KubeError, DatastoreError) as error:
        # A server or a setting, never a bug: one line, no traceback; a setting to fix is exit 2.
        log.error("run_failed", kind=error.kind, error=str(error))
        record.error(error.kind, str(error))
        record.outcome = "error"
        code = ExitCode.USAGE if error.kind in USAGE_KINDS else ExitCode.ERROR
    except Exception as error:  # a bug: logged with its traceback, reported, exit 1
        log.exception("unexpected_error")
        record.error("unexpected", f"{type(error).__name__}: {error}")
        record.outcome, code = "error", ExitCode.ERROR
    if deps.stopping.is_set() and code in (ExitCode.OK, ExitCode.PARTIAL_FAILURE):
        log.warning("run_interrupted")
        record.outcome, code = "interrupted", ExitCode.INTERRUPTED
    elif code == ExitCode.OK and record.health and at_or_above(record.health["status"], config.fail_on):
        log.warning("unhealthy", status=record.health["status"], fail_on=config.fail_on)
        record.outcome, code = "unhealthy", ExitCode.UNHEALTHY
    record.k8s_warnings = deps.nodes.warnings()
    finished = deps.clock()
    report = build(record, finished, int(code), __version__)
    # Events are help; a stopped run does not wait on the API server to post them.
    if config.events and deps.events is not None and not deps.stopping.is_set():
        _note_failure(report, "events", deps.events(report))
    if config.pushgateway:
        # The group never depends on what the run read: a run that cannot read the datastore must
        # land where its successes did (the GUID is calico_gc_info's label instead).
        cluster = config.cluster_name or DEFAULT_CLUSTER
        duration = (finished - record.started_at).total_seconds()
        grace = config.grace_period.total_seconds()
        _note_failure(
            report,
            "metrics_push",
            push(config.pushgateway, cluster, report, duration, succeeded=code == ExitCode.OK, grace_s=grace),
        )
    keep(config, deps, report, record.kept_unfinished)
    log.info("run_finished", outcome=record.outcome, exit_code=int(code), summary=report["summary"])
    return report, int(code)


def report_befores(datastore: Datastore) -> Befores:
    """How the report writer fetches the before-values a dry run does not hold. A datastore that
    went away since the run costs the report those values (null), not the report: one warning,
    and no further tries."""
    failed = False

    def fetch(wanted: Sequence[tuple[str, int]]) -> Mapping[str, str]:
        nonlocal failed
        if not failed:
            try:
                return before_values(datastore, wanted)
            except DatastoreError as error:
                failed = True
                log.warning("report_values_unavailable", error=str(error))
        return {}

    return fetch


def _note_failure(report: dict[str, Any], kind: str, failure: str | None) -> None:
    """A side duty of the run (Events, metrics, keeping the report) failed: reported, and
    counted as an error, but what the run did stands."""
    if failure:
        log.warning("side_effect_failed", kind=kind, error=failure)
        report["errors"].append({"kind": kind, "message": failure})
        report["summary"]["errors"] += 1


def _keep_unfinished(config: Config, deps: Dependencies, record: RunRecord, plan: Plan) -> tuple[Plan, Replanned]:
    """Before the first write, keep the report of a run that never finishes: every write planned,
    with its before-value, in doubt; kept again where a host is planned anew after a conflict, so
    that it lists what that host will write now. The final report replaces it; a run killed on
    the way (SIGKILL, OOM, its node lost) leaves it, for a restore. The plan comes back with its
    before-values, fetched here once, not again host by host."""
    reports = deps.reports
    deleting = [d for d in plan.decisions if d.action is Action.WOULD_DELETE]
    if not (config.keep_reports and reports and deleting):
        return plan, ignore_replans

    def kept(hosts: Sequence[HostDecision], when: str) -> None:
        try:
            kept_as = reports.keep(unfinished(record, hosts, deps.clock(), __version__))
        except KeepError as error:
            log.warning("report_keep_failed", error=str(error), effect="a run killed before its end leaves no report")
            record.error("report_keep", f"the report was not kept in the cluster {when}: {error}")
            return
        record.kept_unfinished = True
        log.info("report_kept", configmap=kept_as, outcome=UNFINISHED)

    try:
        filled = iter(_read(deps, "the before-values of the hosts to delete", with_befores, deleting, deps.datastore))
    except DatastoreError as error:
        record.error("report_keep", f"the report was not kept in the cluster before the writes: {error}")
        return plan, ignore_replans
    decisions = tuple(next(filled) if d.action is Action.WOULD_DELETE else d for d in plan.decisions)
    hosts = [in_progress(d) if d.action is Action.WOULD_DELETE else d for d in decisions]
    kept(hosts, "before the writes")
    place = {d.host.name: index for index, d in enumerate(decisions)}

    def replanned(decision: HostDecision, done: tuple[Step, ...]) -> None:
        hosts[place[decision.host.name]] = in_progress(decision, done)
        kept(hosts, f"as {decision.host.name} was planned anew")

    return replace(plan, decisions=decisions), replanned


def keep(config: Config, deps: Dependencies, report: dict[str, Any], replacing: bool = False) -> None:
    """Keep a report that records changes (a run's or a restore's) in the cluster; always where
    it replaces the report kept before the writes."""
    if not (config.keep_reports and deps.reports is not None and (replacing or worth_keeping(report))):
        return
    try:
        report["kept_as"] = deps.reports.keep(report)
        log.info("report_kept", configmap=report["kept_as"])
    except KeepError as error:
        _note_failure(report, "report_keep", f"the report was not kept in the cluster: {error}")


def _writable_names(config: Config, deps: Dependencies) -> None:
    """Refuse a state ConfigMap or Lease name that RBAC does not let this run update: the
    manifests grant `update` on their default names only, and a renamed object would be
    created once and then never written again."""
    wanted = [] if config.state_file else [("", "configmaps", config.state_configmap, "--state-configmap")]
    if config.keep_reports and deps.reports is not None:
        wanted.append(("", "configmaps", f"{config.report_configmaps}-0-0", "--report-configmaps"))
    if deps.lock is not None:
        wanted.append(("coordination.k8s.io", "leases", config.lock_name, "--lock-name"))
    for group, resource, name, flag in wanted:
        if deps.nodes.allowed("update", group, resource, config.namespace, name) is False:
            raise KubeError(
                f"RBAC does not let this service account update {resource} {config.namespace}/{name}: set {flag} "
                "back to the name manifests/base/rbac.yaml grants, or grant this one there too",
                kind="config",
            )


def _run_locked(config: Config, deps: Dependencies, record: RunRecord) -> ExitCode:
    _read(deps, "RBAC (access reviews)", _writable_names, config, deps)
    if deps.lock is None:
        return _run(config, deps, record)
    holder = deps.lock.acquire()
    if holder is not None:
        log.info("lock_held_elsewhere", holder=holder)
        record.lock["holder"] = holder
        record.outcome = "lock_held"
        return ExitCode.OK
    record.lock.update(acquired=True, holder=deps.run_id)
    try:
        return _run(config, deps, record)
    finally:
        _release(deps.lock, deps.stopping.is_set())


def _release(lock: Lock, stopping: bool) -> None:
    """Give the Lease up; a stopped run waits RELEASE_ON_STOP_S at most (the API server may be what
    hangs: the Lease then expires on its own, one short duration later)."""
    released = _in_background(lock.release)
    wait([released], timeout=RELEASE_ON_STOP_S if stopping else None)
    if not released.done():
        log.warning("lock_release_abandoned", waited_s=RELEASE_ON_STOP_S)
    elif isinstance(released.exception(), KubeError):
        log.warning("lock_release_failed", error=str(released.exception()))
    elif released.exception() is not None:
        raise released.exception()  # type: ignore[misc]


def _node_names(kube_read: Future[KubernetesRead]) -> set[str]:
    """The Kubernetes Node names, for the datastore read (which waits for them: see Datastore.read)."""
    return {node.name for node in kube_read.result().nodes}


def _read_kubernetes(deps: Dependencies, config: Config) -> KubernetesRead:
    """The Nodes, the health inputs, KubeVirt's VMs and the seconds they took. It only reads: what
    is logged and recorded of it is done by the run that awaits it, so that a read the run
    abandoned (the datastore failed first, or a stop came) says nothing after the run has finished."""
    started = time.perf_counter()
    listed = deps.nodes.list_nodes()
    inputs = deps.health(config)
    kubevirt = deps.nodes.kubevirt()
    return KubernetesRead(listed, inputs, kubevirt, time.perf_counter() - started)


def _leaked(
    scan: BlockScan, blocks: Sequence[IpamBlock], deps: Dependencies, record: RunRecord
) -> list[Allocation] | None:
    """The pod IPs the blocks name that no pod holds; None when the pods could not be read. The
    pods are read after the blocks were: an IP allocated since is not in what was read, and a pod
    exists before its IP is allocated, so a new pod never looks leaked.

    Where the endpoints named the candidates already (`scan.attributed`: etcd) and they are few
    (PODS_FETCHED_EACH), each candidate's pod is fetched by name: none on a cluster without leaks,
    so what a run asks of the API server follows the leaks, not the pods. Otherwise the pods are
    listed (_listed)."""
    try:
        if scan.attributed and len(scan.pod_ips) <= PODS_FETCHED_EACH:
            fetched = _read(deps, "the pods of the leak candidates", _fetched, deps.nodes, list(scan.pod_ips))
            settled = settler(scan.pod_ips)
            for key, pod in fetched.items():
                if pod is not None:  # else gone: its IPs stay candidates
                    settled(key, pod)
        else:
            _listed(scan, blocks, deps)
    except KubeError as error:
        log.warning("pods_not_read", error=str(error))
        record.error("unreadable", f"pods could not be read, so leaked pod IPs are not checked: {error}")
        return None
    return [allocation for allocations in scan.pod_ips.values() for allocation in allocations]


def _fetched(nodes: NodeSource, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], PodInfo | None]:
    """A fresh GET of each (namespace, name) pod: None where there is no such pod."""
    return {key: nodes.pod(*key) for key in keys}


def _listed(scan: BlockScan, blocks: Sequence[IpamBlock], deps: Dependencies) -> None:
    """Settle the candidates by listing every pod on the pod network. Raises KubeError.

    Where the endpoints named the candidates already (`scan.attributed`), each listed pod settles
    those of its name. Where the pods are the endpoints (Kubernetes datastore), each pod clears the
    bits of the IPs it holds, and only a pod still without an IP is kept, to settle by name the
    few candidates left: memory follows leaks, not pods. Where the blocks are of one family, a pod
    holds at most one of their IPs, so the pods are listed as the API server prints them (one IP
    each, no namespace: Kube.each_pod), far cheaper for it to serve than the pods."""
    starting: list[tuple[tuple[str, str], PodInfo]] = []
    settled = settler(scan.pod_ips) if scan.attributed else None
    families = {":" in block.cidr for block in blocks}
    one_ip_each = len(families) < 2

    def take(key: tuple[str, str], pod: PodInfo) -> None:
        pod = as_listed(pod, families)
        if settled is not None:
            settled(key, pod)
        elif pod.ips:
            scan.held_by_endpoints(pod.ips)
        else:
            starting.append((key, pod))

    _read(deps, "the pods", deps.nodes.each_pod, take, one_ip_each)
    if not scan.attributed:
        scan.attribute(blocks)
        settled = settler(scan.pod_ips)
        for key, pod in starting:
            settled(key, pod)


def _settled_sightings(
    sightings: Mapping[str, datetime],
    decisions: Sequence[HostDecision],
    repairs: Sequence[HandleRepair],
    leak_actions: Mapping[str, str],
) -> set[str]:
    """The sightings this apply made moot: of hosts deleted, handles repaired, leaked IPs released."""
    done = {d.host.name for d in decisions if d.action is Action.DELETED}
    repaired = {f"handle:{r.handle_id}@" for r in repairs if r.action == HANDLE_REPAIRED}
    released = {f"leak:{ip}@" for ip, action in leak_actions.items() if action == LEAK_RELEASED}
    for name in sightings:
        if name.startswith(("handle:", "leak:")) and name[: name.index("@") + 1] in repaired | released:
            done.add(name)
    return done


def _save_state(state: StateStore, grace_state: Mapping[str, datetime], record: RunRecord) -> bool:
    try:
        state.save(grace_state)
        return True
    except StateError as error:
        log.error("grace_state_not_saved", error=str(error))
        record.error("grace_state", f"could not save grace state, so no wait can ever end: {error}")
        return False


class Decided(NamedTuple):
    """What a run decided from its read: the hosts' plan, the leaks' plan and the grace state to keep."""

    plan: Plan
    leak_plan: LeakPlan | None
    sightings: dict[str, datetime]


def _run(config: Config, deps: Dependencies, record: RunRecord) -> ExitCode:
    """One run, as its steps: read, decide, apply, settle (the plan itself is job/core's)."""
    inventory, kube, grace_state = _read_all(config, deps, record)
    decided = _decide(config, deps, record, inventory, kube, grace_state)
    if decided is None:  # the plan reached a host the read kept lean: read again, whole
        inventory = _read_whole(deps, record, inventory, kube)
        decided = _decide(config, deps, record, inventory, kube, grace_state)
        assert decided is not None, "a whole read keeps no host lean"
    if decided.plan.refused:
        for guard in decided.plan.guards:
            log.error("refused", guard=guard.name, message=guard.message)
        record.outcome = "refused"
        return ExitCode.REFUSED
    saved = _save_state(deps.state, decided.sightings, record)
    if not config.apply:
        return ExitCode.OK
    plan, replanned = _keep_unfinished(config, deps, record, decided.plan)
    repairs, leak_actions = _apply(config, deps, record, inventory, decided._replace(plan=plan), replanned)
    return _settle(deps, record, decided.sightings, repairs, leak_actions, saved)


def _read_all(
    config: Config, deps: Dependencies, record: RunRecord
) -> tuple[Inventory, KubernetesRead, Mapping[str, datetime]]:
    """The datastore, the Kubernetes side and the grace state (both read meanwhile: they mostly
    wait on the API server), each logged and recorded. The datastore read is told which gone hosts
    a plan may take (_scope), once it has their Nodes."""
    kube_read = _in_background(_read_kubernetes, deps, config)
    grace_read = _in_background(_load_grace, deps.state)
    started = time.perf_counter()
    inventory = _read(
        deps,
        "the Calico datastore",
        deps.datastore.read,
        partial(_node_names, kube_read),
        _scope(config, deps, kube_read, grace_read),
    )
    record.timings["datastore_read"] = time.perf_counter() - started
    # What the read keeps lives to the end of the run: frozen out of the cyclic collector's passes,
    # which the plan and the report made walk it again and again (0.07 s at 5,000 hosts).
    gc.freeze()
    kube = _await(deps, "the Kubernetes Nodes and calico-node pods", kube_read)
    record.timings["kubernetes_read"] = kube.seconds
    vms = None if kube.kubevirt.vms is None else len(kube.kubevirt.vms)
    log.info("kubernetes_read", nodes=len(kube.nodes), kubevirt_vms=vms)
    if kube.kubevirt.why:
        log.warning("kubevirt_unknown", why=kube.kubevirt.why, effect="every VM address is kept this run")
    record.k8s_node_count = len(kube.nodes)
    _recorded(deps, record, inventory)
    loaded = _await(deps, "the grace state", grace_read)
    for problem in loaded.problems:
        log.warning("grace_state_problem", problem=problem)
        record.error("grace_state", problem)
    return inventory, kube, loaded.sightings


def _load_grace(state: StateStore) -> Loaded:
    """The grace state; none, and why, where it cannot be read (every wait then restarts)."""
    try:
        return state.load()
    except StateError as error:
        return Loaded({}, (f"could not read grace state, every wait restarts: {error}",))


def _scope(config: Config, deps: Dependencies, kube_read: Future[KubernetesRead], grace_read: Future[Loaded]) -> Scope:
    """The gone hosts a plan of this run may take (plan.read_first), as the plan will see them:
    the same Nodes, crash logs and grace state."""

    def scope(hosts: Sequence[CalicoHost]) -> Set[str]:
        kube, loaded = kube_read.result(), grace_read.result()
        reported = log_conflicts(kube.health.pods or (), config.restart_threshold)
        return read_first(hosts, kube.nodes, loaded.sightings, deps.clock(), config, reported)

    return scope


def _recorded(deps: Dependencies, record: RunRecord, inventory: Inventory, before: Inventory | None = None) -> None:
    """Log and record a datastore read (of problems, those a read `before` did not record)."""
    described = deps.datastore.describe()  # now with what the read found out (the Calico API group)
    log.info(
        "datastore_read",
        hosts=len(inventory.hosts),
        blocks=len(inventory.blocks),
        handles=len(inventory.handles),
        problems=len(inventory.problems),
        revision=inventory.revision,
        **{k: v for k, v in described.items() if k.startswith("api_group")},
    )
    record.datastore.update(
        described,
        cluster_guid=inventory.cluster.guid,
        datastore_ready=inventory.cluster.datastore_ready,
        revision=inventory.revision,
    )
    recorded = set(before.problems) if before is not None else set()
    record.problems([problem for problem in inventory.problems if problem not in recorded])
    if inventory.kube_controllers is not None:
        record.datastore["kube_controllers"] = dict(inventory.kube_controllers)


def _read_whole(deps: Dependencies, record: RunRecord, lean: Inventory, kube: KubernetesRead) -> Inventory:
    """The datastore read again, keeping every gone host whole: a plan reached hosts the first
    read kept lean, because more of those it may take were skipped (their data malformed, their
    addresses kept or cooling) than plan.read_first allows for. Rare; what it costs is one read."""
    log.info("datastore_read_again", reason="the plan reached gone hosts the read kept lean")
    started = time.perf_counter()
    names = {node.name for node in kube.nodes}
    inventory = _read(deps, "the Calico datastore, whole", deps.datastore.read, lambda: names)
    record.timings["datastore_read_again"] = time.perf_counter() - started
    _recorded(deps, record, inventory, lean)
    return inventory


def _decide(
    config: Config,
    deps: Dependencies,
    record: RunRecord,
    inventory: Inventory,
    kube: KubernetesRead,
    grace_state: Mapping[str, datetime],
) -> Decided | None:
    """The IPAM check, the hosts' plan, the leaks' plan and the health diagnosis (pure, but for the
    pods list the leak check needs and the handles of leaked IPs a lean read did not keep). None,
    before anything is recorded or the pods are read, where the plan reached a host the read kept
    lean (Plan.unread)."""
    now = deps.clock()
    # An orphan a crash-looping calico-node names in its log gets the conflict grace too.
    reported = log_conflicts(kube.health.pods or (), config.restart_threshold)
    live_names = {n.name for n in kube.nodes}
    scan = inventory.scan
    if scan is None:
        endpoint_ips = {ip for host in inventory.hosts for endpoint in host.workload_endpoints for ip in endpoint.ips}
        calico2 = deps.datastore.type == "etcdv2"
        attribute = not inventory.pods_are_endpoints
        scan = scan_blocks(inventory.blocks, live_names, endpoint_ips, inventory.handles, calico2, attribute)
    stale = stale_handles(inventory.handles, scan.held, inventory.malformed_blocks)
    plan = plan_run(inventory, kube.nodes, grace_state, now, config, reported, stale, kube.kubevirt, bool(scan.cooling))
    if plan.unread:
        return None
    started = time.perf_counter()
    leaked = _leaked(scan, inventory.blocks, deps, record)
    record.timings["pods_list"] = time.perf_counter() - started
    handles = inventory.handles
    if leaked:  # a lean read keeps no handle of a live pod: a leaked one is read now
        unread = {a.handle for a in leaked} - set(handles)
        if unread:
            more: dict[str, IpamHandle] = _read(deps, "the leaked IPs' handles", deps.datastore.handles, sorted(unread))
            handles = {**handles, **more}
    keep = plan.keep
    assert keep is not None, "plan_run always gives the rule"
    leak_plan = None
    if leaked is not None:  # a VM's address, or one a live migration's other pod holds, is no leak
        leaked = [allocation for allocation in leaked if keep.reason(allocation.attribute) is None]
        busy = {w.key for d in plan.decisions for step in d.steps for w in step.writes}
        blocks = {block.cidr: block for block in inventory.blocks}
        leak_plan = plan_leaks(leaked, blocks, handles, grace_state, now, config, busy, plan.cooldown)
    sightings = {**plan.next_grace_state, **(leak_plan.sightings if leak_plan else {})}
    record.audit = ipam_audit(
        inventory, live_names, scan, stale, plan.repairs, leaked, leak_plan, keep, plan.cooldown, plan.orphans
    )
    record.health = diagnose(
        kube.health,
        kube.nodes,
        inventory.hosts,
        set(plan.orphans),
        now,
        config.network_unavailable_threshold.total_seconds(),
        config.restart_threshold,
        config.calico_node_namespaces,
    )
    record.plan, record.decisions = plan, plan.decisions
    _log_decisions(plan.decisions)
    return Decided(plan, leak_plan, sightings)


def _log_decisions(decisions: Sequence[HostDecision]) -> None:
    """One `decision` event a host, but for hosts held back (deferred past --max-deletions, or in
    their grace period) with no IP conflict: one `held_back` event for each action and reason,
    naming the first few (report.held_back). A backlog is decided so on every run (2,480 deferred
    of 2,500 gone: 2,480 lines and 0.26 s a run, every ten minutes); the JSON report lists each."""
    shown, held = held_back(decisions, lambda d: (d.host.name, str(d.action), d.reason, d.conflict))
    for decision in shown:
        log.info(
            "decision",
            host=decision.host.name,
            action=str(decision.action),
            reason=decision.reason,
            conflict=decision.conflict,
        )
    for group in held:
        log.info("held_back", **group._asdict())


def _apply(
    config: Config, deps: Dependencies, record: RunRecord, inventory: Inventory, decided: Decided, replanned: Replanned
) -> tuple[tuple[HandleRepair, ...], dict[str, str]]:
    """The writes: the hosts, then the stale handles, then the leaked IPs; each failure recorded."""
    still_held = deps.lock.still_held if deps.lock else (lambda: True)
    record.decisions = apply_plan(
        decided.plan, inventory, deps.datastore, deps.nodes, config, still_held, deps.stopping.is_set, replanned
    )
    repairs, failures = apply_repairs(decided.plan.repairs, deps.datastore, still_held, deps.stopping.is_set)
    for failure in failures:
        record.error("unavailable", f"stale IPAM handle not repaired: {failure}")
    leak_actions: dict[str, str] = {}
    if decided.leak_plan is not None:
        leak_actions, failures = apply_leaks(
            decided.leak_plan.releases, deps.datastore, deps.nodes, still_held, deps.stopping.is_set
        )
        for failure in failures:
            record.error("unavailable", f"leaked pod IPs not released: {failure}")
    return repairs, leak_actions


def _settle(
    deps: Dependencies,
    record: RunRecord,
    sightings: dict[str, datetime],
    repairs: Sequence[HandleRepair],
    leak_actions: Mapping[str, str],
    saved: bool,
) -> ExitCode:
    """After the writes: the report says what is true now, the grace state forgets what is done,
    and the exit code says how it went."""
    record.audit = with_outcomes(record.audit, repairs, leak_actions)
    record.health = after_writes(record.health, {d.host.name for d in record.decisions if d.action is Action.DELETED})
    done = _settled_sightings(sightings, record.decisions, repairs, leak_actions)
    if done:
        # What is gone or put right leaves the state: a name that comes back and is orphaned again
        # waits its full grace anew, and the state lists only what still waits.
        saved &= _save_state(deps.state, {n: t for n, t in sightings.items() if n not in done}, record)
    if any(d.action is Action.FAILED for d in record.decisions):
        record.outcome = "partial_failure"
        return ExitCode.PARTIAL_FAILURE
    if not saved:
        # Orphans still waiting would wait forever: a failed run, so that alerts fire.
        record.outcome = "error"
        return ExitCode.ERROR
    return ExitCode.OK

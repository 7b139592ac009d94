"""Calico on the Kubernetes datastore (DATASTORE_TYPE=kubernetes): its resources in whichever API
group Calico's components use, `crd.projectcalico.org/v1` or (Calico 3.32+ on native CRDs)
`projectcalico.org/v3`, through the same Kubernetes client as everything else (docs/calico-data.md).

The Calico Node and the workload endpoints live and die with the Kubernetes Node and the Pods;
what stays behind is per-node IPAM (affinities, blocks, allocations, handles), per-node config,
node-bound peers, host endpoints and node statuses. A host here is a node name such data refers
to. Writes mirror Calico's: updates carry the resourceVersion read; an empty block is first
marked `deleted: true` and then deleted with uid and resourceVersion preconditions; an affinity
goes to `pendingDeletion` before it is deleted. A 409 means someone wrote meanwhile: the step
stops and the planner decides again from a fresh read. (A write tried again may conflict with its
own first try, its answer lost: the object is read, and one as the write leaves it is the write done.)

At size (5,000 nodes, 100,000 pods and handles) the read is lean, as on etcd v3: the small lists
name the hosts, then the blocks are listed and scanned for the IPAM check (`audit.BlockScan`),
then the handles, each kept only when a plan may write it. Every list is decoded typed, page by
page: `managedFields` and the rest of an object's metadata beyond what a write must send back are
never built. The pods are the workload endpoints here: the leak check clears the scan's bits with
the listed pods' IPs (flows/run.py, `Inventory.pods_are_endpoints`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import msgspec

from job.adapters.datastores.base import DatastoreError, DatastoreMismatch, Scope, ip_number
from job.adapters.kube import Kube, KubeError, typed_page
from job.config import MAX_IP_COOLDOWN_S
from job.core.inventory import Inventory
from job.core.ipam import block_shape_problem, parse_cidr, summarize_block, tunnel_handle_node
from job.core.model import (
    CREATE,
    BlockAffinity,
    CalicoHost,
    ClusterInfo,
    DataProblem,
    IpamBlock,
    IpamHandle,
    Step,
    StoredItem,
    Write,
)
from job.core.scan import BlockScan, dangling_blocks, find_dangling

BLOCKS, AFFINITIES, HANDLES = "ipamblocks", "blockaffinities", "ipamhandles"


@dataclass(frozen=True)
class CalicoApiGroup:
    """One of the two API groups Calico's Kubernetes datastore lives in. What differs between
    them is data the adapter consults (docs/calico-data.md, "The two API groups"), never a branch:
    the resource names a group spells otherwise. Field types differ only where the job does not
    write (a BlockAffinity's `deleted`: the string "true"/"false" in v1, a boolean in v3); every
    write sends back what was read in the same group, and a restore into the other group is refused."""

    name: str
    version: str
    renamed: Mapping[str, str] = field(default_factory=dict)  # the job's (v1) resource name -> this group's

    @property
    def api_version(self) -> str:
        return f"{self.name}/{self.version}"

    def path(self, plural: str, name: str = "") -> str:
        collection = f"/apis/{self.api_version}/{self.renamed.get(plural, plural)}"
        return f"{collection}/{name}" if name else collection


V1 = CalicoApiGroup("crd.projectcalico.org", "v1")
V3 = CalicoApiGroup("projectcalico.org", "v3", {"ipamconfigs": "ipamconfigurations"})
API_GROUPS = {group.api_version: group for group in (V1, V3)}
REQUIRED = (BLOCKS, AFFINITIES, HANDLES)  # every Calico 3.x on this datastore has them
# A DatastoreMigration (projectcalico.org/v3) moves a cluster's Calico data from v1 to v3: until
# it is Complete, neither group is the whole truth (api/pkg/apis/projectcalico/v3/datastoremigration.go).
MIGRATIONS, MIGRATION_DONE = "datastoremigrations", "Complete"
SPEC_VALUED = (BLOCKS, HANDLES)  # read as their spec (IPAM editing needs only it); others whole
NODE_CONFIGS = ("felixconfigurations", "bgpconfigurations")  # named node.<name>
NODE_BOUND = ("bgppeers", "hostendpoints", "caliconodestatuses")  # with spec.node
KINDS = {
    BLOCKS: "IPAMBlock",
    AFFINITIES: "BlockAffinity",
    HANDLES: "IPAMHandle",
    "felixconfigurations": "FelixConfiguration",
    "bgpconfigurations": "BGPConfiguration",
    "bgppeers": "BGPPeer",
    "hostendpoints": "HostEndpoint",
    "caliconodestatuses": "CalicoNodeStatus",
}
KUBE_CONTROLLERS_NAMESPACES = ("kube-system", "calico-system")
T = TypeVar("T")


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class _Meta(msgspec.Struct, omit_defaults=True):
    """ObjectMeta as a write must send it back, without `managedFields` (often most of an object)."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    resourceVersion: str = ""  # the API's names
    generation: int | None = None
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None
    deletionGracePeriodSeconds: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None
    ownerReferences: list[dict[str, Any]] | None = None
    generateName: str | None = None


_NULL = msgspec.Raw(b"null")


class _Object(msgspec.Struct):
    """A Calico object as listed. `spec` and `status` stay raw, so whatever JSON a real server
    holds there (Calico's schema lets a status hold anything its writer sets) decodes: a field
    kept raw is typed `msgspec.Raw` alone, which takes any JSON value (`Raw | None` takes only null)."""

    apiVersion: str = ""
    kind: str = ""
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: msgspec.Raw = _NULL
    status: msgspec.Raw = _NULL


class _HandleSpec(msgspec.Struct):
    """What the read judges a handle by; a handle of another shape is parsed whole instead."""

    handleID: str
    block: dict[str, int] = {}
    deleted: bool = False


_PAGE = typed_page(_Object)
_HANDLE_SPEC = msgspec.json.Decoder(_HandleSpec)


class _EnvVar(msgspec.Struct, frozen=True):
    name: str = ""
    value: str | None = None


class _Container(msgspec.Struct, frozen=True):
    env: list[_EnvVar] | None = None


class _PodSpec(msgspec.Struct, frozen=True):
    containers: list[_Container] | None = None


class _Template(msgspec.Struct, frozen=True):
    spec: _PodSpec = _PodSpec()


class _DeploymentSpec(msgspec.Struct, frozen=True):
    template: _Template = _Template()


class _DeploymentStatus(msgspec.Struct, frozen=True):
    readyReplicas: int = 0  # the API's names


class _Deployment(msgspec.Struct, frozen=True):
    """What the job reads of kube-controllers' Deployment; one of another shape is not known."""

    spec: _DeploymentSpec = _DeploymentSpec()
    status: _DeploymentStatus = _DeploymentStatus()


def _meta(metadata: _Meta) -> dict[str, Any]:
    return msgspec.to_builtins(metadata)  # type: ignore[no-any-return]


def _whole(obj: _Object) -> dict[str, Any]:
    """An object as the job keeps it: everything but `managedFields`."""
    whole: dict[str, Any] = {"apiVersion": obj.apiVersion, "kind": obj.kind, "metadata": _meta(obj.metadata)}
    whole["spec"] = msgspec.json.decode(obj.spec)
    status = msgspec.json.decode(obj.status)
    if status is not None:
        whole["status"] = status
    return whole


class KddDatastore:
    type = "kubernetes"

    def __init__(self, kube: Kube, api_group: str = "") -> None:
        self._kube = kube
        self._setting = api_group  # CALICO_API_GROUP: empty means "as discovery finds", as Calico
        self._group: CalicoApiGroup | None = None
        self._chosen_by = ""
        self._migration: str | None = None  # an unfinished DatastoreMigration, said in a guard
        self._metadata: dict[str, dict[str, Any]] = {}  # per key, for writes that keep labels and uid

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {"type": self.type, "endpoints": [self._kube.host]}
        if self._group is not None:
            described.update(api_group=self._group.api_version, api_group_from=self._chosen_by)
        return described

    @property
    def group(self) -> CalicoApiGroup:
        """The API group Calico's components use here, chosen once per run exactly as Calico
        chooses it (libcalico-go/lib/backend/k8s/discovery.go, UsingV3CRDs): CALICO_API_GROUP when
        set; else projectcalico.org/v3 where only it is served, crd.projectcalico.org/v1 where that
        is (with both, the v3 group is the aggregated API server's view of v1 storage)."""
        if self._group is None:
            self._group, self._chosen_by = self._choose()
        return self._group

    def _choose(self) -> tuple[CalicoApiGroup, str]:
        try:
            served = self._kube.served_groups()
        except KubeError as error:
            raise DatastoreError(f"discovery of the Calico API group failed: {error}", error.kind) from error
        v1, v3 = V1.name in served, V3.name in served
        said = " and ".join(g.name for g in (V1, V3) if g.name in served) or "neither Calico group"
        if self._setting:
            chosen = API_GROUPS[self._setting]
            if chosen.name not in served:
                raise DatastoreMismatch(
                    f"CALICO_API_GROUP is {self._setting}, but the API server at {self._kube.host} serves {said}: "
                    "set it to the group Calico's components use (their CALICO_API_GROUP), or leave it empty to "
                    "choose as they do"
                )
            by = "CALICO_API_GROUP"
        elif v1 or v3:
            chosen, by = (V3 if v3 and not v1 else V1), "discovery"
        else:
            raise DatastoreMismatch(
                f"the Calico CRDs are not installed: the API server at {self._kube.host} serves neither "
                f"{V1.api_version} nor {V3.api_version}, so this cluster's Calico does not use the Kubernetes "
                "datastore; set DATASTORE_TYPE to etcdv3 or etcdv2 (with ETCD_ENDPOINTS)"
            )
        if v1 and v3:
            self._migration = self._unfinished_migration()
        return chosen, by

    def _unfinished_migration(self) -> str | None:
        """With both groups served, a DatastoreMigration not yet Complete: Calico's data is
        moving from v1 to v3, and neither group may be written."""
        try:
            found = self._kube.list_all(V3.path(MIGRATIONS), lambda m: m)
        except KubeError as error:
            if error.status == 404:  # no migration CRD: nothing moves
                return None
            raise DatastoreError(f"listing {V3.api_version} {MIGRATIONS} failed: {error}", error.kind) from error
        for migration in found:
            phase = ((migration.get("status") if isinstance(migration, dict) else None) or {}).get("phase")
            if phase != MIGRATION_DONE:
                name = (migration.get("metadata") or {}).get("name")
                return f"DatastoreMigration {name} is {phase or 'not started'}"
        return None

    def _list(
        self, plural: str, problems: list[DataProblem], keep: Callable[[_Object], T | None], required: bool = True
    ) -> list[T]:
        """Every object of a Calico resource, page by page, each turned by `keep` into what is kept
        of it as it arrives (None: nothing). An `_Object`'s raw spec points into its page, so no
        `_Object` outlives its page."""
        group = self.group
        try:
            return self._kube.list_all(group.path(plural), keep, page=_PAGE)
        except KubeError as error:
            if error.status == 404 and plural in REQUIRED:
                # Every Calico 3.x on this datastore has IPAM blocks, affinities and handles.
                raise DatastoreMismatch(
                    f"the API server serves {group.api_version} (chosen by {self._chosen_by}) without its "
                    f"{group.renamed.get(plural, plural)}: are all of Calico's CRDs of that group installed? Set "
                    "CALICO_API_GROUP to the group Calico's components use"
                ) from error
            if error.status == 404:  # a CRD that older Calico versions do not have: nothing of that kind
                return []
            if required or error.kind == "bad_answer":
                raise DatastoreError(f"listing {plural} failed: {error}", error.kind) from error
            problems.append(DataProblem("unreadable", plural, f"not read: {error}"))
            return []

    def _item(
        self, plural: str, obj: dict[str, Any], problems: list[DataProblem], value: Any = None
    ) -> StoredItem | None:
        """A whole object read by GET (a restore, a re-read), as the list path keeps it."""
        metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
        return self._stored(plural, metadata, {**obj, "metadata": metadata} if value is None else value, problems)

    def _stored(
        self, plural: str, metadata: dict[str, Any], value: Any, problems: list[DataProblem]
    ) -> StoredItem | None:
        key = f"{plural}/{metadata.get('name', '')}"
        try:
            revision = int(metadata.get("resourceVersion", ""))
        except ValueError:
            problems.append(DataProblem("unknown_key", key, "resourceVersion is not a number; not touched"))
            return None
        self._metadata[key] = metadata
        return StoredItem(key, revision, _dump(value))

    def _listed(self, plural: str, obj: _Object, problems: list[DataProblem]) -> StoredItem | None:
        """A listed object as an item: its spec (blocks, handles) or the whole object, minus managedFields."""
        value = msgspec.json.decode(obj.spec) if plural in SPEC_VALUED else _whole(obj)
        return self._stored(plural, _meta(obj.metadata), value, problems)

    def read(self, kube_names: Callable[[], Set[str]] | None = None, scope: Scope | None = None) -> Inventory:
        """Told the Kubernetes Node names, the read is lean (module docstring): of live nodes only
        what the block scan counts is kept, and of the handles only those a plan may write."""
        problems: list[DataProblem] = []
        self._metadata.clear()
        owned: dict[str, list[StoredItem]] = defaultdict(list)
        affinities: dict[str, list[BlockAffinity]] = defaultdict(list)

        def affinity(obj: _Object) -> None:
            spec = msgspec.json.decode(obj.spec)
            node, block_cidr = (spec.get("node"), spec.get("cidr")) if isinstance(spec, dict) else (None, None)
            item = self._listed(AFFINITIES, obj, problems)
            if item is not None and isinstance(node, str) and isinstance(block_cidr, str):
                # crd.projectcalico.org/v1 takes any string here: one that is no network is said
                # and kept, as a key etcd holds in no affinity's shape is.
                network = parse_cidr(block_cidr, strict=False)
                if network is None:
                    problems.append(
                        DataProblem("malformed_value", item.key, f"spec.cidr {block_cidr!r} is not a network")
                    )
                else:
                    affinities[node].append(BlockAffinity(item, node, network.text))

        def node_config(plural: str, obj: _Object) -> None:
            name = obj.metadata.name
            item = self._listed(plural, obj, problems)
            if item is not None and name.startswith("node."):
                owned[name[len("node.") :]].append(item)

        def node_bound(plural: str, obj: _Object) -> None:
            spec = msgspec.json.decode(obj.spec)
            node = spec.get("node") if isinstance(spec, dict) else None
            item = self._listed(plural, obj, problems)
            if item is not None and isinstance(node, str) and node:
                owned[node].append(item)  # peers selecting nodes by nodeSelector are global: kept

        self._list(AFFINITIES, problems, affinity)
        for plural in NODE_CONFIGS:
            self._list(plural, problems, partial(node_config, plural), required=False)
        for plural in NODE_BOUND:
            self._list(plural, problems, partial(node_bound, plural), required=False)
        cluster, pools, kube_controllers = self._cluster(problems), self._pools(problems), self._kube_controllers()
        ip_cooldown = self._ip_cooldown(problems)
        blocks, malformed = self._blocks(problems)
        scan: BlockScan | None = None
        live: Callable[[str], bool] = lambda _: False  # noqa: E731
        if kube_names is not None:
            names = kube_names()
            live = names.__contains__
            scan = self._scan(blocks, names)
            seen: set[int] = set()
            handles = self._handles(problems, partial(self._may_write, scan, seen))
            missing = scan.held.hashes() - seen  # allocations whose handle was not listed
            if missing:
                scan.dangling_count, sampled = dangling_blocks(scan.held, missing)
                scan.dangling = find_dangling((b for b in blocks if b.cidr in sampled), missing)
        else:
            handles = self._handles(problems, lambda _id, _spec: True)
        named = set(owned) | set(affinities) | {b.affine_host for b in blocks if b.affine_host}
        named = named.union(*(b.owners.nodes() for b in blocks))
        hosts = tuple(
            CalicoHost(
                name,
                None,
                name,
                # A live node is never planned: a lean read keeps nothing of it.
                affinities=() if live(name) else tuple(sorted(affinities.get(name, ()), key=lambda a: a.item.key)),
                owned=() if live(name) else tuple(sorted(owned.get(name, ()), key=lambda i: i.key)),
            )
            for name in sorted(named)
        )
        return Inventory(
            hosts=hosts,
            blocks=tuple(blocks),
            handles=handles,
            malformed_blocks=tuple(malformed),
            hosts_registered=False,
            cluster=cluster,
            problems=tuple(sorted(problems, key=lambda p: (p.key, p.kind))),
            pools=pools,
            kube_controllers=kube_controllers,
            scan=scan,
            pods_are_endpoints=True,
            ip_cooldown=ip_cooldown,
        )

    def _blocks(self, problems: list[DataProblem]) -> tuple[list[IpamBlock], list[str]]:
        """Every block, its shape checked and summarised (blocks follow nodes, not pods: all kept)."""
        malformed: list[str] = []

        def block(obj: _Object) -> IpamBlock | None:
            key = f"{BLOCKS}/{obj.metadata.name}"
            spec = msgspec.json.decode(obj.spec)
            # A tombstone (`deleted: true`) is a deletion its writer did not finish. Calico's own
            # readers treat it as gone, but while it exists its CIDR cannot be claimed again, so it
            # is kept here as a block: an orphan's is finished like any other empty block of it.
            network = parse_cidr(str(spec.get("cidr") if isinstance(spec, dict) else None))
            if network is None:
                problems.append(DataProblem("malformed_value", key, "bad cidr"))
                return None
            cidr = network.text
            problem = block_shape_problem(spec, cidr)
            item = self._stored(BLOCKS, _meta(obj.metadata), spec, problems)
            if problem is not None or item is None:
                malformed.append(cidr)
                if problem:
                    problems.append(DataProblem("malformed_value", key, problem))
                return None
            affine_host, owners = summarize_block(spec)
            return IpamBlock(item, cidr, affine_host, owners)

        blocks = self._list(BLOCKS, problems, block)
        return blocks, malformed

    @staticmethod
    def _scan(blocks: Iterable[IpamBlock], names: Set[str]) -> BlockScan:
        """The IPAM check's pass over every block; its `wanted` are the handles of allocations no
        live node owns (a plan may write those). An allocation that names no node is freed only at
        a gone host's known IP, and a gone node leaves none here (its pods and its Node are the
        endpoints and the Calico Node): such allocations' handles are not wanted (defer_unowned)."""
        scan = BlockScan(names, owner_live=names.__contains__, parse_ip=ip_number, defer_unowned=True)
        for block in blocks:
            scan.add(block.cidr, json.loads(block.item.value or ""))
        scan.blocks_read()
        return scan

    def _handles(self, problems: list[DataProblem], keep: Callable[[str, _HandleSpec], bool]) -> dict[str, IpamHandle]:
        handles: dict[str, IpamHandle] = {}

        def one(obj: _Object) -> None:
            try:
                typed = _HANDLE_SPEC.decode(obj.spec)
            except msgspec.DecodeError:
                typed = None  # another shape: kept, for the planner to say what is wrong with it
            if typed is not None and not keep(typed.handleID, typed):
                return
            spec = msgspec.json.decode(obj.spec)
            item = self._stored(HANDLES, _meta(obj.metadata), spec, problems)
            handle_id = spec.get("handleID") if isinstance(spec, dict) else None
            if item is not None and isinstance(handle_id, str):
                handles[handle_id] = IpamHandle(item, handle_id)

        self._list(HANDLES, problems, one)
        return handles

    @staticmethod
    def _may_write(scan: BlockScan, seen: set[int], handle_id: str, spec: _HandleSpec) -> bool:
        """Whether a plan may write this handle, so that a lean read keeps it: it counts other than
        what the blocks hold (stale, holding nothing, a tombstone), counts an allocation no live
        node owns, or is the tunnel handle of a node that is not live."""
        if handle_id in scan.held:
            seen.add(hash(handle_id))
        if spec.deleted or not scan.held.holds_exactly(handle_id, spec.block):
            return True
        node = tunnel_handle_node(handle_id)
        return handle_id in scan.wanted or (node is not None and node not in scan.live_nodes)

    def _cluster(self, problems: list[DataProblem]) -> ClusterInfo:
        def spec_of_default(obj: _Object) -> Any:
            return msgspec.json.decode(obj.spec) if obj.metadata.name == "default" else None

        for spec in self._list("clusterinformations", problems, spec_of_default, required=False):
            if isinstance(spec, dict):
                ready = spec.get("datastoreReady")
                guid = spec.get("clusterGUID")
                return ClusterInfo(
                    guid if isinstance(guid, str) else None,
                    ready if isinstance(ready, bool) else None,
                    self._migration,
                )
        return ClusterInfo(migration=self._migration)

    def _pools(self, problems: list[DataProblem]) -> tuple[str, ...]:
        cidrs: list[str] = []

        def pool(obj: _Object) -> None:
            spec = msgspec.json.decode(obj.spec)
            cidr = spec.get("cidr") if isinstance(spec, dict) else None
            network = parse_cidr(cidr, strict=False) if isinstance(cidr, str) else None
            if network is not None:
                cidrs.append(network.text)
            elif cidr is not None:  # kept from before its CRD checked `format: cidr`
                problems.append(
                    DataProblem(
                        "malformed_value", f"ippools/{obj.metadata.name}", f"IP pool cidr {cidr!r} is not a network"
                    )
                )

        self._list("ippools", problems, pool, required=False)
        return tuple(sorted(cidrs))

    def _ip_cooldown(self, problems: list[DataProblem]) -> int | None:
        """IPAMConfig `default`'s ipCooldownSeconds: 0 when unset or when there is no IPAMConfig (as
        Calico reads it); None, said, where it cannot be read (then model.known_cooldown decides,
        as on etcd)."""
        path = self.group.path("ipamconfigs", "default")
        try:
            config = self._kube.request("GET", path)
        except KubeError as error:
            if error.status == 404:
                return 0
            problems.append(DataProblem("unreadable", "ipamconfigs/default", f"not read: {error}"))
            return None
        spec = config.get("spec") or {}
        if not isinstance(spec, dict):  # a proxy's answer: a real server checks the CRD's schema
            problems.append(DataProblem("malformed_value", "ipamconfigs/default", f"spec is a {type(spec).__name__}"))
            return None
        seconds = spec.get("ipCooldownSeconds", 0)
        if type(seconds) is not int or not 0 <= seconds <= MAX_IP_COOLDOWN_S:
            problems.append(DataProblem("malformed_value", "ipamconfigs/default", f"ipCooldownSeconds {seconds!r}"))
            return None
        return seconds

    def _kube_controllers(self) -> dict[str, object]:
        """Who else cleans: the kube-controllers Deployment and its node controller's leak grace."""
        found: dict[str, object] = {
            "deployment": None,
            "ready_replicas": None,
            "node_controller": None,
            "leak_grace_period": None,
        }
        for namespace in KUBE_CONTROLLERS_NAMESPACES:
            path = f"/apis/apps/v1/namespaces/{namespace}/deployments/calico-kube-controllers"
            try:
                deployment = msgspec.convert(self._get(path), _Deployment | None)
            except msgspec.ValidationError:
                deployment = None  # an answer that is no Deployment (a proxy's): not known, as where not allowed
            if deployment is None:
                continue
            env = {e.name: e.value for c in deployment.spec.template.spec.containers or () for e in c.env or ()}
            enabled = env.get("ENABLED_CONTROLLERS")
            found.update(
                deployment=f"{namespace}/calico-kube-controllers",
                ready_replicas=deployment.status.readyReplicas,
                node_controller="node" in enabled.split(",") if enabled else True,
            )
            break
        config: Any = self._get(self.group.path("kubecontrollersconfigurations", "default"))
        for name in ("spec", "controllers", "node"):  # a custom resource may hold any shape
            config = config.get(name) if isinstance(config, dict) else None
        if isinstance(config, dict):
            period = config.get("leakGracePeriod", "15m")  # Calico's default
            found["leak_grace_period"] = period if isinstance(period, str) else None  # None: not known
        return found

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return self._kube.request("GET", path)
        except KubeError:
            return None  # absent or not allowed: reported as unknown

    def handles(self, ids: Iterable[str]) -> dict[str, IpamHandle]:
        """Handles by id as they are now; Calico names an IPAMHandle by its id in lower case."""
        by_key = {f"{HANDLES}/{handle_id.lower()}": handle_id for handle_id in ids}
        return {by_key[key]: IpamHandle(item, by_key[key]) for key, item in self.current(sorted(by_key)).items()}

    def current(self, keys: Sequence[str]) -> dict[str, StoredItem]:
        found = {}
        for key in keys:
            plural, _, name = key.partition("/")
            obj = self._get_found(self.group.path(plural, name))
            if obj is not None:
                item = self._item(plural, obj, [], value=obj.get("spec") if plural in SPEC_VALUED else None)
                if item is not None:
                    found[key] = item
        return found

    def _get_found(self, path: str) -> dict[str, Any] | None:
        """The object at `path` as it is now; None when there is none. An answer without the
        metadata a write must send back (a proxy's) is an error, never taken for absent."""
        try:
            found = self._kube.request("GET", path)
        except KubeError as error:
            if error.status == 404:
                return None
            raise DatastoreError(f"GET {path}: {error}") from error
        metadata = found.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(metadata.get("resourceVersion"), str):
            raise DatastoreError(
                f"GET {path}: the answer is no Kubernetes object (no metadata.resourceVersion)", "bad_answer"
            )
        return found

    def _created(self, plural: str, name: str, value: str) -> dict[str, Any]:
        """The object to POST for a key read as `value`: only what its writer chose is kept
        (name, labels, annotations, spec), never what the API server assigned (uid, versions)."""
        data = json.loads(value)
        if plural in SPEC_VALUED:
            return {
                "apiVersion": self.group.api_version,
                "kind": KINDS[plural],
                "metadata": {"name": name},
                "spec": data,
            }
        metadata = {k: v for k, v in (data.get("metadata") or {}).items() if k in ("name", "labels", "annotations")}
        return {**data, "metadata": {**metadata, "name": name}}

    def _object(self, plural: str, key: str, revision: int, spec: Any) -> dict[str, Any]:
        metadata = {**self._metadata.get(key, {}), "resourceVersion": str(revision)}
        return {"apiVersion": self.group.api_version, "kind": KINDS[plural], "metadata": metadata, "spec": spec}

    def commit(self, step: Step) -> int:
        """The step's writes in order, each guarded by resourceVersion (a create: by the name being
        free); stop at the first 409/404."""
        for applied, write in enumerate(step.writes):
            try:
                if not self._write(write):
                    return applied
            except KubeError as error:
                raise DatastoreError(f"{write.key}: {error}", applied=applied, in_doubt=int(error.in_doubt)) from error
        return len(step.writes)

    def _write(self, write: Write) -> bool:
        """One conditional write; False when it conflicts."""
        plural, _, name = write.key.partition("/")
        path = self.group.path(plural, name)
        if write.revision == CREATE:
            assert write.value is not None, "a create carries a value"
            created = self._created(plural, name, write.value)
            return self._send("POST", path, created) is not None
        if write.value is not None:
            body = self._object(plural, write.key, write.revision, json.loads(write.value))
            return self._send("PUT", path, body) is not None
        uid, revision = self._metadata.get(write.key, {}).get("uid"), str(write.revision)
        mark = _MARKS.get(plural)
        if mark is not None:  # tombstone or pendingDeletion first, as Calico does
            spec = mark(json.loads(write.final or write.before or "{}"))
            marked = self._send("PUT", path, self._object(plural, write.key, write.revision, spec))
            if marked is None:
                return False
            metadata = marked.get("metadata")
            metadata = metadata if isinstance(metadata, dict) else {}
            if not isinstance(metadata.get("resourceVersion"), str):  # a proxy's: the delete cannot be guarded
                error = KubeError(f"PUT {path}: the answer names no resourceVersion to delete at", kind="bad_answer")
                error.in_doubt = True  # marked, or not: the answer cannot tell
                raise error
            revision = metadata["resourceVersion"]
            uid = metadata["uid"] if isinstance(metadata.get("uid"), str) else uid
        preconditions = {"uid": uid, "resourceVersion": revision}
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        try:
            return self._send("DELETE", path, body) is not None
        except KubeError as error:
            error.in_doubt = error.in_doubt or mark is not None  # marked already: the write is half done
            raise

    def _send(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The answer to a write of the object at `path` (a POST goes to its collection), None on
        a conflict (409; 404: gone). A retried write that conflicts with its own first try
        (Kube.write) is done where the object is as it leaves it: gone, for a DELETE; else holding
        the spec written, as the API server stores it."""

        def done(now: dict[str, Any] | None) -> bool:
            if method == "DELETE":
                return now is None
            return now is not None and _pruned(now.get("spec")) == _pruned(body.get("spec"))

        try:
            sent_to = path.rsplit("/", 1)[0] if method == "POST" else path
            return self._kube.write(method, sent_to, body, path, done)
        except KubeError as error:
            if error.status in (404, 409):
                return None
            raise

    def close(self) -> None:
        pass


def _pruned(value: Any) -> Any:
    """`value` as the API server stores it: a null of an object's field is dropped where the
    schema neither marks it nullable nor gives it a default (apiextensions-apiserver's
    `PruneNonNullableNullsWithoutDefaults`); an item of a list, such as an allocation's null,
    stays. A defaulted null differs here, so such a write reads as a conflict: safe, re-planned."""
    if isinstance(value, dict):
        return {key: _pruned(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_pruned(item) for item in value]
    return value


def _tombstone(block_spec: dict[str, Any]) -> dict[str, Any]:
    return {**block_spec, "deleted": True}


def _pending_deletion(affinity: dict[str, Any]) -> dict[str, Any]:
    return {**(affinity.get("spec") or {}), "state": "pendingDeletion"}


_MARKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {BLOCKS: _tombstone, AFFINITIES: _pending_deletion}

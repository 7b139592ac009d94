"""Calico on the Kubernetes datastore (DATASTORE_TYPE=kubernetes): the `crd.projectcalico.org/v1`
resources, through the same Kubernetes client as everything else (docs/calico-data.md).

The Calico Node and the workload endpoints live and die with the Kubernetes Node and the Pods;
what stays behind is per-node IPAM (affinities, blocks, allocations, handles), per-node config,
node-bound peers, host endpoints and node statuses. A host here is a node name such data refers
to. Writes mirror Calico's: updates carry the resourceVersion read; an empty block is first
marked `deleted: true` and then deleted with uid and resourceVersion preconditions; an affinity
goes to `pendingDeletion` before it is deleted. A 409 means someone wrote meanwhile: the step
stops and the planner decides again from a fresh read.
"""

from __future__ import annotations

import ipaddress
import json
from collections import defaultdict
from collections.abc import Callable, Sequence, Set
from typing import Any

from job.datastores.base import DatastoreError, DatastoreMismatch
from job.ipam import block_shape_problem, summarize_block
from job.kube import Kube, KubeError
from job.model import (
    CREATE,
    BlockAffinity,
    CalicoHost,
    ClusterInfo,
    DataProblem,
    Inventory,
    IpamBlock,
    IpamHandle,
    Step,
    StoredItem,
)

GROUP = "/apis/crd.projectcalico.org/v1"
BLOCKS, AFFINITIES, HANDLES = "ipamblocks", "blockaffinities", "ipamhandles"
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


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class KddDatastore:
    type = "kubernetes"

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._metadata: dict[str, dict[str, Any]] = {}  # per key, for writes that keep labels and uid

    def describe(self) -> dict[str, object]:
        return {"type": self.type, "endpoints": [self._kube.host]}

    def _list(self, plural: str, problems: list[DataProblem], required: bool = True) -> list[dict[str, Any]]:
        try:
            return self._kube.list_all(f"{GROUP}/{plural}", lambda obj: obj)
        except KubeError as error:
            if error.status == 404 and plural == BLOCKS:
                # Every Calico on this datastore has IPAM blocks: their CRD missing means another one.
                raise DatastoreMismatch(
                    f"the Calico CRDs ({GROUP}/{BLOCKS}) are not installed: this cluster's Calico does not "
                    "use the Kubernetes datastore; set DATASTORE_TYPE to etcdv3 or etcdv2 (with ETCD_ENDPOINTS)"
                ) from error
            if error.status == 404:  # a CRD that older Calico versions do not have: nothing of that kind
                return []
            if required:
                raise DatastoreError(f"listing {plural} failed: {error}") from error
            problems.append(DataProblem("unreadable", plural, f"not read: {error}"))
            return []

    def _item(
        self, plural: str, obj: dict[str, Any], problems: list[DataProblem], value: Any = None
    ) -> StoredItem | None:
        metadata = obj.get("metadata") or {}
        key = f"{plural}/{metadata.get('name', '')}"
        try:
            revision = int(metadata.get("resourceVersion", ""))
        except ValueError:
            problems.append(DataProblem("unknown_key", key, "resourceVersion is not a number; not touched"))
            return None
        self._metadata[key] = {k: v for k, v in metadata.items() if k != "managedFields"}
        return StoredItem(key, revision, _dump(obj if value is None else value))

    def read(self, kube_names: Callable[[], Set[str]] | None = None) -> Inventory:
        """Everything; `kube_names` (see Datastore.read) is not used here yet."""
        problems: list[DataProblem] = []
        self._metadata.clear()
        owned: dict[str, list[StoredItem]] = defaultdict(list)
        affinities: dict[str, list[BlockAffinity]] = defaultdict(list)
        blocks, malformed = [], []
        for obj in self._list(BLOCKS, problems):
            spec = obj.get("spec") or {}
            # A tombstone (`deleted: true`) is a deletion its writer did not finish. Calico's own
            # readers treat it as gone, but while it exists its CIDR cannot be claimed again, so it
            # is kept here as a block: an orphan's is finished like any other empty block of it.
            try:
                cidr = str(ipaddress.ip_network(str(spec.get("cidr"))))
            except ValueError:
                problems.append(DataProblem("malformed_value", f"{BLOCKS}/{obj['metadata']['name']}", "bad cidr"))
                continue
            problem = block_shape_problem(spec, cidr)
            item = self._item(BLOCKS, obj, problems, value=spec)
            if problem is not None or item is None:
                malformed.append(cidr)
                if problem:
                    problems.append(DataProblem("malformed_value", f"{BLOCKS}/{obj['metadata']['name']}", problem))
                continue
            affine_host, owners = summarize_block(spec)
            blocks.append(IpamBlock(item, cidr, affine_host, owners))
        for obj in self._list(AFFINITIES, problems):
            spec = obj.get("spec") or {}
            item = self._item(AFFINITIES, obj, problems)
            node, block_cidr = spec.get("node"), spec.get("cidr")
            if item is not None and isinstance(node, str) and isinstance(block_cidr, str):
                network = ipaddress.ip_network(block_cidr, strict=False)
                affinities[node].append(BlockAffinity(item, node, str(network)))
        handles = {}
        for obj in self._list(HANDLES, problems):
            spec = obj.get("spec") or {}
            item = self._item(HANDLES, obj, problems, value=spec)
            if item is not None and isinstance(spec.get("handleID"), str):
                handles[spec["handleID"]] = IpamHandle(item, spec["handleID"])
        for plural in NODE_CONFIGS:
            for obj in self._list(plural, problems, required=False):
                name = obj["metadata"]["name"]
                item = self._item(plural, obj, problems)
                if item is not None and name.startswith("node."):
                    owned[name[len("node.") :]].append(item)
        for plural in NODE_BOUND:
            for obj in self._list(plural, problems, required=False):
                node = (obj.get("spec") or {}).get("node")
                item = self._item(plural, obj, problems)
                if item is not None and isinstance(node, str) and node:
                    owned[node].append(item)  # peers selecting nodes by nodeSelector are global: kept
        named = set(owned) | set(affinities) | {b.affine_host for b in blocks if b.affine_host}
        named |= {owner for b in blocks for owner in b.owners.values() if owner}
        hosts = tuple(
            CalicoHost(
                name,
                None,
                name,
                affinities=tuple(sorted(affinities.get(name, ()), key=lambda a: a.item.key)),
                owned=tuple(sorted(owned.get(name, ()), key=lambda i: i.key)),
            )
            for name in sorted(named)
        )
        return Inventory(
            hosts=hosts,
            blocks=tuple(blocks),
            handles=handles,
            malformed_blocks=tuple(malformed),
            hosts_registered=False,
            cluster=self._cluster(problems),
            problems=tuple(sorted(problems, key=lambda p: (p.key, p.kind))),
            pools=self._pools(problems),
            kube_controllers=self._kube_controllers(),
        )

    def _cluster(self, problems: list[DataProblem]) -> ClusterInfo:
        for obj in self._list("clusterinformations", problems, required=False):
            if obj["metadata"]["name"] == "default":
                spec = obj.get("spec") or {}
                ready = spec.get("datastoreReady")
                return ClusterInfo(spec.get("clusterGUID"), ready if isinstance(ready, bool) else None)
        return ClusterInfo()

    def _pools(self, problems: list[DataProblem]) -> tuple[str, ...]:
        cidrs = [(obj.get("spec") or {}).get("cidr") for obj in self._list("ippools", problems, required=False)]
        return tuple(sorted(c for c in cidrs if isinstance(c, str)))

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
            deployment = self._get(path)
            if deployment is None:
                continue
            containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
            env = {e.get("name"): e.get("value") for c in containers or [] for e in c.get("env") or []}
            enabled = env.get("ENABLED_CONTROLLERS")
            found.update(
                deployment=f"{namespace}/calico-kube-controllers",
                ready_replicas=(deployment.get("status") or {}).get("readyReplicas", 0),
                node_controller="node" in enabled.split(",") if enabled else True,
            )
            break
        config = self._get(f"{GROUP}/kubecontrollersconfigurations/default")
        node = (((config or {}).get("spec") or {}).get("controllers") or {}).get("node")
        if node is not None:
            found["leak_grace_period"] = node.get("leakGracePeriod", "15m")  # Calico's default
        return found

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return self._kube.request("GET", path)
        except KubeError:
            return None  # absent or not allowed: reported as unknown

    def current(self, keys: Sequence[str]) -> dict[str, StoredItem]:
        found = {}
        for key in keys:
            plural, _, name = key.partition("/")
            obj = self._get_found(f"{GROUP}/{plural}/{name}")
            if obj is not None:
                item = self._item(plural, obj, [], value=obj.get("spec") if plural in SPEC_VALUED else None)
                if item is not None:
                    found[key] = item
        return found

    def _get_found(self, path: str) -> dict[str, Any] | None:
        try:
            return self._kube.request("GET", path)
        except KubeError as error:
            if error.status == 404:
                return None
            raise DatastoreError(f"GET {path}: {error}") from error

    def _created(self, plural: str, name: str, value: str) -> dict[str, Any]:
        """The object to POST for a key read as `value`: only what its writer chose is kept
        (name, labels, annotations, spec), never what the API server assigned (uid, versions)."""
        data = json.loads(value)
        if plural in SPEC_VALUED:
            return {
                "apiVersion": "crd.projectcalico.org/v1",
                "kind": KINDS[plural],
                "metadata": {"name": name},
                "spec": data,
            }
        metadata = {k: v for k, v in (data.get("metadata") or {}).items() if k in ("name", "labels", "annotations")}
        return {**data, "metadata": {**metadata, "name": name}}

    def _object(self, plural: str, key: str, revision: int, spec: Any) -> dict[str, Any]:
        metadata = {**self._metadata.get(key, {}), "resourceVersion": str(revision)}
        return {"apiVersion": "crd.projectcalico.org/v1", "kind": KINDS[plural], "metadata": metadata, "spec": spec}

    def commit(self, step: Step) -> int:
        """The step's writes in order, each guarded by resourceVersion (a create: by the name being
        free); stop at the first 409/404."""
        for applied, write in enumerate(step.writes):
            plural, _, name = write.key.partition("/")
            path = f"{GROUP}/{plural}/{name}"
            try:
                if write.revision == CREATE:
                    assert write.value is not None, "a create carries a value"
                    self._kube.request("POST", f"{GROUP}/{plural}", body=self._created(plural, name, write.value))
                    continue
                if write.value is not None:
                    self._kube.request(
                        "PUT", path, body=self._object(plural, write.key, write.revision, json.loads(write.value))
                    )
                    continue
                uid, revision = self._metadata.get(write.key, {}).get("uid"), str(write.revision)
                mark = _MARKS.get(plural)
                if mark is not None:  # tombstone or pendingDeletion first, as Calico does
                    marked = self._kube.request(
                        "PUT",
                        path,
                        body=self._object(
                            plural, write.key, write.revision, mark(json.loads(write.final or write.before or "{}"))
                        ),
                    )
                    uid, revision = marked["metadata"].get("uid", uid), marked["metadata"]["resourceVersion"]
                self._kube.request(
                    "DELETE",
                    path,
                    body={
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "preconditions": {"uid": uid, "resourceVersion": revision},
                    },
                )
            except KubeError as error:
                if error.status in (404, 409):
                    return applied
                raise DatastoreError(f"{write.key}: {error}", applied=applied) from error
        return len(step.writes)

    def close(self) -> None:
        pass


def _tombstone(block_spec: dict[str, Any]) -> dict[str, Any]:
    return {**block_spec, "deleted": True}


def _pending_deletion(affinity: dict[str, Any]) -> dict[str, Any]:
    return {**(affinity.get("spec") or {}), "state": "pendingDeletion"}


_MARKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {BLOCKS: _tombstone, AFFINITIES: _pending_deletion}

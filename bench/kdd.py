"""`make bench-kdd`: the Kubernetes datastore at fleet size, built through the API test server's
create endpoints as a real cluster is (every object gets uid, resourceVersion, generation and a
managedFields entry from the server; a pod, which its create starts Pending, then gets its status
through /status as its kubelet reports it): 5,000 Nodes with 20 pods each (100,000 Pods with a
realistic spec and status, 105,000 IPAMHandles, 5,000 IPAMBlocks and BlockAffinities), then 250
Nodes deleted, spread through the fleet.

Prints, as medians with their spread over the runs (alternated, so that drifting load hits all
alike): the job's dry run with every orphan planned (wall time and peak RSS, as a process), with
the pods as a Table and the Nodes in protobuf; beside it, with a server that prints no Tables (as
where the blocks are of both families: the pods in protobuf) and with one that serves JSON only;
one plain paged read of the same lists with the same client (page 500, each page parsed as JSON,
nothing kept), `kubectl get --raw` of the same lists, paged, and the ratios (goal: at most 1.2 to
the plain read; peak at most 200 MB). For each, the bytes the server encoded, per format and
resource: the proxy for what a run costs it (goal: the dry run at most half the plain JSON read's
cost). Then what 20,000 more pods on live nodes add to the peak (goal: at most 10 MB), and the
apply: the 250 orphans' IPAM deleted, timed, with its peak, and checked: no block, affinity or
handle names a deleted node, and every live pod's handle and allocation is unchanged. Only
loopback traffic.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import requests

from bench.dry_run import OtherCpu, run_job, spread
from bench.server_metrics import Scrape, compared
from job.adapters.kube import KubeError
from job.flows.run import ExitCode
from tests.support import crds, objects
from tests.support.kubeapi import PROTOBUF, KubeApiServer

T = TypeVar("T")

# Calico's API group the fleet is written in (--group): the Calico 3.x one, or the native v3 CRDs of
# Calico 3.32+. Set once by main() before anything is built; each entry: (API version, CRD file,
# a BlockAffinity's spec.deleted as that group types it).
GROUPS = {
    "v1": ("crd.projectcalico.org/v1", crds.V1_FILE, "false"),
    "v3": ("projectcalico.org/v3", crds.V3_FILE, False),
}
API_VERSION, _, AFFINITY_DELETED = GROUPS["v1"]
CRD = f"/apis/{API_VERSION}"
ATTRIBUTED = True  # the blocks' allocations carry `secondary` (--no-pod-attributes: none)


# What the test server's /metrics measures: its Python's cost of serving, per request and per object
# selected, where a JSON page is joined from each object's cached bytes. A Go server's cost is
# mostly encoding each object anew (what the bytes count): a proxy for neither ratio, read as
# `--kubeconfig` reads a real server's.
OWN_CPU = "the API test server's own CPU (/metrics; Python, JSON pages from cached bytes)"


def lists() -> tuple[tuple[str, dict[str, str]], ...]:
    """What one run lists, in the job's order, with the same selectors: the Calico lists, then the
    Nodes, the calico-node pods (health) and the pods on the pod network (it also lists webhooks:
    tens of objects)."""
    calico = (
        "blockaffinities",
        "felixconfigurations",
        "bgpconfigurations",
        "bgppeers",
        "hostendpoints",
        "caliconodestatuses",
        "clusterinformations",
        "ippools",
        "ipamblocks",
        "ipamhandles",
    )
    return (
        *((f"{CRD}/{plural}", {}) for plural in calico),
        ("/api/v1/nodes", {}),
        ("/api/v1/namespaces/kube-system/pods", {"labelSelector": "k8s-app=calico-node"}),
        ("/api/v1/pods", {"fieldSelector": "spec.hostNetwork=false"}),
    )


PAGE = 500
NAMESPACES = 10
TEAMS = tuple(f"team-{index}" for index in range(NAMESPACES))  # the pods' namespaces, made before them


def node_name(index: int) -> str:
    return f"ip-10-{index // 250}-{index % 250}-10.ec2.internal"


def block_cidr(index: int) -> str:
    return f"100.{64 + index // 256}.{index % 256}.0/26"


def pod_ip(index: int, pod: int) -> str:
    return f"100.{64 + index // 256}.{index % 256}.{pod + 2}"


def pod_handle(index: int, pod: int) -> str:
    return f"k8s-pod-network.{index:06x}{pod:06x}{'c0ffee' * 9}"[:80]


def pod_object(index: int, pod: int) -> dict[str, Any]:
    """A Deployment's pod as the kubelet reports it running: ~7 KB with its managedFields."""
    namespace, app = TEAMS[pod % NAMESPACES], f"app-{pod}"
    name = f"{app}-7d9c8b6f5d-{index:05d}"
    ip, node = pod_ip(index, pod), node_name(index)
    started = "2026-11-30T08:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{app}-7d9c8b6f5d-",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": "7d9c8b6f5d", "team": namespace, "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": started, "prometheus.io/scrape": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-7d9c8b6f5d",
                    "uid": f"0f1e2d3c-4b5a-6978-8796-{index:06x}{pod:06x}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": app,
                    "image": f"registry.example.com/{namespace}/{app}:1.{pod}.3",
                    "imagePullPolicy": "IfNotPresent",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
                        },
                        {
                            "name": "POD_IP",
                            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
                        },
                        {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "UPSTREAM", "value": f"http://api.{namespace}.svc.cluster.local:8080"},
                    ],
                    "resources": {"limits": {"memory": "512Mi"}, "requests": {"cpu": "100m", "memory": "256Mi"}},
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                        "periodSeconds": 10,
                        "timeoutSeconds": 1,
                        "successThreshold": 1,
                        "failureThreshold": 3,
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/ready", "port": "http", "scheme": "HTTP"},
                        "periodSeconds": 5,
                        "timeoutSeconds": 1,
                        "successThreshold": 1,
                        "failureThreshold": 3,
                    },
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/app", "readOnly": True},
                        {
                            "name": "kube-api-access-x7k2p",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        },
                    ],
                    "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                }
            ],
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "nodeName": node,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "securityContext": {"fsGroup": 2000},
            "serviceAccount": "default",
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {
                    "effect": "NoExecute",
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "tolerationSeconds": 300,
                },
                {
                    "effect": "NoExecute",
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "tolerationSeconds": 300,
                },
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": f"{app}-config", "defaultMode": 420}},
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                },
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": app,
                    "image": f"registry.example.com/{namespace}/{app}:1.{pod}.3",
                    "imageID": f"registry.example.com/{namespace}/{app}@sha256:{'ab' * 32}",
                    "containerID": f"containerd://{'cd' * 32}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started}},
                    "lastState": {},
                }
            ],
            "hostIP": f"10.{index // 250}.{index % 250}.10",
            "hostIPs": [{"ip": f"10.{index // 250}.{index % 250}.10"}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "qosClass": "Burstable",
            "startTime": started,
        },
    }


def ipam_objects(index: int, pods: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """A node's block (its tunnel IP and its pods' IPs), the block's affinity, and the handles."""
    node, cidr = node_name(index), block_cidr(index)
    attributes: list[dict[str, Any]] = [
        {"handle_id": f"ipip-tunnel-addr-{node}", "secondary": {"node": node, "type": "ipipTunnelAddress"}}
    ]
    allocations: list[int | None] = [None] * 64
    allocations[1] = 0
    for pod in range(pods):
        obj = pod_object(index, pod)
        secondary = {"namespace": obj["metadata"]["namespace"], "node": node, "pod": obj["metadata"]["name"]}
        attributes.append({"handle_id": pod_handle(index, pod), "secondary": secondary})
        allocations[pod + 2] = len(attributes) - 1
    if not ATTRIBUTED:  # --no-pod-attributes: the IPAMBlock type writes `secondary` omitempty
        attributes = [{"handle_id": attribute["handle_id"]} for attribute in attributes]
    name = cidr.replace(".", "-").replace("/", "-")
    yield (
        f"{CRD}/ipamblocks",
        {
            "apiVersion": API_VERSION,
            "kind": "IPAMBlock",
            "metadata": {"name": name},
            "spec": {
                "cidr": cidr,
                "affinity": f"host:{node}",
                "allocations": allocations,
                "unallocated": [o for o, a in enumerate(allocations) if a is None],
                "attributes": attributes,
                "deleted": False,
                "strictAffinity": False,  # required by Calico's CRD: a real server refuses a block without it
                "sequenceNumber": pods + 1,
                "sequenceNumberForAllocation": {str(o): o for o, a in enumerate(allocations) if a is not None},
            },
        },
    )
    yield (
        f"{CRD}/blockaffinities",
        {
            "apiVersion": API_VERSION,
            "kind": "BlockAffinity",
            "metadata": {"name": f"{node}-{name}", "labels": {"projectcalico.org/affinity-type": "host"}},
            "spec": {"cidr": cidr, "node": node, "state": "confirmed", "deleted": AFFINITY_DELETED, "type": "host"},
        },
    )
    for attribute in attributes:
        handle = attribute["handle_id"]
        yield (
            f"{CRD}/ipamhandles",
            {
                "apiVersion": API_VERSION,
                "kind": "IPAMHandle",
                "metadata": {"name": handle.lower()},
                "spec": {"handleID": handle, "block": {cidr: 1}, "deleted": False},
            },
        )


def node_object(index: int) -> dict[str, Any]:
    name = node_name(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "m5.xlarge"},
        },
        "spec": {"podCIDR": block_cidr(index), "providerID": f"aws:///eu-west-1a/i-{index:017x}"},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": f"10.{index // 250}.{index % 250}.10"},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def session_of(server: KubeApiServer) -> requests.Session:
    """A session that carries the server's bearer token (without it every request is a 401)."""
    session = requests.Session()
    session.trust_env = False
    session.headers.update(server.authorization)
    return session


# The kubelet's User-Agent: the field manager of the status it reports.
KUBELET = {"User-Agent": "kubelet/v1.36.2 (linux/amd64) kubernetes/0000000"}


def create_all(server: KubeApiServer, objects: Iterator[tuple[str, dict[str, Any]]], workers: int = 4) -> int:
    """POST every object (collection, body) to the server's create endpoints, `workers` at a time.
    A pod starts Pending there, as on a real server: its status is then written through /status
    as its kubelet reports it (a managedFields entry of the kubelet's, as a cluster's pods have)."""
    sessions: dict[int, requests.Session] = {}

    def send(method: str, path: str, body: dict[str, Any], status: int, headers: dict[str, str]) -> dict[str, Any]:
        ident = threading.get_ident()
        if ident not in sessions:
            sessions[ident] = session_of(server)
        headers = {"Content-Type": "application/json", **headers}
        answer = sessions[ident].request(method, server.url + path, data=json.dumps(body), headers=headers)
        if answer.status_code != status:
            raise RuntimeError(f"{method} {path}: {answer.status_code} {answer.text[:200]}")
        return answer.json()  # type: ignore[no-any-return]

    def post(entry: tuple[str, dict[str, Any]]) -> None:
        collection, body = entry
        created = send("POST", collection, body, 201, {})
        if collection.endswith("/pods"):
            path = f"{collection}/{created['metadata']['name']}/status"
            send("PUT", path, {**created, "status": body["status"]}, 200, KUBELET)

    with ThreadPoolExecutor(workers) as pool:
        count = sum(1 for _ in pool.map(post, objects, chunksize=256))
    return count


def cluster_objects(nodes: int, pods: int) -> Iterator[tuple[str, dict[str, Any]]]:
    yield (
        f"{CRD}/clusterinformations",
        {"metadata": {"name": "default"}, "spec": {"clusterGUID": "bench-kdd", "datastoreReady": True}},
    )
    yield f"{CRD}/ippools", {"metadata": {"name": "default-ipv4-ippool"}, "spec": {"cidr": "100.64.0.0/10"}}
    yield f"{CRD}/felixconfigurations", {"metadata": {"name": "default"}, "spec": {"bpfEnabled": False}}
    for index in range(nodes):
        yield "/api/v1/nodes", node_object(index)
        yield (
            "/api/v1/namespaces/kube-system/pods",
            objects.calico_node_pod(f"calico-node-{index:05d}", node_name(index), True, 0, None),
        )
        yield from ipam_objects(index, pods)
        for pod in range(pods):
            body = pod_object(index, pod)
            yield f"/api/v1/namespaces/{body['metadata']['namespace']}/pods", body


def encoded(server: KubeApiServer, work: Callable[[], T], into: list[Counter[str]]) -> T:
    """`work`'s result; what the server encoded meanwhile is appended to `into`."""
    server.take_encoded_bytes()
    result = work()
    into.append(server.take_encoded_bytes())
    return result


def mb(runs: list[Counter[str]]) -> str:
    return f"{statistics.median(sum(run.values()) for run in runs) / 1e6:.1f} MB"


def ratio(runs: list[Counter[str]], against: list[Counter[str]]) -> float:
    return statistics.median(sum(run.values()) for run in runs) / statistics.median(sum(r.values()) for r in against)


def by_resource(runs: list[Counter[str]]) -> str:
    """The last run's bytes per format and resource, largest first."""
    return ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in runs[-1].most_common(7))


def orphan_indexes(nodes: int, orphans: int) -> list[int]:
    """Orphans spread through the fleet, not bunched at its end."""
    step = nodes // orphans if orphans else nodes
    return [index * step + step // 2 for index in range(orphans)]


def plain_read(kubeconfig: Path) -> float:
    """The same lists, paged 500 at a time with the job's client, each page parsed as JSON, nothing
    kept; timed in a process of its own, as the job is (this one holds the server's objects)."""
    code = (
        "import sys, time; from pathlib import Path; from bench.kdd import PAGE; from job.config import Config;"
        "from job.adapters.kube import Kube, api_client; from job.adapters.retry import RetryPolicy;"
        "kube = Kube(api_client(Config(kubeconfig=(Path(sys.argv[1]),))), RetryPolicy(), page_size=PAGE);"
        "import json; started = time.perf_counter();"
        "[kube.list_all(path, lambda _: None, query) for path, query in json.loads(sys.argv[2])];"
        "print(time.perf_counter() - started)"
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(kubeconfig), json.dumps(lists())], check=True, capture_output=True)
    return time.perf_counter() - started


def kubectl_seconds(kubeconfig: Path) -> float:
    """`kubectl get --raw` of the same lists, page by page (the continue token read off each page)."""
    binary = str(Path(sys.executable).with_name("kubectl"))
    started = time.perf_counter()
    for path, selectors in lists():
        token = ""
        while True:
            query = "?" + urllib.parse.urlencode({**selectors, "limit": PAGE}) + (f"&continue={token}" if token else "")
            raw = subprocess.run(
                [binary, f"--kubeconfig={kubeconfig}", "get", "--raw", path + query],
                capture_output=True,
                check=True,
            ).stdout
            found = re.search(rb'"continue": ?"([^"]+)"', raw[:2000])
            if found is None:
                break
            token = urllib.parse.quote(found.group(1).decode(), safe="")
    return time.perf_counter() - started


def _node_of(attribute: dict[str, Any], block: str) -> str:
    """An allocation's node: the one it names, else (--no-pod-attributes) the node whose block it
    is here, every node's pods being in its own block (block_cidr)."""
    node = (attribute.get("secondary") or {}).get("node")
    if isinstance(node, str):
        return node
    second, third = (int(part) for part in block.split("-")[1:3])
    return node_name((second - 64) * 256 + third)


def live_state(server: KubeApiServer, gone: set[str]) -> tuple[dict[tuple[str, int], Any], dict[str, Any]]:
    """Every live pod's allocation (by block and ordinal) and every handle of a live node's pod."""
    allocations, handles = {}, {}
    for name, block in server.objects[f"{CRD}/ipamblocks"].items():
        spec = block["spec"]
        for ordinal, index in enumerate(spec["allocations"]):
            if index is not None and _node_of(spec["attributes"][index], name) not in gone:
                allocations[(name, ordinal)] = spec["attributes"][index]
    live_handles = {a["handle_id"] for a in allocations.values()}
    for name, handle in server.objects[f"{CRD}/ipamhandles"].items():
        if handle["spec"]["handleID"] in live_handles:
            handles[name] = handle["spec"]
    return allocations, handles


def names_a_gone_node(server: KubeApiServer, gone: set[str], orphans: list[int], pods: int) -> list[str]:
    """What still names a deleted node: a block's affinity or allocation, an affinity, its tunnel
    handle, or the handle of one of its pods."""
    found = []
    for name, block in server.objects[f"{CRD}/ipamblocks"].items():
        spec = block["spec"]
        if (spec.get("affinity") or "").removeprefix("host:") in gone:
            found.append(f"block {name} affine to a deleted node")
        for index in spec["allocations"]:
            if index is not None and _node_of(spec["attributes"][index], name) in gone:
                found.append(f"block {name} allocates to a deleted node")
    for name, affinity in server.objects[f"{CRD}/blockaffinities"].items():
        if affinity["spec"]["node"] in gone:
            found.append(f"affinity {name}")
    gone_pods = {pod_handle(i, pod).lower() for i in orphans for pod in range(pods)}
    for name in server.objects[f"{CRD}/ipamhandles"]:
        if name.removeprefix("ipip-tunnel-addr-") in gone or name in gone_pods:
            found.append(f"handle {name}")
    return found


def add_pods(server: KubeApiServer, nodes: int, gone: set[str], extra: int, base: int) -> None:
    """`extra` more pods on live nodes, spread over them, each with its allocation and handle."""
    live = [i for i in range(nodes) if node_name(i) not in gone]
    per_node: dict[int, int] = {}
    for number in range(extra):
        index = live[number % len(live)]
        per_node[index] = per_node.get(index, 0) + 1

    def objects() -> Iterator[tuple[str, dict[str, Any]]]:
        for index, count in per_node.items():
            for pod in range(base, base + count):
                body = pod_object(index, pod)
                yield f"/api/v1/namespaces/{body['metadata']['namespace']}/pods", body
                handle = pod_handle(index, pod)
                yield (
                    f"{CRD}/ipamhandles",
                    {
                        "metadata": {"name": handle.lower()},
                        "spec": {"handleID": handle, "block": {block_cidr(index): 1}, "deleted": False},
                    },
                )

    create_all(server, objects())
    session = session_of(server)
    for index, count in per_node.items():  # the allocations, as Calico's IPAM writes them
        name = block_cidr(index).replace(".", "-").replace("/", "-")
        block = copy.deepcopy(server.get(f"{CRD}/ipamblocks", name))
        assert block is not None
        spec = block["spec"]
        for pod in range(base, base + count):
            obj = pod_object(index, pod)
            secondary = {
                "namespace": obj["metadata"]["namespace"],
                "node": node_name(index),
                "pod": obj["metadata"]["name"],
            }
            spec["attributes"].append({"handle_id": pod_handle(index, pod), "secondary": secondary})
            spec["allocations"][pod + 2] = len(spec["attributes"]) - 1
            spec["unallocated"].remove(pod + 2)
        for field in ("managedFields", "generation", "creationTimestamp"):
            block["metadata"].pop(field, None)
        answer = session.put(f"{server.url}{CRD}/ipamblocks/{name}", data=json.dumps(block))
        answer.raise_for_status()


def profile(env: dict[str, str], args: list[str], workdir: Path) -> None:
    """One dry run under cProfile, in a process of its own, every thread included (bench.profile_job)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.profile_job", *args, "--report-file", str(workdir / "profiled.json")],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    print("one dry run under cProfile, every thread (own time, the top 20):")
    print("\n".join(lines[lines.index(next(x for x in lines if "ncalls" in x)) :]) if lines else done.stderr[-2000:])


def job_run(workdir: Path, kubeconfig: Path, max_deletions: int) -> tuple[dict[str, str], list[str]]:
    """The environment and flags of the job's run against `kubeconfig`: a dry run that plans up
    to `max_deletions` orphans whatever share of the fleet is gone (no Lease, no Events, no grace
    period), its state and report in `workdir`."""
    env = {**os.environ, "BENCH_DIR": str(workdir), "KUBECONFIG": str(kubeconfig)}
    args = [
        "--datastore-type", "kubernetes", "--lock", "none", "--state-file", str(workdir / "state.json"),
        "--grace-period", "0s", "--max-deletions", str(max_deletions), "--max-orphan-fraction", "1",
        "--events", "off",
    ]  # fmt: skip
    return env, args


def measure(kubeconfig: Path, repeat: int) -> int:
    """What a dry run with every orphan planned costs the API server of `kubeconfig`, against the
    plain read of the same lists (`lists`), as its /metrics counts them: runs alternated, each
    between two reads of the counters. Nothing is written but the job's state file, in a
    temporary directory."""
    try:
        scrape = Scrape(kubeconfig)
        scrape.counters()
    except KubeError as error:
        print(f"bench.kdd: {error}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="calico-gc-bench-kdd-"))
    env, args = job_run(workdir, kubeconfig, 100_000)
    plain, dry, took, plain_took = [], [], [], []
    try:
        for _ in range(repeat):
            seconds, cost = scrape.cost(lambda: plain_read(kubeconfig))
            plain.append(cost)
            plain_took.append(seconds)
            (seconds, peak, code, report), cost = scrape.cost(lambda: run_job(env, args, workdir / "job.log"))
            if code not in (ExitCode.OK, ExitCode.UNHEALTHY):  # an unhealthy network was read and planned all the same
                print(
                    f"bench.kdd: the dry run exited {code}: {(workdir / 'job.log').read_text()[-2000:]}",
                    file=sys.stderr,
                )
                return 2
            dry.append(cost)
            took.append(seconds)
        print(f"the API server's /metrics, {repeat} runs each, alternated:")
        reading = f"plain paged read of the same lists (page {PAGE}, JSON, nothing kept; {spread(plain_took)})"
        print(f"{reading}: {compared(plain)}")
        planned = report["summary"]["would_delete"]  # type: ignore[index]
        print(f"job dry run ({planned} orphans planned, {spread(took)}, peak {peak:.0f} MB): {compared(dry, plain)}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=20)
    parser.add_argument("--orphans", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--extra-pods", type=int, default=20000)
    parser.add_argument("--profile", action="store_true", help="then one dry run under cProfile: where the time goes")
    parser.add_argument("--group", choices=sorted(GROUPS), default="v1", help="Calico's API group (v3: native CRDs)")
    parser.add_argument(
        "--no-pod-attributes", action="store_true", help="the blocks' allocations without their secondary attributes"
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="measure this API server instead, its fleet as it is (Calico's CRDs of --group installed): one dry "
        "run against the plain read, as the server's own /metrics counts them (bench/server_metrics.py)",
    )
    options = parser.parse_args()
    global API_VERSION, AFFINITY_DELETED, CRD, ATTRIBUTED
    ATTRIBUTED = not options.no_pod_attributes
    API_VERSION, crd_file, AFFINITY_DELETED = GROUPS[options.group]
    CRD = f"/apis/{API_VERSION}"
    if options.kubeconfig:
        return measure(options.kubeconfig, options.repeat)
    installed = crds.calico(crd_file)
    if not installed:
        print(f"Calico's CRDs ({crd_file}) are not beside the checkout (../shared): every write is taken unchecked")
    print(f"Calico's data in {API_VERSION}, {'validated against its CRDs' if installed else 'no CRDs'}")
    workdir = Path(tempfile.mkdtemp(prefix="calico-gc-bench-kdd-"))
    # Anonymous requests too: the `kubectl get --raw` reference sends no token over plain HTTP.
    server = KubeApiServer(cache_lists=True, crds=installed, anonymous=True).start()
    for team in TEAMS:  # a create in a namespace that does not exist is a 404, as on a real server
        server.add_namespace(team)
    try:
        started = time.perf_counter()
        created = create_all(server, cluster_objects(options.nodes, options.pods_per_node))
        # The server's millions of objects live for the whole benchmark: out of the cyclic GC's way,
        # or every collection in this process (each request the server serves) walks them all.
        gc.collect()
        gc.freeze()
        gone = {node_name(i) for i in orphan_indexes(options.nodes, options.orphans)}
        session = session_of(server)
        for name in sorted(gone):
            session.delete(f"{server.url}/api/v1/nodes/{name}").raise_for_status()
        pods = len(server.objects.get(f"/api/v1/namespaces/{TEAMS[0]}/pods", {})) * NAMESPACES
        print(
            f"created {created} objects through the API ({options.nodes} Nodes, ~{pods} Pods, "
            f"{len(server.objects[f'{CRD}/ipamhandles'])} IPAMHandles, {options.nodes} IPAMBlocks and "
            f"BlockAffinities), then deleted {len(gone)} Nodes, in {time.perf_counter() - started:.0f}s"
        )
        pod_bytes = len(json.dumps(next(iter(server.objects[f"/api/v1/namespaces/{TEAMS[0]}/pods"].values()))))
        print(f"one pod as served: {pod_bytes} bytes (managedFields included)")
        kubeconfig = server.write_kubeconfig(workdir / "kubeconfig")
        env, args = job_run(workdir, kubeconfig, options.orphans)
        for path, selectors in lists():  # the core kinds' protobuf, each object encoded once, untimed
            if path.startswith("/api/"):
                server.handle("GET", f"{path}?{urllib.parse.urlencode(selectors)}", b"", media=PROTOBUF)
        # What the server serves in each variant: (protobuf, Tables). A Table of pods is asked for
        # where the blocks are of one family; without Tables is as where they are of both.
        baseline = "Pods as a Table, Nodes in protobuf"  # what a cluster of one family gets
        variants = {
            baseline: (True, True),
            "no Tables (blocks of both families): Pods and Nodes in protobuf": (True, False),
            "JSON only": (False, False),
        }
        plain, kubectl = [], []
        plain_bytes: list[Counter[str]] = []
        runs: dict[str, list[tuple[float, float, int, dict[str, object]]]] = {label: [] for label in variants}
        sent: dict[str, list[Counter[str]]] = {label: [] for label in variants}
        # The server's CPU as its /metrics says it, read outside the bytes' windows (as `--kubeconfig`
        # measures a real server): {"plain" or a variant: each run's counters}.
        scrape = Scrape(kubeconfig)
        server_cost: dict[str, list[dict[str, float]]] = {"plain": [], **{label: [] for label in variants}}
        others = OtherCpu()
        for _ in range(options.repeat):
            took, cost = scrape.cost(lambda: encoded(server, lambda: plain_read(kubeconfig), plain_bytes))
            plain.append(took)
            server_cost["plain"].append(cost)
            kubectl.append(kubectl_seconds(kubeconfig))
            for label, (protobuf, tables) in variants.items():
                server.serves_protobuf, server.serves_tables = protobuf, tables
                run, cost = scrape.cost(
                    partial(encoded, server, lambda: run_job(env, args, workdir / "job.log"), sent[label])
                )
                runs[label].append(run)
                server_cost[label].append(cost)
        server.serves_protobuf = server.serves_tables = True
        for _, _, code, report in (run for each in runs.values() for run in each):
            assert code == 0 and report["summary"]["would_delete"] == options.orphans, (code, report["summary"])  # type: ignore[index]
        print(others.line())
        print(f"plain paged read of the same lists (page {PAGE}, JSON, nothing kept): {spread(plain)}")
        print(f"kubectl get --raw of the same lists, paged: {spread(kubectl)}")
        for label, done in runs.items():
            job_time = statistics.median(j[0] for j in done)
            timings = [j[3]["timings"] for j in done]
            phases = ", ".join(
                f"{phase} {statistics.median(t[phase] for t in timings):.2f}s"  # type: ignore[index]
                for phase in ("datastore_read", "kubernetes_read", "pods_list")
            )
            print(
                f"job dry run, all {options.orphans} orphans planned, {label}: {spread([j[0] for j in done])}; "
                f"ratio {job_time / statistics.median(plain):.2f} to the plain read (goal <= 1.2), "
                f"{job_time / statistics.median(kubectl):.2f} to kubectl; {phases}; "
                f"peak RSS {spread([j[1] for j in done], ' MB')} (goal <= 200)"
            )
            print(
                f"  bytes the API test server encoded: {mb(sent[label])}, {ratio(sent[label], plain_bytes):.2f} of the "
                f"plain JSON read's {mb(plain_bytes)}; by resource: {by_resource(sent[label])}"
            )
            print(f"  {OWN_CPU}: {compared(server_cost[label], server_cost['plain'])}")
        print(f"the plain read, {OWN_CPU}: {compared(server_cost['plain'])}")
        if options.profile:
            profile(env, args, workdir)
        base_peak = statistics.median(j[1] for j in runs[baseline])
        add_pods(server, options.nodes, gone, options.extra_pods, options.pods_per_node)
        gc.freeze()
        more = [run_job(env, args)[1] for _ in range(options.repeat)]
        print(
            f"with {options.extra_pods} more pods on live nodes (their allocations and handles too): peak RSS "
            f"{spread(more, ' MB')}, {statistics.median(more) - base_peak:+.1f} MB (goal <= +10)"
        )
        before = live_state(server, gone)
        seconds, peak, code, report = run_job(env, [*args, "--apply"], workdir / "apply.log")
        summary = report["summary"]
        assert code == 0 and summary["deleted"] == options.orphans, (code, summary)  # type: ignore[index]
        left = names_a_gone_node(server, gone, orphan_indexes(options.nodes, options.orphans), options.pods_per_node)
        after = live_state(server, gone)
        # Without attributes nothing says whose a gone node's pods' allocations are: they and their
        # handles stay, as a plan frees an allocation that names no node only at a gone host's known
        # IP (none here). Nothing else of a gone node may.
        pods_only = [k for k in left if "allocates to" not in k and not k.startswith("handle k8s-pod-network.")]
        unexplained = left if ATTRIBUTED else pods_only
        assert not unexplained, unexplained[:5]
        assert after == before, "a live pod's allocation or handle changed"
        afterwards = (
            f"{len(left)} keys name a deleted node (its pods' allocations name none)"
            if left
            else "no block, affinity or handle names a deleted node"
        )
        print(
            f"apply: the {options.orphans} orphans' IPAM deleted in {seconds:.1f}s, peak RSS {peak:.0f} MB; afterwards "
            f"{afterwards}"
            f", and all {len(before[0])} live allocations and {len(before[1])} live handles are unchanged"
        )
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # the job's reports and logs
    return 0


if __name__ == "__main__":
    sys.exit(main())

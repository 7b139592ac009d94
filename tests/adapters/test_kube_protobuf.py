"""Pods and Nodes read as protobuf: what the job reads of them is what it reads of their JSON,
through the official client and the API test server's negotiation, with JSON where the server
serves no protobuf, errors read off protobuf Status bodies, and anything malformed one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
from google.protobuf.descriptor import FieldDescriptor

import bench.kdd
from job.adapters import health, kube_protobuf
from job.adapters.health import read_health
from job.adapters.kube import Kube, KubeError, api_client
from job.config import Config
from job.core.model import PodInfo
from tests.conftest import no_sleep_retry
from tests.support import k8s_protobuf, objects
from tests.support.kubeapi import PROTOBUF, KubeApiServer

NODES = [
    objects.node("plain", "10.0.0.1"),
    objects.with_every_field(objects.node("full", "10.0.0.2")),
    bench.kdd.node_object(7),  # conditions without times: Go sends its zero time
]
PODS = [
    objects.pod("shop", "cart-1", "plain", ("100.96.0.1",)),
    objects.pod("shop", "pending-1", None),
    objects.with_every_field(objects.pod("shop", "dual-1", "full", ("100.96.0.2", "fd00:96::2"))),
    bench.kdd.pod_object(3, 4),
]


def read(server: KubeApiServer, tmp: Path) -> tuple[Any, dict[tuple[str, str], PodInfo]]:
    """The Nodes and the pods, as a run reads them (pages of 2)."""
    kube = Kube(api_client(Config(kubeconfig=(server.write_kubeconfig(tmp / "kubeconfig"),))), no_sleep_retry(), 2)
    pods: dict[tuple[str, str], PodInfo] = {}
    nodes = kube.list_nodes()
    kube.each_pod(pods.__setitem__)
    return nodes, pods


def seed(server: KubeApiServer) -> None:
    for node in NODES:
        server.put("/api/v1/nodes", node)
    for pod in PODS:
        server.put(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)
    server.add_node("tainted", "10.0.0.3")
    node = server.get("/api/v1/nodes", "tainted")
    assert node is not None
    node["spec"]["taints"] = [
        {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule", "timeAdded": "2026-12-01T08:00:00Z"}
    ]
    node["status"]["conditions"][0].update(status="True", reason="NoRouteCreated", message="routes missing")
    server.put("/api/v1/nodes", node)
    server.add_node("untimed", "10.0.0.4")  # unavailable, its condition without a time: Go sends its zero time
    node = server.get("/api/v1/nodes", "untimed")
    assert node is not None
    node["status"]["conditions"][0] = {"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated"}
    server.put("/api/v1/nodes", node)


def test_what_the_job_reads_of_protobuf_is_what_it_reads_of_json(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    """Every field of every fixture, whole objects and the server's managedFields included, goes
    over the wire in protobuf; the nodes and pods read are those read when the server serves JSON."""
    seed(kubeapi)
    kubeapi.take_encoded_bytes()
    from_protobuf = read(kubeapi, tmp_path)
    spoken = kubeapi.take_encoded_bytes()
    assert set(spoken) == {"protobuf /api/v1/nodes", "protobuf /api/v1/pods"}, spoken
    kubeapi.serves_protobuf = False
    from_json = read(kubeapi, tmp_path)
    in_json = kubeapi.take_encoded_bytes()
    assert set(in_json) == {"json /api/v1/nodes", "json /api/v1/pods"}
    assert from_protobuf == from_json
    nodes, pods = from_protobuf
    assert len(nodes) == 5 and len(pods) == 4
    tainted = next(node for node in nodes if node.name == "tainted")
    unavailable = tainted.network_unavailable
    assert unavailable is not None and unavailable.taint_added == "2026-12-01T08:00:00Z"
    assert unavailable.since == objects.SINCE and unavailable.reason == "NoRouteCreated"
    untimed = next(node for node in nodes if node.name == "untimed").network_unavailable
    assert untimed is not None and untimed.since is None and untimed.condition
    stored = kubeapi.get("/api/v1/nodes", "untimed")
    assert stored is not None and untimed.node_created == stored["metadata"]["creationTimestamp"] is not None
    assert pods[("shop", "dual-1")] == PodInfo("full", ("100.96.0.2", "fd00:96::2"))
    assert pods[("shop", "pending-1")] == PodInfo(None, ())
    assert sum(spoken.values()) < 0.7 * sum(in_json.values()), "protobuf is the smaller answer"


def test_the_jobs_field_numbers_are_those_the_test_server_encodes_with() -> None:
    """Two schemas written apart from Kubernetes' generated.proto files: each field the job reads
    has the number, type and repetition the test server sends it with."""
    messages = {
        "HealthPodList": "PodList",
        "HealthPod": "Pod",
        "LabelledMeta": "ObjectMeta",
        "HealthPodStatus": "PodStatus",
        "NodeMeta": "ObjectMeta",
    }
    scalars = {"string": {"s"}, "int32": {"i"}, "int64": {"i"}, "bytes": {"y"}, "map": {"ms"}, "Time": {"t", "T"}}
    renamed = {("ListMeta", "next"): "continue"}
    for message, fields in kube_protobuf.SCHEMA.items():
        full = k8s_protobuf.SCHEMA[messages.get(message, message)]
        for field, number, kind in fields:
            name = renamed.get((message, field), field)
            assert name in full, f"{message}.{name}"
            sent_number, sent_kind, sent_repeated = full[name]
            bare = kind.rstrip("*")
            assert sent_number == number, f"{message}.{name}: {number} against {sent_number}"
            assert sent_kind in scalars.get(bare, {messages.get(bare, bare)}), f"{message}.{name}: {kind}"
            assert sent_repeated == kind.endswith("*"), f"{message}.{name} repeated"


def test_the_message_classes_are_the_schema() -> None:
    """The file descriptor the job writes by hand in protobuf's wire format gives classes whose
    fields are SCHEMA's: each name (and JSON name), number, repetition and type, a map as a
    repeated entry of a string key and value."""
    scalars = {"string": FieldDescriptor.TYPE_STRING, "bytes": FieldDescriptor.TYPE_BYTES}
    scalars |= {"int64": FieldDescriptor.TYPE_INT64, "int32": FieldDescriptor.TYPE_INT32}
    for message, fields in kube_protobuf.SCHEMA.items():
        descriptor = kube_protobuf.MESSAGES[message].DESCRIPTOR
        assert [(f.name, f.json_name, f.number) for f in descriptor.fields] == [(f, f, n) for f, n, _ in fields]
        for (field, _, kind), got in zip(fields, descriptor.fields, strict=True):
            bare = kind.rstrip("*")
            assert got.is_repeated == (kind.endswith("*") or bare == "map"), f"{message}.{field}"
            if bare in scalars:
                assert got.type == scalars[bare], f"{message}.{field}"
            elif bare == "map":
                entry = got.message_type
                assert entry.GetOptions().map_entry and [(f.name, f.type) for f in entry.fields] == [
                    ("key", FieldDescriptor.TYPE_STRING),
                    ("value", FieldDescriptor.TYPE_STRING),
                ]
            else:
                assert (got.type, got.message_type.name) == (FieldDescriptor.TYPE_MESSAGE, bare), f"{message}.{field}"


def test_the_test_server_refuses_a_field_it_has_no_number_for(kubeapi: KubeApiServer) -> None:
    """Never a silent drop: a 500 naming the field (and the JSON answer still serves it)."""
    pod = objects.pod("shop", "odd-1", "n1", ("100.96.0.9",))
    pod["spec"]["aFieldOfANewerKubernetes"] = {"x": 1}
    kubeapi.put("/api/v1/namespaces/shop/pods", pod)
    asked = requests.get(
        f"{kubeapi.url}/api/v1/pods", headers={"Accept": kube_protobuf.ACCEPT, **kubeapi.authorization}, timeout=10
    )
    assert asked.status_code == 500 and asked.headers["Content-Type"] == PROTOBUF
    said = json.loads(kube_protobuf.status_json(asked.content) or "{}")
    assert "no protobuf number for PodSpec.aFieldOfANewerKubernetes" in said["message"]
    with pytest.raises(k8s_protobuf.Unencodable, match=r"podIPs: '100\.96\.0\.9' is not a list"):
        k8s_protobuf.message("PodStatus", {"podIPs": "100.96.0.9"})
    assert requests.get(f"{kubeapi.url}/api/v1/pods", headers=kubeapi.authorization, timeout=10).status_code == 200


def test_the_server_negotiates_as_the_real_one(kubeapi: KubeApiServer) -> None:
    """Protobuf for the core group when asked first; JSON for custom resources, or 406 when JSON
    is not acceptable; errors in the format negotiated."""
    kubeapi.add_node("n1", "10.0.0.1")

    def get(path: str, accept: str) -> requests.Response:
        return requests.get(kubeapi.url + path, headers={"Accept": accept, **kubeapi.authorization}, timeout=10)

    assert get("/api/v1/nodes", kube_protobuf.ACCEPT).headers["Content-Type"] == PROTOBUF
    assert get("/api/v1/nodes", f"application/json, {PROTOBUF}").headers["Content-Type"] == "application/json"
    calico = "/apis/crd.projectcalico.org/v1/ipamblocks"
    assert get(calico, kube_protobuf.ACCEPT).headers["Content-Type"] == "application/json"
    assert get(calico, PROTOBUF).status_code == 406
    missing = get("/api/v1/nodes/none", kube_protobuf.ACCEPT)
    assert missing.status_code == 404 and missing.content.startswith(kube_protobuf.MAGIC)
    said = json.loads(kube_protobuf.status_json(missing.content) or "{}")
    assert said == {"kind": "Status", "message": 'nodes "none" not found', "reason": "NotFound", "code": 404}


def test_an_error_answered_in_protobuf_reads_as_the_servers_own_words(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    kubeapi.add_node("n1", "10.0.0.1")
    kubeapi.fail("GET", "^/api/v1/nodes$", 403)
    with pytest.raises(KubeError) as raised:
        read(kubeapi, tmp_path)
    assert raised.value.status == 403 and "forbidden (HTTP 403) GET /api/v1/nodes: injected 403" in str(raised.value)


def test_an_expired_continue_token_restarts_a_protobuf_list(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    for index in range(5):
        kubeapi.add_node(f"n{index}", f"10.0.0.{index + 1}")
    kubeapi.fail("GET", "^/api/v1/nodes$", 410, times=1)
    nodes, _ = read(kubeapi, tmp_path)
    assert sorted(node.name for node in nodes) == [f"n{index}" for index in range(5)]


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (kube_protobuf.MAGIC + b"\xff\xff\xff", "protobuf that does not decode"),
        (k8s_protobuf.envelope("ConfigMapList", "v1", b""), "protobuf holding a ConfigMapList, not a PodList"),
        (k8s_protobuf.envelope("PodList", "v1", b"\x12\x05\x0a"), "a PodList that does not decode"),
        (k8s_protobuf.envelope("PodList", "v1", b"", "gzip"), "protobuf holding raw gzip"),
    ],
    ids=["not-protobuf", "another-kind", "truncated-item", "encoded"],
)
def test_protobuf_that_is_not_a_list_of_the_kind_asked_for_is_a_value_error(raw: bytes, said: str) -> None:
    """list_all makes a ValueError the one-line `bad_answer` (test_boundaries covers that path)."""
    with pytest.raises(ValueError, match=said):
        kube_protobuf.decode_list(raw, "PodList")


def test_fields_the_job_does_not_read_may_hold_anything() -> None:
    """Protobuf skips an unknown field whatever its wire type; a known number in another wire
    type is skipped too, as protobuf's parsers do."""
    pod = k8s_protobuf.message("Pod", objects.pod("shop", "cart-1", "n1", ("100.96.0.1",)))
    odd = pod + k8s_protobuf._key(99, 0) + k8s_protobuf._varint(7) + k8s_protobuf._bytes_field(98, b"\x00\xff")
    odd += k8s_protobuf._key(2, 0) + k8s_protobuf._varint(3)  # `spec` as a varint: not a PodSpec
    items, token = kube_protobuf.decode_list(k8s_protobuf.listing("PodList", {}, [odd]), "PodList")
    assert token is None and items[0].metadata.name == "cart-1" and items[0].spec.nodeName == "n1"


def test_a_time_no_server_holds_is_a_value_error() -> None:
    """A Node whose one taint was added 10**15 s after 1970 (Node.spec.taints[0].timeAdded)."""
    time = k8s_protobuf._key(1, 0) + k8s_protobuf._varint(10**15)
    taint = k8s_protobuf._bytes_field(1, b"k") + k8s_protobuf._bytes_field(4, time)
    node = k8s_protobuf._bytes_field(2, k8s_protobuf._bytes_field(5, taint))
    (item,), _ = kube_protobuf.decode_list(k8s_protobuf.listing("NodeList", {}, [node]), "NodeList")
    with pytest.raises(ValueError, match="timeAdded is 1000000000000000 s from 1970"):
        kube_protobuf.when(item.spec.taints[0], "timeAdded")


def test_the_calico_node_pods_read_alike_in_protobuf_and_json(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    """The health diagnosis's read: running, crash looping (with its previous log) and waiting."""
    kubeapi.add_calico_node_pod("n1")
    kubeapi.add_calico_node_pod("n2", ready=False, restarts=7, waiting="CrashLoopBackOff", log="bird: exited\n")
    kubeapi.add_calico_node_pod("n3", ready=False, waiting="ContainerCreating")
    config = Config(kubeconfig=(kubeapi.write_kubeconfig(tmp_path / "kubeconfig"),))
    kube = Kube(api_client(config), no_sleep_retry(), 2)
    kubeapi.take_encoded_bytes()
    from_protobuf = read_health(kube, config).pods
    assert "protobuf /api/v1/pods" in kubeapi.take_encoded_bytes()
    kubeapi.serves_protobuf = False
    from_json = read_health(kube, config).pods
    assert from_protobuf == from_json and from_protobuf is not None and len(from_protobuf) == 3
    looping = next(pod for pod in from_protobuf if pod.node == "n2")
    assert (looping.restarts, looping.waiting_reason, looping.last_exit_code) == (7, "CrashLoopBackOff", 1)
    assert looping.last_finished_at == "2026-11-30T11:58:02Z" and looping.previous_log == "bird: exited\n"
    assert looping.labels["k8s-app"] == "calico-node" and looping.phase == "Running"


def test_an_empty_string_is_left_out_as_the_apis_json_leaves_it() -> None:
    """Go sends a non-pointer string field even when empty, its JSON leaves it out (`omitempty`):
    a waiting calico-node container with no reason reads as one whose JSON has none. Integers stay,
    zero included (`restartCount`, `exitCode` have no `omitempty`)."""
    field = k8s_protobuf._bytes_field
    state = field(1, field(1, b""))  # waiting, with an empty reason
    container = field(1, b"calico-node") + field(2, state) + k8s_protobuf._key(5, 0) + k8s_protobuf._varint(0)
    pod = field(1, field(1, b"calico-node-a")) + field(3, field(1, b"") + field(8, container))
    as_json = {
        "kind": "PodList",
        "items": [
            {
                "metadata": {"name": "calico-node-a"},
                "status": {"containerStatuses": [{"name": "calico-node", "state": {"waiting": {}}, "restartCount": 0}]},
            }
        ],
    }
    (from_json,), _ = health.CALICO_NODE_PAGE(json.dumps(as_json).encode())
    (from_protobuf,), _ = health.CALICO_NODE_PAGE(k8s_protobuf.listing("PodList", {}, [pod]))
    read = health._calico_node_pod(from_protobuf)
    assert read == health._calico_node_pod(from_json)
    assert (read.name, read.waiting_reason, read.restarts, read.phase, read.node) == (
        "calico-node-a",
        None,
        0,
        None,
        None,
    )

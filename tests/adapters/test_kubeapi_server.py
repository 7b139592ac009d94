"""The Kubernetes API test server behaves as the real one where the job relies on it: what the
server assigns to every object written, list option validation, field selectors, paging, and
admission of Calico's objects by their CRDs' schemas and CEL rules."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support import cel, crds, objects
from tests.support.kubeapi import KubeApiServer

LEASES = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"


def call(server: KubeApiServer, method: str, path: str, body: Any = None, **query: str) -> requests.Response:
    session = requests.Session()
    session.trust_env = False
    data = None if body is None else json.dumps(body)
    return session.request(method, server.url + path, data=data, params=query, headers=server.authorization, timeout=10)


def test_created_objects_get_what_the_real_server_assigns(kubeapi: KubeApiServer) -> None:
    kubeapi.add_namespace("shop")
    pod = {"metadata": {"name": "web", "namespace": "shop", "uid": "sent", "labels": {"app": "web"}}}
    pod["spec"] = {"nodeName": "n1", "containers": [{"name": "web", "image": "web:1"}]}
    created = call(kubeapi, "POST", "/api/v1/namespaces/shop/pods", pod).json()
    metadata = created["metadata"]
    assert metadata["uid"] != "sent" and metadata["generation"] == 1 and metadata["creationTimestamp"]
    (entry,) = metadata["managedFields"]
    assert entry["manager"] == "python-requests" and entry["operation"] == "Update"
    assert entry["fieldsType"] == "FieldsV1"
    assert entry["fieldsV1"]["f:spec"]["f:containers"]['k:{"name":"web"}']["f:image"] == {}
    assert entry["fieldsV1"]["f:metadata"]["f:labels"]["f:app"] == {}
    same = call(kubeapi, "PUT", "/api/v1/namespaces/shop/pods/web", {**created, "status": {"phase": "Running"}})
    assert same.json()["metadata"]["generation"] == 1, "only a spec change raises the generation"
    assert same.json()["status"] == created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}, (
        "a pod's status is written through /status only"
    )
    status = call(
        kubeapi, "PUT", "/api/v1/namespaces/shop/pods/web/status", {**same.json(), "status": {"phase": "Running"}}
    )
    assert status.json()["status"] == {"phase": "Running"} and status.json()["spec"] == created["spec"]
    same = status
    changed = {**same.json(), "spec": {**created["spec"], "nodeName": "n2"}}
    again = call(kubeapi, "PUT", "/api/v1/namespaces/shop/pods/web", changed).json()["metadata"]
    assert again["generation"] == 2 and again["uid"] == metadata["uid"]
    assert int(again["resourceVersion"]) > int(metadata["resourceVersion"])
    # A kind whose strategy keeps no generation gets none: it keeps what its create sent, if any
    # (`rest.BeforeCreate` leaves it), and an update keeps the stored one (`rest.BeforeUpdate`).
    configmaps = "/api/v1/namespaces/shop/configmaps"
    plain = call(kubeapi, "POST", configmaps, {"metadata": {"name": "c"}, "data": {"a": "1"}}).json()
    changed = call(kubeapi, "PUT", f"{configmaps}/c", {**plain, "data": {"a": "2"}}).json()
    assert "generation" not in plain["metadata"] and "generation" not in changed["metadata"]
    sent = call(kubeapi, "POST", configmaps, {"metadata": {"name": "d", "generation": 7}, "data": {}}).json()
    moved = {**sent, "metadata": {**sent["metadata"], "generation": 1}, "data": {"a": "2"}}
    assert sent["metadata"]["generation"] == 7
    assert call(kubeapi, "PUT", f"{configmaps}/d", moved).json()["metadata"]["generation"] == 7


def test_a_request_without_the_servers_token_is_a_401_in_the_format_asked_for(kubeapi: KubeApiServer) -> None:
    """As a server with anonymous requests off: no token, or another one, is refused first."""
    for headers in ({}, {"Authorization": "Bearer another"}, {"Authorization": "test-token"}):
        answer = requests.get(f"{kubeapi.url}/api/v1/nodes", headers=headers, timeout=10)
        assert answer.status_code == 401 and answer.json()["reason"] == "Unauthorized"
    asked = {"Accept": "application/vnd.kubernetes.protobuf, application/json", "Authorization": "Bearer x"}
    answer = requests.get(f"{kubeapi.url}/api/v1/nodes", headers=asked, timeout=10)
    assert answer.status_code == 401 and answer.content.startswith(b"k8s\x00")
    assert call(kubeapi, "GET", "/api/v1/nodes").status_code == 200


def test_lists_validate_their_options_and_select_pods_by_field(kubeapi: KubeApiServer) -> None:
    for name, host_network in (("a", False), ("b", True), ("c", False)):
        kubeapi.put(
            "/api/v1/namespaces/ns/pods",
            {"metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": "n1", "hostNetwork": host_network}},
        )
    assert call(kubeapi, "GET", "/api/v1/pods", resourceVersionMatch="NotOlderThan").status_code == 400
    first = call(kubeapi, "GET", "/api/v1/pods", limit="1").json()
    token = first["metadata"]["continue"]
    assert first["metadata"]["remainingItemCount"] == 2
    assert (
        call(kubeapi, "GET", "/api/v1/pods", limit="1", resourceVersion="5", **{"continue": token}).status_code == 400
    )
    assert call(kubeapi, "GET", "/api/v1/pods", fieldSelector="spec.color=blue").status_code == 400
    names, token = [], ""
    while True:
        page = call(
            kubeapi, "GET", "/api/v1/pods", limit="1", fieldSelector="spec.hostNetwork=false", **{"continue": token}
        )
        names += [item["metadata"]["name"] for item in page.json()["items"]]
        assert "remainingItemCount" not in page.json()["metadata"], "unknown under a selector, as the real server"
        token = page.json()["metadata"].get("continue", "")
        if not token:
            break
    assert names == ["a", "c"]
    off_node = call(kubeapi, "GET", "/api/v1/pods", fieldSelector="spec.nodeName!=n1").json()["items"]
    assert off_node == []


# Label selectors as apimachinery's labels.Parse and Requirement.Matches take them.
LABELLED = {
    "p1": {"x": "y"},
    "p2": {"x": "z", "z": "a"},
    "p3": {"y": ""},
    "p4": {"z": "2"},
    "p5": {"z": "v2"},
    "p6": {},
    "p7": {"notin": "in"},
}


def test_a_read_stores_nothing(kubeapi: KubeApiServer) -> None:
    """A list or get of a collection that holds nothing leaves the server's store as it was: a
    finished run's read still in flight must not change what a test is looking at."""
    before = kubeapi.copy_under("/")
    assert call(kubeapi, "GET", "/api/v1/namespaces/empty/pods").json()["items"] == []
    assert call(kubeapi, "GET", "/api/v1/namespaces/empty/pods/none").status_code == 404
    assert call(kubeapi, "GET", "/apis/coordination.k8s.io/v1/namespaces/empty/leases").status_code == 200
    assert kubeapi.copy_under("/") == before


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("", "p1 p2 p3 p4 p5 p6 p7"),
        ("x=y", "p1"),
        ("x==y", "p1"),
        ("x!=y", "p2 p3 p4 p5 p6 p7"),  # a label that is not there is not equal
        ("x", "p1 p2"),
        ("!x", "p3 p4 p5 p6 p7"),
        ("x in (y, z)", "p1 p2"),
        ("x notin (y)", "p2 p3 p4 p5 p6 p7"),
        ("z>1", "p4"),  # only a whole number compares: v2 does not
        ("z<3,x", ""),
        ("x notin (),y", "p3"),
        ("y in ()", "p3"),  # () is the empty value
        ("notin=in", "p7"),  # in and notin are values after an operator
        ("x,y in (a)", ""),
    ],
)
def test_label_selectors_select_as_the_real_server(kubeapi: KubeApiServer, selector: str, names: str) -> None:
    for name, labels in LABELLED.items():
        kubeapi.put("/api/v1/namespaces/ns/pods", {"metadata": {"name": name, "namespace": "ns", "labels": labels}})
    page = call(kubeapi, "GET", "/api/v1/namespaces/ns/pods", labelSelector=selector)
    assert page.status_code == 200, page.text
    assert [item["metadata"]["name"] for item in page.json()["items"]] == names.split()


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("x===", "unable to parse requirement: found '=', expected: identifier"),
        ("x in (a", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("!x=a", "found '=', expected: ',' or 'end of string'"),
        ("x y", "unable to parse requirement: found 'y', expected: in, notin, =, ==, !=, gt, lt"),
        ("x<a", "for 'Gt', 'Lt' operators, the value must be an integer"),
        ("Bad_/x", 'Invalid value: "Bad_/x": prefix part a lowercase RFC 1123 subdomain'),
    ],
)
def test_a_malformed_label_selector_is_a_400_in_the_servers_words(
    kubeapi: KubeApiServer, selector: str, message: str
) -> None:
    answer = call(kubeapi, "GET", "/api/v1/pods", labelSelector=selector)
    assert answer.status_code == 400 and answer.json()["reason"] == "BadRequest"
    assert message in answer.json()["message"]


@pytest.mark.parametrize(
    ("collection", "qualified"),
    [("/api/v1/namespaces/ns/configmaps", "ConfigMap"), (LEASES, "Lease.coordination.k8s.io")],
)
def test_a_built_in_object_whose_name_is_no_dns_subdomain_is_a_422(
    kubeapi: KubeApiServer, collection: str, qualified: str
) -> None:
    kubeapi.add_namespace("ns")
    answer = call(kubeapi, "POST", collection, {"metadata": {"name": "Calico_GC"}})
    assert answer.status_code == 422 and answer.json()["reason"] == "Invalid"
    assert answer.json()["message"].startswith(
        f'{qualified} "Calico_GC" is invalid: metadata.name: Invalid value: "Calico_GC": a lowercase RFC 1123 subdomain'
    )
    assert call(kubeapi, "POST", collection, {"metadata": {"name": "calico-gc"}}).status_code == 201


@pytest.mark.parametrize(
    "collection",
    ["/api/v1/namespaces/absent/configmaps", "/apis/coordination.k8s.io/v1/namespaces/absent/leases"],
)
def test_a_create_in_a_namespace_that_does_not_exist_is_a_404(kubeapi: KubeApiServer, collection: str) -> None:
    """NamespaceLifecycle answers before the object is validated: even a bad name is a 404 there.
    Reads are not refused: a list in a namespace that does not exist is empty."""
    answer = call(kubeapi, "POST", collection, {"metadata": {"name": "Calico_GC"}})
    assert answer.status_code == 404 and answer.json()["reason"] == "NotFound"
    assert answer.json()["message"] == 'namespaces "absent" not found'
    assert answer.json()["details"] == {"name": "absent", "kind": "namespaces"}
    listed = call(kubeapi, "GET", collection)
    assert listed.status_code == 200 and listed.json()["items"] == []
    assert call(kubeapi, "GET", f"{collection}/calico-gc").json()["reason"] == "NotFound"
    kubeapi.add_namespace("absent")
    assert call(kubeapi, "POST", collection, {"metadata": {"name": "calico-gc"}}).status_code == 201


def test_a_create_in_a_namespace_being_deleted_is_a_403_and_an_update_is_not(kubeapi: KubeApiServer) -> None:
    """NamespaceLifecycle refuses only creates in a terminating namespace, naming the object (its
    generateName before a name is generated) and the NamespaceTerminating cause."""
    kubeapi.add_namespace("going")
    created = call(kubeapi, "POST", "/apis/coordination.k8s.io/v1/namespaces/going/leases", {"metadata": {"name": "l"}})
    kubeapi.terminating.add("going")
    answer = call(kubeapi, "POST", "/apis/coordination.k8s.io/v1/namespaces/going/leases", {"metadata": {"name": "m"}})
    assert answer.status_code == 403 and answer.json()["reason"] == "Forbidden"
    assert answer.json()["message"] == (
        'leases.coordination.k8s.io "m" is forbidden: '
        "unable to create new content in namespace going because it is being terminated"
    )
    cause = {"type": "NamespaceTerminating", "message": "namespace going is being terminated"}
    details = {"name": "m", "group": "coordination.k8s.io", "kind": "leases"}
    assert answer.json()["details"] == {**details, "causes": [{**cause, "field": "metadata.namespace"}]}
    named = call(kubeapi, "POST", "/api/v1/namespaces/going/events", event(NODE)).json()
    assert named["message"].startswith('events "calico-gc-" is forbidden: ') and named["details"]["group"] == ""
    updated = call(kubeapi, "PUT", "/apis/coordination.k8s.io/v1/namespaces/going/leases/l", created.json())
    assert updated.status_code == 200, "an update in a terminating namespace is taken"


def test_a_new_cluster_has_its_four_namespaces_and_a_seeds_namespace_exists_with_it(kubeapi: KubeApiServer) -> None:
    for namespace in ("default", "kube-system", "kube-public", "kube-node-lease"):
        assert call(kubeapi, "POST", f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "a"}}).ok
    assert call(kubeapi, "POST", "/api/v1/namespaces/shop/configmaps", {"metadata": {"name": "a"}}).status_code == 404
    kubeapi.add_pod("shop", "web", None)
    assert call(kubeapi, "POST", "/api/v1/namespaces/shop/configmaps", {"metadata": {"name": "a"}}).status_code == 201


def event(involved: dict[str, str], **fields: Any) -> dict[str, Any]:
    return {"metadata": {"generateName": "calico-gc-"}, "involvedObject": involved, "reason": "Why", **fields}


NODE, POD = {"kind": "Node", "name": "n1"}, {"kind": "Pod", "name": "p", "namespace": "calico-gc"}
TIMED = {"eventTime": "2026-12-04T12:00:00.000000Z", "reportingComponent": "calico-gc", "reportingInstance": "p"}


@pytest.mark.parametrize(
    ("namespace", "body", "causes"),
    [
        ("default", event(NODE), []),
        ("default", event(NODE, message="x" * 2000), []),  # no limit without an eventTime
        ("kube-system", event(NODE), ['involvedObject.namespace: Invalid value: "": does not match event.namespace']),
        ("calico-gc", event(POD), []),
        (
            "default",
            event(POD),
            ['involvedObject.namespace: Invalid value: "calico-gc": does not match event.namespace'],
        ),
        ("kube-system", event(NODE, action="Delete", **TIMED), []),
        ("default", event(POD, action="Delete", **TIMED), []),  # not matched where it has an eventTime
        (
            "calico-gc",
            event(NODE, **TIMED),
            [
                'involvedObject.namespace: Invalid value: "": does not match event.namespace',
                "action: Required value",
            ],
        ),
        (
            "default",
            event(NODE, eventTime=TIMED["eventTime"], action="a" * 129, message="m" * 1025),
            [
                "reportingController: Required value",
                'reportingController: Invalid value: "": name part must be non-empty',
                "reportingInstance: Required value",
                'action: Invalid value: "": can have at most 128 characters',
                'message: Invalid value: "": can have at most 1024 characters',
            ],
        ),
        ("default", {**event(NODE), "metadata": {"name": "Calico_GC"}}, []),  # only a path segment
        (
            "default",
            {**event(NODE), "metadata": {"name": "a/b%"}},
            [
                "metadata.name: Invalid value: \"a/b%\": may not contain '/'",
                "metadata.name: Invalid value: \"a/b%\": may not contain '%'",
            ],
        ),
    ],
)
def test_a_core_event_is_admitted_as_the_real_server_admits_it(
    kubeapi: KubeApiServer, namespace: str, body: dict[str, Any], causes: list[str]
) -> None:
    """legacyValidateEvent, the only rules of a core/v1 Event, and its name as a path segment."""
    answer = call(kubeapi, "POST", f"/api/v1/namespaces/{namespace}/events", body)
    if not causes:
        assert answer.status_code == 201, answer.json()
        assert answer.json()["metadata"]["namespace"] == namespace, "the request's namespace is the object's"
        return
    assert answer.status_code == 422 and answer.json()["reason"] == "Invalid"
    assert [f"{c['field']}: {c['message']}" for c in answer.json()["details"]["causes"]] == causes
    said = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
    assert answer.json()["message"].endswith(f" is invalid: {said}") and answer.json()["message"].startswith("Event ")


@pytest.mark.parametrize(
    ("spec", "causes"),
    [
        ({"holderIdentity": "run-1", "leaseDurationSeconds": 1, "leaseTransitions": 0}, []),
        ({"leaseDurationSeconds": 0}, ["spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"]),
        ({"leaseTransitions": -1}, ["spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0"]),
        (
            {"strategy": "Newest"},
            ['spec.strategy.strategy: Unsupported value: "Newest": supported values: "OldestEmulationVersion"'],
        ),
        ({"strategy": "example.com/mine", "preferredHolder": "a"}, []),
        (
            {"preferredHolder": "a"},
            ["spec.preferredHolder: Forbidden: may only be specified if `strategy` is defined"],
        ),
    ],
)
def test_a_lease_is_admitted_as_the_real_server_admits_it(
    kubeapi: KubeApiServer, spec: dict[str, Any], causes: list[str]
) -> None:
    """ValidateLeaseSpec, on create and on update: the job's release shortens the Lease to 1 s."""
    answer = call(kubeapi, "POST", LEASES.replace("/ns/", "/calico-gc/"), {"metadata": {"name": "l"}, "spec": spec})
    if causes:
        assert answer.status_code == 422
        assert [f"{c['field']}: {c['message']}" for c in answer.json()["details"]["causes"]] == causes
        assert answer.json()["message"].startswith('Lease.coordination.k8s.io "l" is invalid: ')
        created = call(kubeapi, "POST", LEASES.replace("/ns/", "/calico-gc/"), {"metadata": {"name": "l"}}).json()
        again = call(kubeapi, "PUT", LEASES.replace("/ns/", "/calico-gc/") + "/l", {**created, "spec": spec})
        assert again.status_code == 422, "an update is held to the same rules"
    else:
        assert answer.status_code == 201, answer.json()


LEASE = "/apis/coordination.k8s.io/v1/namespaces/calico-gc/leases"
EVENT = "/api/v1/namespaces/default/events"
CONFIGMAP = "/api/v1/namespaces/calico-gc/configmaps"
MICRO = '"2006-01-02T15:04:05.000000Z07:00"'


@pytest.mark.parametrize(
    ("path", "body", "problem"),
    [
        # Accepted: what the job writes, nulls, a fraction a Time does not name, a field unknown here.
        (LEASE, {"spec": {"leaseDurationSeconds": 15, "renewTime": "2026-12-04T10:00:00.123456Z"}}, None),
        (
            EVENT,
            {"involvedObject": {"kind": "Node"}, "count": None, "firstTimestamp": "2026-12-04T10:00:00.5+01:00"},
            None,
        ),
        (CONFIGMAP, {"data": {"a": "b"}, "binaryData": {"c": "YWJj"}, "newField": 1}, None),
        (
            LEASE,
            {"spec": {"leaseDurationSeconds": "15"}},
            "json: cannot unmarshal string into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32",
        ),
        (
            LEASE,
            {"spec": {"leaseTransitions": 1.5}},
            "json: cannot unmarshal number 1.5 into Go struct field LeaseSpec.spec.leaseTransitions of type int32",
        ),
        (
            EVENT,
            {"involvedObject": {"kind": "Node"}, "count": 3.0},
            "json: cannot unmarshal number 3.0 into Go struct field Event.count of type int32",
        ),
        (
            LEASE,
            {"spec": {"leaseDurationSeconds": 2**31}},
            "json: cannot unmarshal number 2147483648 into Go struct field LeaseSpec.spec.leaseDurationSeconds"
            " of type int32",
        ),
        (
            LEASE,
            {"spec": {"renewTime": "2026-12-04T10:00:00Z"}},
            f'parsing time "2026-12-04T10:00:00Z" as {MICRO}: cannot parse "Z" as ".000000"',
        ),
        (
            LEASE,
            {"spec": {"acquireTime": "2026-12-04T10:00:00.123Z"}},
            f'parsing time "2026-12-04T10:00:00.123Z" as {MICRO}: cannot parse ".123Z" as ".000000"',
        ),
        (
            EVENT,
            {"involvedObject": {"kind": "Node"}, "lastTimestamp": "2026-02-30T00:00:00Z"},
            'parsing time "2026-02-30T00:00:00Z": day out of range',
        ),
        (
            EVENT,
            {"involvedObject": {"kind": "Node"}, "firstTimestamp": "2026-12-04 10:00:00Z"},
            'parsing time "2026-12-04 10:00:00Z" as "2006-01-02T15:04:05Z07:00": cannot parse " 10:00:00Z" as "T"',
        ),
        (
            EVENT,
            {"involvedObject": {"kind": "Node"}, "eventTime": 1},
            "json: cannot unmarshal number into Go struct field Event.eventTime of type string",
        ),
        (
            EVENT,
            {"involvedObject": "Node", "count": True},
            "json: cannot unmarshal string into Go struct field Event.involvedObject of type v1.ObjectReference",
        ),
        (
            CONFIGMAP,
            {"data": {"a": 1}, "immutable": "true"},
            "json: cannot unmarshal number into Go struct field ConfigMap.data of type string",
        ),
        (
            CONFIGMAP,
            {"metadata": {"labels": ["a"], "generation": "1"}},
            "json: cannot unmarshal array into Go struct field ObjectMeta.metadata.labels of type map[string]string",
        ),
        (
            CONFIGMAP,
            {"metadata": {"finalizers": "a", "generation": 1.5}},
            "json: cannot unmarshal string into Go struct field ObjectMeta.metadata.finalizers of type []string",
        ),
        (CONFIGMAP, {"binaryData": {"c": "YW%j"}}, "illegal base64 data at input byte 2"),
    ],
)
def test_a_built_in_body_is_decoded_as_the_real_servers_typed_decoder_decodes_it(
    kubeapi: KubeApiServer, path: str, body: dict[str, Any], problem: str | None
) -> None:
    """A field of the wrong JSON type, a time its layout does not parse (a Lease's are MicroTime:
    six digits of fraction), bytes that are not base64: a 400 before anything else is checked, on
    create and on update. The first type error is said; a time's stops the decoder at once."""
    kind = {LEASE: "Lease", EVENT: "Event", CONFIGMAP: "ConfigMap"}[path]
    sent = {**body, "metadata": {"name": "x", **body.get("metadata", {})}}
    answer = call(kubeapi, "POST", path, sent)
    if problem is None:
        assert answer.status_code == 201, answer.json()
        return
    assert answer.status_code == 400 and answer.json()["reason"] == "BadRequest"
    assert answer.json()["message"] == f'{kind} in version "v1" cannot be handled as a {kind}: {problem}'
    created = call(kubeapi, "POST", path, {"metadata": {"name": "x"}, "involvedObject": {"kind": "Node"}}).json()
    metadata = {**sent["metadata"], "resourceVersion": created["metadata"]["resourceVersion"]}
    again = call(kubeapi, "PUT", f"{path}/x", {**sent, "metadata": metadata})
    assert again.status_code == 400 and again.json()["message"].endswith(problem), "an update is decoded the same"


def test_a_seed_the_typed_decoder_refuses_fails_the_test(kubeapi: KubeApiServer) -> None:
    """A test cannot hold the job to a Lease no real server would store."""
    held = {"metadata": {"name": "calico-gc"}, "spec": {"holderIdentity": "other", "renewTime": "2026-12-04T10:00:00Z"}}
    with pytest.raises(AssertionError, match='would refuse this seed: Lease in version "v1" cannot be handled'):
        kubeapi.put(LEASE, held)
    held["spec"]["renewTime"] = "2026-12-04T10:00:00.000000Z"
    assert kubeapi.put(LEASE, held)["metadata"]["resourceVersion"]


def test_a_time_error_ends_the_decoding_and_a_type_error_does_not(kubeapi: KubeApiServer) -> None:
    """Go's decoder keeps the first type error and goes on; a time's own UnmarshalJSON failing
    ends it, and that error is the one said."""
    sent = {"metadata": {"name": "x", "generation": "1"}, "spec": {"renewTime": "now"}}
    answer = call(kubeapi, "POST", LEASE, sent)
    assert answer.json()["message"].endswith(f'parsing time "now" as {MICRO}: cannot parse "now" as "2006"')
    review = {"spec": {"resourceAttributes": {"verb": ["list"]}}}
    answer = call(kubeapi, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    field = "ResourceAttributes.spec.resourceAttributes.verb"
    assert answer.status_code == 400
    assert answer.json()["message"].endswith(f"cannot unmarshal array into Go struct field {field} of type string")


def test_an_objects_namespace_is_the_requests(kubeapi: KubeApiServer) -> None:
    sent = {"metadata": {"name": "a", "namespace": "default"}}
    answer = call(kubeapi, "POST", "/api/v1/namespaces/kube-system/configmaps", sent)
    assert answer.status_code == 400 and answer.json()["reason"] == "BadRequest"
    assert (
        answer.json()["message"]
        == "the namespace of the provided object does not match the namespace sent on the request"
    )
    created = call(kubeapi, "POST", "/api/v1/namespaces/kube-system/configmaps", {"metadata": {"name": "a"}})
    assert created.json()["metadata"]["namespace"] == "kube-system"
    node = call(kubeapi, "POST", "/api/v1/nodes", {"metadata": {"name": "n1", "namespace": "default"}}).json()
    assert "namespace" not in node["metadata"], "a cluster-scoped object's namespace is cleared"


# With Calico's CRDs (../shared/calico-crds): writes are admitted as the real server admits them.
needs_crds = pytest.mark.skipif(not crds.available(), reason="Calico's CRDs are not beside the checkout (../shared)")
CRD = "/apis/crd.projectcalico.org/v1"


def block(name: str = "10-0-0-0-26", **spec: Any) -> dict[str, Any]:
    body = {
        "cidr": "10.0.0.0/26",
        "allocations": [None] * 64,
        "unallocated": list(range(64)),
        "attributes": [],
        "strictAffinity": False,
        **spec,
    }
    return {"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock", "metadata": {"name": name}, "spec": body}


@needs_crds
@pytest.mark.parametrize(
    ("path", "body", "field", "said"),
    [
        (
            f"{CRD}/ipamblocks",
            block(deleted="true"),  # v1 wants a boolean here (a BlockAffinity's `deleted` is the string)
            "spec.deleted",
            'Invalid value: "string": spec.deleted in body must be of type boolean: "string"',
        ),
        (f"{CRD}/ipamblocks", block(strictAffinity=None), "spec.strictAffinity", "Required value"),
        (
            f"{CRD}/ipamblocks",
            block(affinityClaimTime="yesterday"),
            "spec.affinityClaimTime",
            'Invalid value: "yesterday": spec.affinityClaimTime in body must be of type date-time: "yesterday"',
        ),
        (
            f"{CRD}/ipamblocks",
            block(unallocated=[1, "2"]),
            "spec.unallocated[1]",
            'Invalid value: "string": spec.unallocated[1] in body must be of type integer: "string"',
        ),
        (
            f"{CRD}/ipamconfigs",
            {
                "metadata": {"name": "default"},
                "spec": {"autoAllocateBlocks": True, "strictAffinity": False, "ipCooldownSeconds": 1201},
            },
            "spec.ipCooldownSeconds",
            "Invalid value: 1201: spec.ipCooldownSeconds in body should be less than or equal to 1200",
        ),
        (
            f"{CRD}/ipamconfigs",
            {
                "metadata": {"name": "default"},
                "spec": {"autoAllocateBlocks": True, "strictAffinity": False, "kubeVirtVMAddressPersistence": "On"},
            },
            "spec.kubeVirtVMAddressPersistence",
            'Unsupported value: "On": supported values: "Enabled", "Disabled"',
        ),
        (
            f"{CRD}/felixconfigurations",
            {"metadata": {"name": "node.a"}, "spec": {"logSeverityScreen": "Loud"}},
            "spec.logSeverityScreen",
            'Invalid value: "Loud": spec.logSeverityScreen in body should match '
            "'^(?i)(Trace|Debug|Info|Warning|Error|Fatal)?$'",
        ),
        (
            f"{CRD}/blockaffinities",
            {
                "metadata": {"name": "Node_A-10-0-0-0-26"},
                "spec": {"cidr": "10.0.0.0/26", "node": "a", "state": "confirmed", "deleted": "false"},
            },
            "metadata.name",
            'Invalid value: "Node_A-10-0-0-0-26": a lowercase RFC 1123 subdomain must consist of lower case '
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        ),
    ],
    ids=["type", "required", "format", "item-type", "maximum", "enum", "pattern", "name"],
)
def test_a_calico_write_the_real_server_refuses_is_a_422_in_its_shape(
    kubeapi: KubeApiServer, path: str, body: dict[str, Any], field: str, said: str
) -> None:
    if body["spec"].get("strictAffinity", False) is None:
        del body["spec"]["strictAffinity"]
    answer = call(kubeapi, "POST", path, body)
    assert answer.status_code == 422, answer.text
    status = answer.json()
    kind = {
        "ipamblocks": "IPAMBlock",
        "ipamconfigs": "IPAMConfig",
        "felixconfigurations": "FelixConfiguration",
        "blockaffinities": "BlockAffinity",
    }[path.rsplit("/", 1)[1]]
    name = body["metadata"]["name"]
    assert (status["kind"], status["status"], status["reason"], status["code"]) == ("Status", "Failure", "Invalid", 422)
    assert status["message"] == f'{kind}.crd.projectcalico.org "{name}" is invalid: {field}: {said}'
    assert status["details"]["causes"] == [
        {"reason": status["details"]["causes"][0]["reason"], "message": said, "field": field}
    ]
    assert (status["details"]["kind"], status["details"]["group"]) == (kind, "crd.projectcalico.org")
    assert call(kubeapi, "GET", f"{path}/{name}").status_code == 404, "nothing stored"
    with pytest.raises(AssertionError, match="the real API server would refuse this seed"):
        kubeapi.put(path, body)


def pool(cidr: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pool"}, "spec": {"cidr": cidr, **spec}}


@needs_crds
@pytest.mark.parametrize(
    ("path", "body", "field", "said"),
    [
        (
            f"{CRD}/ippools",
            pool("10.0.0.1/16"),
            "spec",
            'Invalid value: "object": IPPool CIDR must be strictly masked',
        ),
        (
            f"{CRD}/ippools",
            pool("fd00::/112", ipipMode="Always"),
            "spec",
            "Forbidden: IPIP is not supported on IPv6 pools",  # the rule's reason: FieldValueForbidden
        ),
        (
            f"{CRD}/felixconfigurations",
            {"metadata": {"name": "node.a"}, "spec": {"nodeSelector": "all()"}},
            "<nil>",  # a rule on the object itself: the real server names no field
            "Forbidden: nodeSelector must not be set on the 'default' or per-node ('node.*') FelixConfiguration",
        ),
        (
            f"{CRD}/felixconfigurations",
            {"metadata": {"name": "node.a"}, "spec": {"routeTableRange": {"min": 0, "max": 250}}},
            "spec.routeTableRange",
            'Invalid value: "object": must be a range of route table indices within 1..250',
        ),
        (
            f"{CRD}/felixconfigurations",
            {"metadata": {"name": "node.a"}, "spec": {"natOutgoingAddress": "::ffff:10.0.0.1"}},
            "spec",  # an IPv4-mapped IPv6 address is no IP to Kubernetes' isIP()
            'Invalid value: "object": natOutgoingAddress must be a valid IPv4 address',
        ),
        (
            f"{CRD}/hostendpoints",
            {"metadata": {"name": "a-eth0"}, "spec": {"node": "a"}},
            "spec",
            'Invalid value: "object": at least one of interfaceName or expectedIPs must be specified',
        ),
        (
            f"{CRD}/bgppeers",
            {"metadata": {"name": "a-peer"}, "spec": {"node": "a", "nodeSelector": "all()", "peerIP": "10.0.0.9"}},
            "spec",
            "Forbidden: node and nodeSelector cannot both be set",
        ),
    ],
    ids=["pool-masked", "pool-ipip-v6", "root", "nested", "mapped-ip", "hostendpoint", "bgppeer"],
)
def test_a_crds_cel_rules_refuse_what_the_real_server_refuses(
    kubeapi: KubeApiServer, path: str, body: dict[str, Any], field: str, said: str
) -> None:
    """Calico's x-kubernetes-validations rules, on the kinds a restore creates and the tests seed."""
    answer = call(kubeapi, "POST", path, body)
    assert answer.status_code == 422, answer.text
    status = answer.json()
    assert status["message"].endswith(f'"{body["metadata"]["name"]}" is invalid: {field}: {said}')
    reason = "FieldValueForbidden" if said.startswith("Forbidden: ") else "FieldValueInvalid"
    assert status["details"]["causes"] == [{"reason": reason, "message": said, "field": field}]
    assert call(kubeapi, "GET", f"{path}/{body['metadata']['name']}").status_code == 404, "nothing stored"
    with pytest.raises(AssertionError, match="the real API server would refuse this seed"):
        kubeapi.put(path, body)


@needs_crds
def test_cel_transition_rules_judge_an_update_and_type_errors_block_the_rules(kubeapi: KubeApiServer) -> None:
    created = call(kubeapi, "POST", f"{CRD}/ippools", pool("10.0.0.0/16", blockSize=26))
    assert created.status_code == 201, created.text  # a create has no oldSelf: the transition rules wait
    stored = created.json()
    moved = {**stored, "spec": {**stored["spec"], "cidr": "10.1.0.0/16"}}
    answer = call(kubeapi, "PUT", f"{CRD}/ippools/pool", moved)
    assert answer.status_code == 422, answer.text
    said = 'Invalid value: "string": CIDR cannot be changed; follow IP pool migration guide to avoid corruption.'
    assert answer.json()["details"]["causes"] == [
        {"reason": "FieldValueInvalid", "message": said, "field": "spec.cidr"}
    ]
    kept = {**stored, "spec": {**stored["spec"], "disabled": True}}
    assert call(kubeapi, "PUT", f"{CRD}/ippools/pool", kept).status_code == 200, "the same cidr and block size"
    with pytest.raises(AssertionError, match="CIDR cannot be changed"):  # a seed is judged as a write
        kubeapi.put(f"{CRD}/ippools", {**moved, "metadata": {"name": "pool"}})
    # A type error blocks the rules (the pool's unmasked CIDR is not judged), as the real server does.
    answer = call(
        kubeapi, "POST", f"{CRD}/ippools", {**pool("10.9.0.1/16", blockSize="26"), "metadata": {"name": "p2"}}
    )
    causes = answer.json()["details"]["causes"]
    assert [c["field"] for c in causes] == ["spec.blockSize", "<nil>"], causes
    assert causes[1]["message"] == f"Invalid value: null: {cel.NOT_CHECKED}"


@pytest.mark.parametrize(
    "expression",
    [
        "isIP('10.0.0.1') && !isIP('010.0.0.1') && !isIP('::ffff:10.0.0.1') && !isIP('fe80::1%eth0')",
        "isCIDR('10.0.0.1/24') && !isCIDR('10.0.0.0') && !isCIDR('10.0.0.0/33')",
        "cidr('10.0.0.1/24').masked() == cidr('10.0.0.0/24') && cidr('10.0.0.1/24') != cidr('10.0.0.0/24')",
        "cidr('10.0.0.0/24').containsIP('10.0.0.9') && !cidr('10.0.0.0/24').containsIP(ip('10.0.1.0'))",
        "cidr('10.0.0.0/16').containsCIDR('10.0.3.0/24') && !cidr('10.0.0.0/24').containsCIDR('10.0.0.0/16')",
        "ip('fd00::1').family() == 6 && cidr('10.0.0.0/8').ip().family() == 4",
        "cidr('fd00::/64').prefixLength() == 64",
    ],
)
def test_the_ip_and_cidr_library_parses_as_kubernetes_does(expression: str) -> None:
    """Each expression is true as Kubernetes evaluates it; here a false one or an error is a failure."""
    assert not cel.failures(
        {"type": "object", "x-kubernetes-validations": [{"rule": expression}]},
        {"metadata": {"name": "x"}},
        None,
    )


def _rules(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        yield from (str(rule["rule"]) for rule in node.get("x-kubernetes-validations") or ())
        for value in node.values():
            yield from _rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _rules(value)


@needs_crds
def test_every_rule_in_calicos_crds_compiles_and_calls_what_is_given() -> None:
    """A rule this server cannot evaluate would refuse what the real server takes."""
    rules = {rule for crd in crds.calico(crds.V1_FILE, crds.V3_FILE) for rule in _rules(crd.schema)}
    assert len(rules) > 50, "Calico's CRDs have dozens of distinct rules"
    builtins = {"has", "size", "all", "exists", "exists_one", "map", "filter", "contains", "startsWith", "endsWith"}
    for rule in rules:
        called = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\(", re.sub(r"'[^']*'", "''", rule)))
        assert called <= builtins | set(cel.FUNCTIONS), (rule, called - builtins - set(cel.FUNCTIONS))
        assert cel.failures({"x-kubernetes-validations": [{"rule": f"true || ({rule})"}]}, {}, None) == [], rule


@needs_crds
def test_an_update_without_a_resource_version_is_unconditional_but_not_for_a_custom_resource(
    kubeapi: KubeApiServer,
) -> None:
    """A built-in kind's strategy allows an unconditional update: it writes over whatever is
    stored. A custom resource's does not: a 422 naming metadata.resourceVersion."""
    kubeapi.add_namespace("shop")
    created = call(kubeapi, "POST", "/api/v1/namespaces/shop/configmaps", {"metadata": {"name": "c"}}).json()
    call(kubeapi, "PUT", "/api/v1/namespaces/shop/configmaps/c", {**created, "data": {"a": "1"}})  # moved on
    blind = {"metadata": {"name": "c"}, "data": {"a": "2"}}
    over = call(kubeapi, "PUT", "/api/v1/namespaces/shop/configmaps/c", blind)
    assert over.status_code == 200 and over.json()["data"] == {"a": "2"}
    assert kubeapi.unconditional_writes == [("/api/v1/namespaces/shop/configmaps", "c")]
    kubeapi.unconditional_writes.clear()  # the fixture fails a test whose writes were unconditional
    kubeapi.put(f"{CRD}/ipamblocks", block())
    refused = call(kubeapi, "PUT", f"{CRD}/ipamblocks/10-0-0-0-26", block(deleted=True))
    assert refused.status_code == 422 and refused.json()["message"] == (
        'ipamblocks.crd.projectcalico.org "10-0-0-0-26" is invalid: metadata.resourceVersion: '
        "Invalid value: 0x0: must be specified for an update"
    )
    assert (
        refused.json()["details"]["kind"] == "ipamblocks"
        and "deleted" not in kubeapi.get(f"{CRD}/ipamblocks", "10-0-0-0-26")["spec"]
    )


@needs_crds
def test_the_stores_errors_name_the_resource_with_its_group_and_a_deletes_preconditions_the_kind(
    kubeapi: KubeApiServer,
) -> None:
    """NotFound, AlreadyExists and an update's Conflict name `<plural>.<group>` (the store's
    qualifiedResource); a delete's preconditions are checked first by `rest.BeforeDelete`, which
    names `<Kind>.<group>`, the UID before the resourceVersion."""
    path = f"{CRD}/ipamblocks"
    named = 'ipamblocks.crd.projectcalico.org "10-0-0-0-26"'
    missing = call(kubeapi, "GET", f"{path}/10-0-0-0-26")
    assert missing.status_code == 404 and missing.json()["message"] == f"{named} not found"
    assert missing.json()["details"] == {"name": "10-0-0-0-26", "group": "crd.projectcalico.org", "kind": "ipamblocks"}
    stored = kubeapi.put(path, block())
    again = call(kubeapi, "POST", path, block())
    assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")
    assert again.json()["message"] == f"{named} already exists"
    stale = {**block(deleted=True), "metadata": {"name": "10-0-0-0-26", "resourceVersion": "1"}}
    moved = call(kubeapi, "PUT", f"{path}/10-0-0-0-26", stale).json()["message"]
    assert moved.startswith(f"Operation cannot be fulfilled on {named}: the object has been modified")
    uid, version = stored["metadata"]["uid"], stored["metadata"]["resourceVersion"]
    kind = 'Operation cannot be fulfilled on IPAMBlock.crd.projectcalico.org "10-0-0-0-26"'
    for preconditions, said in (
        (
            {"uid": "other", "resourceVersion": "1"},
            f"the UID in the precondition (other) does not match the UID in record ({uid}). "
            "The object might have been deleted and then recreated",
        ),
        (
            {"uid": uid, "resourceVersion": "1"},
            f"the ResourceVersion in the precondition (1) does not match the ResourceVersion in record ({version}). "
            "The object might have been modified",
        ),
    ):
        refused = call(kubeapi, "DELETE", f"{path}/10-0-0-0-26", {"preconditions": preconditions})
        assert refused.status_code == 409 and refused.json()["message"] == f"{kind}: {said}"
        assert refused.json()["details"]["kind"] == "IPAMBlock"
    assert kubeapi.get(path, "10-0-0-0-26") is not None


@needs_crds
def test_a_delete_answers_a_status_but_where_the_store_returns_the_object(kubeapi: KubeApiServer) -> None:
    """A custom resource's delete, as most kinds', answers a Status of Success naming what went;
    a pod's answers the pod (its store's ReturnDeletedObject)."""
    stored = kubeapi.put(f"{CRD}/ipamblocks", block())
    gone = call(kubeapi, "DELETE", f"{CRD}/ipamblocks/10-0-0-0-26").json()
    details = {"name": "10-0-0-0-26", "group": "crd.projectcalico.org", "kind": "ipamblocks"}
    assert gone == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {**details, "uid": stored["metadata"]["uid"]},
    }
    kubeapi.add_pod("shop", "cart", "n1", "10.0.0.5")
    pod = call(kubeapi, "DELETE", "/api/v1/namespaces/shop/pods/cart").json()
    assert (pod["kind"], pod["metadata"]["name"]) == ("Pod", "cart")


def test_a_scheduled_pods_delete_is_graceful_until_its_kubelet_confirms(kubeapi: KubeApiServer) -> None:
    """A running pod is kept, marked, for its grace (its spec's, else 30 s): got and listed, and
    answered as it is to another delete; a shorter grace moves the mark earlier; a delete of
    grace 0 (the kubelet's) removes it. An unscheduled or finished pod, or a grace of 0 in the
    query, goes at once."""
    path = "/api/v1/namespaces/shop/pods"
    kubeapi.add_pod("shop", "cart", "n1", "10.0.0.5")
    stored = kubeapi.get(path, "cart")
    assert stored is not None
    before = datetime.now(UTC).replace(microsecond=0)
    marked = call(kubeapi, "DELETE", f"{path}/cart")
    assert marked.status_code == 200
    metadata = marked.json()["metadata"]
    ends = datetime.fromisoformat(metadata["deletionTimestamp"])
    assert before + timedelta(seconds=30) <= ends <= datetime.now(UTC) + timedelta(seconds=30)
    assert metadata["deletionGracePeriodSeconds"] == 30
    assert metadata["generation"] == stored["metadata"]["generation"] + 1
    assert int(metadata["resourceVersion"]) > int(stored["metadata"]["resourceVersion"])
    assert call(kubeapi, "GET", f"{path}/cart").json() == marked.json()
    assert [p["metadata"]["name"] for p in call(kubeapi, "GET", path).json()["items"]] == ["cart"]
    again = call(kubeapi, "DELETE", f"{path}/cart", {"gracePeriodSeconds": 60})
    assert again.json() == marked.json(), "a longer grace changes nothing"
    shorter = call(kubeapi, "DELETE", f"{path}/cart", {"gracePeriodSeconds": 10}).json()["metadata"]
    assert shorter["deletionGracePeriodSeconds"] == 10
    assert datetime.fromisoformat(shorter["deletionTimestamp"]) == ends - timedelta(seconds=20)
    assert shorter["generation"] == metadata["generation"], "only the first mark moves the generation"
    gone = call(kubeapi, "DELETE", f"{path}/cart", {"gracePeriodSeconds": 0})
    assert gone.status_code == 200 and kubeapi.get(path, "cart") is None
    own = objects.pod("shop", "own", "n1", ("10.0.0.6",))
    own["spec"]["terminationGracePeriodSeconds"] = 5
    kubeapi.put(path, own)
    assert call(kubeapi, "DELETE", f"{path}/own").json()["metadata"]["deletionGracePeriodSeconds"] == 5
    kubeapi.add_pod("shop", "pending", None)
    done = objects.pod("shop", "done", "n1", ("10.0.0.7",))
    done["status"]["phase"] = "Succeeded"
    kubeapi.put(path, done)
    kubeapi.add_pod("shop", "forced", "n1", "10.0.0.8")
    for name, query in (("pending", {}), ("done", {}), ("forced", {"gracePeriodSeconds": "0"})):
        answer = call(kubeapi, "DELETE", f"{path}/{name}", **query)
        assert answer.status_code == 200 and "deletionTimestamp" not in answer.json()["metadata"]
        assert kubeapi.get(path, name) is None, name


@pytest.mark.parametrize(
    ("body", "query", "code", "message"),
    [
        (None, {"gracePeriodSeconds": "soon"}, 400, 'strconv.ParseInt: parsing "soon": invalid syntax'),
        (None, {"gracePeriodSeconds": "9" * 20}, 400, f'strconv.ParseInt: parsing "{"9" * 20}": value out of range'),
        (None, {"orphanDependents": "yes"}, 400, 'strconv.ParseBool: parsing "yes": invalid syntax'),
        (
            {"gracePeriodSeconds": "5"},
            {},
            500,
            "json: cannot unmarshal string into Go struct field DeleteOptions.gracePeriodSeconds of type int64",
        ),
        (
            {"preconditions": {"uid": 5}, "gracePeriodSeconds": 1.5},
            {},
            500,
            "json: cannot unmarshal number into Go struct field Preconditions.preconditions.uid of type types.UID",
        ),
    ],
)
def test_delete_options_the_handler_cannot_decode_are_refused_and_nothing_is_deleted(
    kubeapi: KubeApiServer, body: Any, query: dict[str, str], code: int, message: str
) -> None:
    """The delete handler decodes its DeleteOptions from the body, else from the query, before
    anything else: a query value its parameter's type does not parse is a 400 BadRequest in
    strconv's words (`DecodeParameters`), a body's type error the decoder's own error passed on
    as a 500 of no reason (`scope.err` of an error that is no Status), the first in the body's
    order. Of a pod and of a Node alike; the object stays. The test server once dropped the
    connection (a pod's) or ignored the value (any other kind's)."""
    kubeapi.add_pod("shop", "cart", "n1", "10.0.0.5")
    kubeapi.add_node("n1")
    for path in ("/api/v1/namespaces/shop/pods/cart", "/api/v1/nodes/n1"):
        answer = call(kubeapi, "DELETE", path, body, **query)
        assert answer.status_code == code, path
        assert answer.json()["message"] == message
        assert answer.json().get("reason") == ("BadRequest" if code == 400 else None)
    assert kubeapi.get("/api/v1/namespaces/shop/pods", "cart") is not None
    assert kubeapi.get("/api/v1/nodes", "n1") is not None
    marked = call(kubeapi, "DELETE", "/api/v1/namespaces/shop/pods/cart", {}, gracePeriodSeconds="soon")
    assert marked.json()["metadata"]["deletionGracePeriodSeconds"] == 30, "a body, even {}, and the query is not read"


def test_an_object_with_finalizers_is_marked_by_a_delete_and_goes_with_its_last_finalizer(
    kubeapi: KubeApiServer,
) -> None:
    """A delete marks it (`deletionTimestamp` now, a grace of 0, its generation one on) and answers
    it, 200; it is still got and listed; another delete writes nothing; an update keeps the marks
    whatever it sends, may add no finalizer, and the update that leaves no finalizer deletes it.
    A create's marks are cleared."""
    kubeapi.add_node("n1")
    node = kubeapi.get("/api/v1/nodes", "n1")
    assert node is not None
    kubeapi.put("/api/v1/nodes", {**node, "metadata": {**node["metadata"], "finalizers": ["karpenter.sh/termination"]}})
    stored = kubeapi.get("/api/v1/nodes", "n1")
    assert stored is not None
    marked = call(kubeapi, "DELETE", "/api/v1/nodes/n1")
    assert marked.status_code == 200 and marked.json()["kind"] == "Node"
    metadata = marked.json()["metadata"]
    assert metadata["deletionTimestamp"] and metadata["deletionGracePeriodSeconds"] == 0
    # A Node keeps no generation: markAsDeleting moves one only where there is one (a pod's: below).
    assert "generation" not in metadata and "generation" not in stored["metadata"]
    assert call(kubeapi, "GET", "/api/v1/nodes/n1").json() == marked.json()
    assert [n["metadata"]["name"] for n in call(kubeapi, "GET", "/api/v1/nodes").json()["items"]] == ["n1"]
    assert call(kubeapi, "DELETE", "/api/v1/nodes/n1").json() == marked.json(), "nothing written again"
    unmarked = {**marked.json(), "metadata": {k: v for k, v in metadata.items() if not k.startswith("deletion")}}
    kept = call(kubeapi, "PUT", "/api/v1/nodes/n1", unmarked).json()["metadata"]
    assert (kept["deletionTimestamp"], kept["deletionGracePeriodSeconds"]) == (metadata["deletionTimestamp"], 0)
    late = {**unmarked, "metadata": {**kept, "finalizers": ["karpenter.sh/termination", "example.com/late"]}}
    refused = call(kubeapi, "PUT", "/api/v1/nodes/n1", late)
    assert refused.status_code == 422, "no finalizer may be added once it is being deleted"
    assert refused.json()["message"] == (
        'Node "n1" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object '
        'is being deleted, found new finalizers []string{"example.com/late"}'
    )
    released = {**unmarked, "metadata": {**kept, "finalizers": []}}
    assert call(kubeapi, "PUT", "/api/v1/nodes/n1", released).status_code == 200
    assert call(kubeapi, "GET", "/api/v1/nodes/n1").status_code == 404, "its last finalizer gone"
    created = call(
        kubeapi, "POST", "/api/v1/nodes", {"metadata": {"name": "n2", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    )
    assert "deletionTimestamp" not in created.json()["metadata"]


@needs_crds
def test_a_list_names_its_kind_and_a_typed_lists_items_carry_none(kubeapi: KubeApiServer) -> None:
    """A built-in kind's list is encoded from Go's typed list: only the list says `kind` and
    `apiVersion`. A custom resource's items, unstructured, keep theirs."""
    kubeapi.add_node("n1")
    kubeapi.put(f"{CRD}/ipamblocks", block())
    nodes = call(kubeapi, "GET", "/api/v1/nodes").json()
    assert (nodes["kind"], nodes["apiVersion"]) == ("NodeList", "v1")
    assert "kind" not in nodes["items"][0] and "apiVersion" not in nodes["items"][0]
    assert call(kubeapi, "GET", "/api/v1/nodes/n1").json()["kind"] == "Node", "one object says its kind"
    blocks = call(kubeapi, "GET", f"{CRD}/ipamblocks").json()
    assert (blocks["kind"], blocks["apiVersion"]) == ("IPAMBlockList", "crd.projectcalico.org/v1")
    assert (blocks["items"][0]["kind"], blocks["items"][0]["apiVersion"]) == ("IPAMBlock", "crd.projectcalico.org/v1")
    leases = call(kubeapi, "GET", LEASES).json()
    assert (leases["kind"], leases["apiVersion"]) == ("LeaseList", "coordination.k8s.io/v1")
    # A body that names neither (the decoder's defaults): one object still says both.
    kubeapi.put(LEASES, {"metadata": {"name": "bare"}, "spec": {}})
    bare = call(kubeapi, "GET", f"{LEASES}/bare").json()
    assert (bare["kind"], bare["apiVersion"]) == ("Lease", "coordination.k8s.io/v1")


@needs_crds
def test_unknown_fields_are_pruned_nulls_dropped_and_defaults_applied(kubeapi: KubeApiServer) -> None:
    sent = block(affinity=None, deleted=False, color="blue")
    sent["status"] = {"anything": 1}  # IPAMBlock (v1) has no status in its schema
    stored = call(kubeapi, "POST", f"{CRD}/ipamblocks", sent).json()
    spec = stored["spec"]
    assert "color" not in spec and "affinity" not in spec and "status" not in stored
    assert spec["sequenceNumber"] == 0, "the schema's default"
    assert spec["allocations"] == [None] * 64, "items are nullable there: kept"
    assert kubeapi.get(f"{CRD}/ipamblocks", "10-0-0-0-26") == stored


UNKNOWN_KEYS = [
    pytest.param(
        f"{CRD}/ipamblocks",
        {
            **block(attributes=[{"handle_id": "h", "colour": "blue"}], size=64),
            "metadata": {"name": "10-0-0-0-26", "owner": "me"},
            "status": {},
        },
        ("spec", "attributes", 0, "colour"),
        'IPAMBlock in version "v1" cannot be handled as a IPAMBlock',
        ["metadata.owner", "spec.attributes[0].colour", "spec.size", "status"],
        marks=needs_crds,
        id="custom-resource",
    ),
    pytest.param(
        LEASES.replace("/ns/", "/calico-gc/"),
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "b",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "x": 1}],
            },
            "spec": {"holderIdentity": "run-1", "holder": "run-1"},
        },
        ("metadata", "ownerReferences", 0, "x"),
        'Lease in version "v1" cannot be handled as a Lease',
        ["metadata.ownerReferences[0].x", "spec.holder"],
        id="built-in",
    ),
]


@pytest.mark.parametrize(("collection", "body", "nested", "kind_said", "paths"), UNKNOWN_KEYS)
def test_a_key_naming_no_field_is_dropped_and_warned_or_refused_as_field_validation_says(
    kubeapi: KubeApiServer,
    collection: str,
    body: dict[str, Any],
    nested: tuple[Any, ...],
    kind_said: str,
    paths: list[str],
) -> None:
    """A create's unknown keys (the strict decoder's paths): by default dropped with a `Warning:
    299` header each; `Ignore` drops them silently; `Strict` refuses the write with a 400."""
    kubeapi.add_namespace("calico-gc")
    strict = call(kubeapi, "POST", collection, body, fieldValidation="Strict")
    said = ", ".join(f'unknown field "{path}"' for path in paths)
    assert strict.status_code == 400 and strict.json()["reason"] == "BadRequest"
    assert strict.json()["message"] == f"{kind_said}: strict decoding error: {said}"
    assert not kubeapi.copy_under(collection), "nothing stored"
    warned = call(kubeapi, "POST", collection, body)
    assert warned.status_code == 201 and warned.raw.headers.getlist("Warning") == [
        '299 - "unknown field \\"' + path + '\\""' for path in paths
    ]
    assert [text for _, _, text in kubeapi.warned] == [f'unknown field "{path}"' for path in paths]
    stored = kubeapi.get(collection, body["metadata"]["name"])
    assert stored is not None and "status" not in stored and "holder" not in stored.get("spec", {})
    assert "owner" not in stored["metadata"]
    parent: Any = stored
    for step in nested[:-1]:
        parent = parent[step]
    assert nested[-1] not in parent, "dropped where it was, the rest of its object kept"
    assert call(kubeapi, "DELETE", f"{collection}/{body['metadata']['name']}").status_code == 200
    quiet = call(kubeapi, "POST", collection, body, fieldValidation="Ignore")
    assert quiet.status_code == 201 and "Warning" not in quiet.headers and len(kubeapi.warned) == len(paths)


# Bodies as the real server's own test of field validation sends them (TestFieldValidation):
# repeated keys, unknown ones, and one both; the order of a built-in kind's differs from sorted.
REPEATS = [
    pytest.param(
        LEASES.replace("/ns/", "/calico-gc/"),
        """{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "dupename", "name": "b", "unknownMeta": "x"},
            "spec": {"zeta": 1, "unknownDupe": 1, "unknownDupe": 2,
                     "holderIdentity": "a", "holderIdentity": "run-1", "alpha": 2}}""",
        'Lease in version "v1" cannot be handled as a Lease',
        [
            'duplicate field "metadata.name"',
            'unknown field "metadata.unknownMeta"',
            'unknown field "spec.zeta"',
            'unknown field "spec.unknownDupe"',
            'duplicate field "spec.holderIdentity"',
            'unknown field "spec.alpha"',
        ],
        ("b", "run-1"),
        id="built-in",
    ),
    pytest.param(
        f"{CRD}/ipamblocks",
        """{"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock",
            "metadata": {"name": "dupename", "name": "10-0-0-0-26", "unknownMeta": "x"},
            "spec": {"zeta": 1, "unknownDupe": 1, "unknownDupe": 2, "cidr": "10.0.0.0/26",
                     "allocations": [null], "unallocated": [], "strictAffinity": true,
                     "attributes": [{"handle_id": "a", "handle_id": "h", "colour": "blue"}],
                     "strictAffinity": false, "alpha": 2}}""",
        'IPAMBlock in version "v1" cannot be handled as a IPAMBlock',
        [
            'duplicate field "metadata.name"',
            'duplicate field "spec.unknownDupe"',
            'duplicate field "spec.attributes[0].handle_id"',
            'duplicate field "spec.strictAffinity"',
            'unknown field "metadata.unknownMeta"',
            'unknown field "spec.alpha"',
            'unknown field "spec.attributes[0].colour"',
            'unknown field "spec.unknownDupe"',
            'unknown field "spec.zeta"',
        ],
        ("10-0-0-0-26", "h"),
        marks=needs_crds,
        id="custom-resource",
    ),
]


@pytest.mark.parametrize(("collection", "text", "kind_said", "said", "kept"), REPEATS)
def test_repeated_and_unknown_keys_are_said_in_the_decoders_order(
    kubeapi: KubeApiServer, collection: str, text: str, kind_said: str, said: list[str], kept: tuple[str, str]
) -> None:
    """A key that comes twice is a `duplicate field` (its last value kept), said with the unknown
    ones: a built-in kind's in the order they come, a key both unknown and repeated once, as
    unknown; a custom resource's repeats first (the unstructured decoder), then its metadata's
    unknown keys, then what pruning drops, sorted. `Strict` refuses with them all, the default
    warns each, `Ignore` says nothing."""
    session = requests.Session()
    session.trust_env = False

    def send(**query: str) -> requests.Response:
        url = kubeapi.url + collection
        return session.post(url, data=text, params=query, headers=kubeapi.authorization, timeout=10)

    strict = send(fieldValidation="Strict")
    assert (
        strict.status_code == 400
        and strict.json()["message"] == f"{kind_said}: strict decoding error: {', '.join(said)}"
    )
    assert not kubeapi.copy_under(collection), "nothing stored"
    warned = send()
    assert warned.status_code == 201 and [text for _, _, text in kubeapi.warned] == said
    name, value = kept
    stored = kubeapi.get(collection, name)
    assert stored is not None
    assert value in (stored["spec"].get("holderIdentity"), stored["spec"].get("attributes", [{}])[0].get("handle_id"))
    assert not {"zeta", "alpha", "unknownDupe"} & set(stored["spec"]), "dropped"
    assert stored["spec"].get("strictAffinity", False) is False, "the last value"
    session.delete(f"{kubeapi.url}{collection}/{name}", headers=kubeapi.authorization, timeout=10)
    quiet = send(fieldValidation="Ignore")
    assert quiet.status_code == 201 and len(kubeapi.warned) == len(said)


@pytest.mark.parametrize(("method", "options"), [("POST", "CreateOptions"), ("PUT", "UpdateOptions")])
def test_a_field_validation_the_server_does_not_know_is_refused_before_the_body_is_read(
    kubeapi: KubeApiServer, method: str, options: str
) -> None:
    """The write's options are validated first: a 422 naming them, even for a body that would not
    decode, and nothing stored."""
    path = f"{CRD}/ipamblocks" + ("/10-0-0-0-26" if method == "PUT" else "")
    answer = call(kubeapi, method, path, {"spec": "not an object"}, fieldValidation="strict")
    assert answer.status_code == 422 and answer.json()["reason"] == "Invalid"
    supported = 'supported values: "", "Ignore", "Strict", "Warn"'
    said = f'fieldValidation: Unsupported value: "strict": {supported}'
    assert answer.json()["message"] == f'{options}.meta.k8s.io "" is invalid: {said}'
    assert answer.json()["details"] == {
        "group": "meta.k8s.io",
        "kind": options,
        "causes": [{"reason": "FieldValueNotSupported", "message": said.split(": ", 1)[1], "field": "fieldValidation"}],
    }
    assert not kubeapi.copy_under(CRD)


def test_every_request_to_a_deprecated_crd_version_is_warned(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    """The CRD's own `deprecationWarning`, else the server's default words, which name the
    highest-ranked version served and not deprecated, where one ranks above the one asked for
    (GA over beta over alpha; an unserved version is never named)."""
    versions = [
        {"name": name, "served": served, "storage": name == "v2", "deprecated": deprecated, **extra}
        | {"schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
        for name, served, deprecated, extra in (
            ("v1alpha1", True, True, {}),
            ("v1beta1", True, False, {}),
            ("v2beta1", True, False, {}),
            ("v1", True, True, {}),
            ("v2", True, True, {"deprecationWarning": 'v2 is "old" too'}),
            ("v3", False, False, {}),
        )
    ]
    names = {"plural": "widgets", "singular": "widget", "kind": "Widget"}
    spec = {"group": "example.com", "names": names, "scope": "Cluster", "versions": versions}
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "spec": spec}
    (tmp_path / "crd.yaml").write_text(json.dumps(crd))
    kubeapi.install(*kubeapi.crds, *crds.load(tmp_path / "crd.yaml"))
    oldest = call(kubeapi, "GET", "/apis/example.com/v1alpha1/widgets")
    said = "example.com/v1alpha1 Widget is deprecated; use example.com/v2beta1 Widget"
    assert oldest.headers["Warning"] == f'299 - "{said}"'
    listed = call(kubeapi, "GET", "/apis/example.com/v1/widgets")
    assert listed.status_code == 200 and listed.headers["Warning"] == '299 - "example.com/v1 Widget is deprecated"'
    created = call(kubeapi, "POST", "/apis/example.com/v2/widgets", {"metadata": {"name": "w"}})
    assert created.status_code == 201 and created.headers["Warning"] == '299 - "v2 is \\"old\\" too"'
    assert call(kubeapi, "GET", "/apis/example.com/v1beta1/widgets").headers.get("Warning") is None
    assert call(kubeapi, "GET", "/api/v1/nodes").headers.get("Warning") is None


@needs_crds
def test_a_body_naming_another_version_or_kind_than_its_path_is_refused(kubeapi: KubeApiServer) -> None:
    """The handler refuses another API version once the body is decoded (a 400); the validator
    another kind (a 422 in the body's kind's name, before the schema is looked at), on a create,
    an update and a write of `/status` alike. Nothing is stored or changed."""
    path = f"{CRD}/ipamblocks"
    other_version = {**block(), "apiVersion": "projectcalico.org/v3"}
    for method, at in (("POST", path), ("PUT", f"{path}/10-0-0-0-26")):
        refused = call(kubeapi, method, at, other_version)
        assert (refused.status_code, refused.json()["reason"]) == (400, "BadRequest")
        assert refused.json()["message"] == (
            "the API version in the data (projectcalico.org/v3) does not match the expected API version "
            "(crd.projectcalico.org/v1)"
        )
    assert kubeapi.get(path, "10-0-0-0-26") is None
    # Another kind, with a schema error too: the kind is said alone.
    other_kind = {**block(strictAffinity="no"), "kind": "BlockAffinity"}
    why = 'Invalid value: "BlockAffinity": must be IPAMBlock'
    said = f'BlockAffinity.crd.projectcalico.org "10-0-0-0-26" is invalid: kind: {why}'
    created = call(kubeapi, "POST", path, other_kind)
    assert (created.status_code, created.json()["message"]) == (422, said)
    cause = {"reason": "FieldValueInvalid", "message": why, "field": "kind"}
    named = {"name": "10-0-0-0-26", "group": "crd.projectcalico.org", "kind": "BlockAffinity"}
    assert created.json()["details"] == {**named, "causes": [cause]}
    stored = kubeapi.put(path, block())
    updated = call(kubeapi, "PUT", f"{path}/10-0-0-0-26", {**other_kind, "metadata": stored["metadata"]})
    assert (updated.status_code, updated.json()["message"]) == (422, said)
    assert call(kubeapi, "GET", f"{path}/10-0-0-0-26").json() == stored
    written = objects.calico_node_status("n1-status", "n1", ("10.0.0.2",))
    status = call(kubeapi, "POST", f"{CRD}/caliconodestatuses", written).json()
    wrong = {**status, "kind": "CalicoNode", "status": written["status"]}
    refused = call(kubeapi, "PUT", f"{CRD}/caliconodestatuses/n1-status/status", wrong)
    assert refused.status_code == 422 and refused.json()["details"]["causes"][0]["field"] == "kind"
    assert "status" not in call(kubeapi, "GET", f"{CRD}/caliconodestatuses/n1-status").json()
    defaulted = {k: v for k, v in block("10-0-0-64-26", cidr="10.0.0.64/26").items() if k not in ("apiVersion", "kind")}
    answered = call(kubeapi, "POST", path, defaulted).json()
    assert (answered["apiVersion"], answered["kind"]) == ("crd.projectcalico.org/v1", "IPAMBlock"), "named by the path"


@needs_crds
def test_a_crd_installed_again_prunes_what_is_stored_as_reads_from_storage_do(kubeapi: KubeApiServer) -> None:
    kubeapi.put(f"{CRD}/ipamblocks", block(deleted=True))
    kubeapi.change_crd("ipamblocks", lambda crd: crds.without_property(crd, "deleted"))
    assert "deleted" not in call(kubeapi, "GET", f"{CRD}/ipamblocks/10-0-0-0-26").json()["spec"]
    assert "deleted" not in call(kubeapi, "GET", f"{CRD}/ipamblocks").json()["items"][0]["spec"]


@needs_crds
def test_the_status_subresource_is_honoured_where_the_crd_declares_it(kubeapi: KubeApiServer) -> None:
    written = objects.calico_node_status("n1-status", "n1", ("10.0.0.2",))
    created = call(kubeapi, "POST", f"{CRD}/caliconodestatuses", written).json()
    assert "status" not in created, "a create sets no status: calico-node writes it through /status"
    filled = call(
        kubeapi, "PUT", f"{CRD}/caliconodestatuses/n1-status/status", {**created, "status": written["status"]}
    )
    assert filled.status_code == 200 and filled.json()["status"] == written["status"]
    moved = {**filled.json(), "spec": {**created["spec"], "updatePeriodSeconds": 30}, "status": {"bgp": None}}
    updated = call(kubeapi, "PUT", f"{CRD}/caliconodestatuses/n1-status", moved).json()
    assert updated["spec"]["updatePeriodSeconds"] == 30 and updated["status"] == written["status"]
    assert updated["metadata"]["generation"] == 2
    only_status = {**updated, "spec": {"node": "elsewhere"}, "status": {"lastUpdated": None}}
    last = call(kubeapi, "PUT", f"{CRD}/caliconodestatuses/n1-status/status", only_status).json()
    assert last["spec"] == updated["spec"] and last["status"] == {"lastUpdated": None}, "nullable: kept"
    stale = call(kubeapi, "PUT", f"{CRD}/caliconodestatuses/n1-status/status", only_status)
    assert stale.status_code == 409
    kubeapi.put(f"{CRD}/ipamblocks", block())
    assert call(kubeapi, "GET", f"{CRD}/ipamblocks/10-0-0-0-26/status").status_code == 404, "no status subresource"


POD_LEVEL = {"cpu": "2", "memory": "1G"}
ONE_GI = {"cpu": 1, "memory": "1Gi"}
HUGE = {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "2Mi"}


def _container(name: str, **resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "image": f"{name}:1", "resources": resources}


@pytest.mark.parametrize(
    ("containers", "pod_level", "qos"),
    [
        ([_container("a")], None, "BestEffort"),
        ([_container("a", requests={"cpu": "0", "memory": 0})], None, "BestEffort"),  # zero asks for nothing
        ([_container("a", requests={"cpu": "100m"})], None, "Burstable"),
        # Requests default to limits: limits alone on CPU and memory are a Guaranteed pod.
        ([_container("a", limits={"cpu": "1", "memory": "1Gi"})], None, "Guaranteed"),
        ([_container("a", limits={"cpu": "1000m", "memory": "1073741824"}, requests=ONE_GI)], None, "Guaranteed"),
        ([_container("a", limits={"cpu": "1", "memory": "1Gi"}, requests={"cpu": "500m"})], None, "Burstable"),
        ([_container("a", limits={"cpu": "1"})], None, "Burstable"),  # memory unlimited
        # Every container must limit both; hugepages and the like are not judged.
        ([_container("a", limits=HUGE), _container("b")], None, "Burstable"),
        ([_container("a", limits=HUGE)], None, "Guaranteed"),
        # The pod's own resources, where it sets CPU or memory, are judged instead of its containers'.
        ([_container("a", requests={"cpu": "1"})], {"limits": POD_LEVEL, "requests": POD_LEVEL}, "Guaranteed"),
        ([_container("a")], {"requests": {"memory": "1e9"}}, "Burstable"),
    ],
)
def test_a_pods_create_starts_it_pending_with_its_qos_class_whatever_status_was_sent(
    kubeapi: KubeApiServer, containers: list[dict[str, Any]], pod_level: dict[str, Any] | None, qos: str
) -> None:
    """The pod strategy's PrepareForCreate: the status sent is dropped, and the kubelet reports
    the rest through /status (the benches create their pods that way)."""
    kubeapi.add_namespace("shop")
    spec: dict[str, Any] = {"nodeName": "n1", "containers": containers}
    if pod_level:
        spec["resources"] = pod_level
    sent = {"metadata": {"name": "web", "namespace": "shop"}, "spec": spec, "status": {"phase": "Running"}}
    created = call(kubeapi, "POST", "/api/v1/namespaces/shop/pods", sent)
    assert created.status_code == 201
    assert created.json()["status"] == {"phase": "Pending", "qosClass": qos}
    for container, stored in zip(containers, created.json()["spec"]["containers"], strict=True):
        limits, requests_sent = container["resources"].get("limits", {}), container["resources"].get("requests", {})
        assert stored["resources"].get("requests", {}) == ({**limits, **requests_sent} or requests_sent)


def test_a_resource_quantity_the_decoder_cannot_read_is_a_400(kubeapi: KubeApiServer) -> None:
    kubeapi.add_namespace("shop")
    for amount in ("1.5.2", "12Xi", "m", True):
        spec = {"containers": [_container("a", limits={"memory": amount})]}
        answer = call(kubeapi, "POST", "/api/v1/namespaces/shop/pods", {"metadata": {"name": "web"}, "spec": spec})
        assert answer.status_code == 400, amount
        assert answer.json()["message"] == (
            'Pod in version "v1" cannot be handled as a Pod: quantities must match the regular expression '
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    assert kubeapi.objects.get("/api/v1/namespaces/shop/pods", {}) == {}


def test_a_node_keeps_the_status_it_is_created_with_and_a_status_write_owns_only_the_status(
    kubeapi: KubeApiServer,
) -> None:
    """A Node is registered by its kubelet with its status (nodeStrategy keeps it on create). A
    write of `/status` is recorded as its writer's entry for that subresource alone, beside the
    creator's, which owns all but the status."""
    node = objects.node("n1", "10.0.0.1")
    created = call(kubeapi, "POST", "/api/v1/nodes", node).json()
    assert created["status"] == node["status"]
    (creator,) = created["metadata"]["managedFields"]
    assert "f:status" not in creator["fieldsV1"] and "subresource" not in creator
    ready = {**created["status"], "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}
    session = requests.Session()
    session.trust_env = False
    answer = session.put(
        f"{kubeapi.url}/api/v1/nodes/n1/status",
        data=json.dumps({**created, "status": ready}),
        headers={**kubeapi.authorization, "User-Agent": "kubelet/v1.36.2 (linux/amd64) kubernetes/abcdef"},
        timeout=10,
    ).json()
    assert answer["status"] == ready
    by_writer = {(e["manager"], e.get("subresource")): e for e in answer["metadata"]["managedFields"]}
    assert by_writer.keys() == {("python-requests", None), ("kubelet", "status")}
    assert by_writer["kubelet", "status"]["fieldsV1"].keys() == {"f:status"}
    # The creator writing the status too has an entry for each: one per manager and subresource.
    again = call(kubeapi, "PUT", "/api/v1/nodes/n1/status", {**answer, "status": node["status"]}).json()
    writers = {(e["manager"], e.get("subresource")) for e in again["metadata"]["managedFields"]}
    assert writers == {("python-requests", None), ("kubelet", "status"), ("python-requests", "status")}


@needs_crds
def test_a_group_the_crds_define_serves_only_their_resources(kubeapi: KubeApiServer) -> None:
    assert call(kubeapi, "GET", f"{CRD}/ipamblocks").status_code == 200
    missing = call(kubeapi, "GET", f"{CRD}/ipamthings")
    assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"


@needs_crds
def test_discovery_answers_the_groups_served_and_a_crd_groups_resources(kubeapi: KubeApiServer) -> None:
    groups = call(kubeapi, "GET", "/apis").json()
    assert groups["kind"] == "APIGroupList"
    calico = next(g for g in groups["groups"] if g["name"] == "crd.projectcalico.org")
    assert calico["preferredVersion"] == {"groupVersion": "crd.projectcalico.org/v1", "version": "v1"}
    listed = call(kubeapi, "GET", CRD).json()
    assert listed["kind"] == "APIResourceList" and listed["groupVersion"] == "crd.projectcalico.org/v1"
    names = {r["name"]: r for r in listed["resources"]}
    assert names["ipamblocks"]["kind"] == "IPAMBlock" and names["ipamblocks"]["namespaced"] is False
    assert "caliconodestatuses/status" in names and "ipamblocks/status" not in names
    kubeapi.uninstalled_groups.add("crd.projectcalico.org")
    assert all(g["name"] != "crd.projectcalico.org" for g in call(kubeapi, "GET", "/apis").json()["groups"])
    assert call(kubeapi, "GET", CRD).status_code == 404


def test_the_server_counts_the_bytes_it_encodes_per_format_and_resource(kubeapi: KubeApiServer) -> None:
    """bench-kdd's proxy for what a run costs the API server: every answer body, by resource
    (namespaced paths and object names folded in, as the real server's metrics fold them)."""
    kubeapi.add_node("n1", "10.0.0.1")
    kubeapi.add_node("n2", "10.0.0.2")
    kubeapi.take_encoded_bytes()
    nodes = requests.get(f"{kubeapi.url}/api/v1/nodes?limit=1", headers=kubeapi.authorization, timeout=10)
    one = requests.get(f"{kubeapi.url}/api/v1/nodes/n2", headers=kubeapi.authorization, timeout=10)
    missing = requests.get(
        f"{kubeapi.url}/api/v1/namespaces/default/pods/none", headers=kubeapi.authorization, timeout=10
    )
    assert (nodes.status_code, one.status_code, missing.status_code) == (200, 200, 404)
    assert kubeapi.take_encoded_bytes() == {
        "json /api/v1/nodes": len(nodes.content) + len(one.content),
        "json /api/v1/pods": len(missing.content),
    }
    assert kubeapi.take_encoded_bytes() == {}, "each call counts anew"


@pytest.mark.parametrize(
    ("tail", "code", "answer"),
    [
        ("2", 200, "two\nthree\n"),
        ("0", 200, ""),
        ("+7", 200, "one\ntwo\nthree\n"),
        ("0" * 5000 + "2", 200, "two\nthree\n"),  # ParseInt reads any number of leading zeros
        (
            "-1",
            422,
            'PodLogOptions "calico-node-n1" is invalid: '
            "tailLines: Invalid value: -1: must be greater than or equal to 0",
        ),
        ("last", 400, 'strconv.ParseInt: parsing "last": invalid syntax'),
        ("9" * 5000, 400, f'strconv.ParseInt: parsing "{"9" * 5000}": value out of range'),
    ],
)
def test_a_previous_logs_options_are_decoded_and_validated_before_the_kubelet_is_asked(
    kubeapi: KubeApiServer, tail: str, code: int, answer: str
) -> None:
    """PodLogOptions as the log handler reads them: tailLines in strconv.ParseInt's syntax (a 400
    BadRequest), at least 0 (a 422, pkg/registry/core/pod/rest/log.go's validation), then the
    kubelet's tail: 0 is no line. The test server once read any int() took (`last` dropped the
    connection; -1 and 0 were every line but the first, or every line)."""
    pod = kubeapi.add_calico_node_pod("n1", ready=False, restarts=7, log="one\ntwo\nthree\n")
    got = call(kubeapi, "GET", f"/api/v1/namespaces/kube-system/pods/{pod}/log", previous="true", tailLines=tail)
    assert got.status_code == code
    assert (got.text if code == 200 else got.json()["message"]) == answer


def test_a_grace_period_of_more_digits_than_int_reads_is_out_of_range(kubeapi: KubeApiServer) -> None:
    """strconv.ParseInt says `value out of range` for any length; int() refuses more than 4,300
    digits with a ValueError, which dropped the connection."""
    kubeapi.add_node("n1")
    answer = call(kubeapi, "DELETE", "/api/v1/nodes/n1", gracePeriodSeconds="9" * 5000)
    assert answer.status_code == 400 and answer.json()["message"].endswith("value out of range")
    assert kubeapi.get("/api/v1/nodes", "n1") is not None


def test_a_lists_limit_is_decoded_as_an_int64_and_none_above_zero_is_no_limit(kubeapi: KubeApiServer) -> None:
    """ListOptions' `limit` as strconv.ParseInt reads an int64 (a 400 in its words: `ten`, or 5,000
    digits, which int() refused with a ValueError that dropped the connection); a limit of 0 or
    less lists everything, as the storage pages only for a limit above 0."""
    for name in ("n1", "n2", "n3"):
        kubeapi.add_node(name)
    for limit, code, count in (("2", 200, 2), ("0", 200, 3), ("-1", 200, 3), ("ten", 400, 0), ("9" * 5000, 400, 0)):
        answer = call(kubeapi, "GET", "/api/v1/nodes", limit=limit)
        assert answer.status_code == code, limit
        assert len(answer.json().get("items") or []) == count

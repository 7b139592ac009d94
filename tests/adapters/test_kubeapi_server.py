"""The Kubernetes API test server behaves as the real one where the job relies on it: what the
server assigns to every object written, list option validation, field selectors, paging."""

from __future__ import annotations

import json
from typing import Any

import requests

from tests.support.kubeapi import KubeApiServer


def call(server: KubeApiServer, method: str, path: str, body: Any = None, **query: str) -> requests.Response:
    session = requests.Session()
    session.trust_env = False
    data = None if body is None else json.dumps(body)
    return session.request(method, server.url + path, data=data, params=query, timeout=10)


def test_created_objects_get_what_the_real_server_assigns(kubeapi: KubeApiServer) -> None:
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
    changed = {**same.json(), "spec": {**created["spec"], "nodeName": "n2"}}
    again = call(kubeapi, "PUT", "/api/v1/namespaces/shop/pods/web", changed).json()["metadata"]
    assert again["generation"] == 2 and again["uid"] == metadata["uid"]
    assert int(again["resourceVersion"]) > int(metadata["resourceVersion"])


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

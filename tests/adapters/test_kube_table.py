"""Pods listed as a Table (Kube.each_pod with one_ip_each): the API test server prints them as
Kubernetes' own printer does, and the job reads of a row what it reads of the pod, but for the
namespace, which a row without its object does not carry."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import requests

import bench.kdd
from job.adapters import kube_protobuf
from job.adapters.kube import TABLE, Kube, KubeError, api_client
from job.config import Config
from job.core.leaks import ANY_NAMESPACE
from job.core.model import PodInfo
from tests.conftest import no_sleep_retry
from tests.support import k8s_table, objects
from tests.support.kubeapi import PROTOBUF, KubeApiServer

# Two of Kubernetes' own printer tests (pkg/printers/internalversion, TestPrintPodwide), as pods
# and the rows the real server prints for them (`Restarts` is text since 1.24).
UPSTREAM = [
    (
        {
            "metadata": {"name": "test1", "namespace": "a"},
            "spec": {"containers": [{}, {}], "nodeName": "test1", "readinessGates": [{"conditionType": "condition1"}]},
            "status": {
                "conditions": [{"type": "condition1", "status": "True"}],
                "phase": "podPhase",
                "containerStatuses": [
                    {"ready": True, "restartCount": 3, "state": {"running": {}}},
                    {"ready": True, "restartCount": 3, "state": {"running": {}}},
                ],
                "podIPs": [{"ip": "1.1.1.1"}, {"ip": "2001:db8::"}],
                "nominatedNodeName": "node1",
            },
        },
        ["test1", "2/2", "podPhase", "6", "<unknown>", "1.1.1.1", "test1", "node1", "1/1"],
    ),
    (
        {
            "metadata": {"name": "test2", "namespace": "a"},
            "spec": {"containers": [{}, {}], "nodeName": ""},
            "status": {
                "phase": "podPhase",
                "containerStatuses": [
                    {"ready": True, "restartCount": 3, "state": {"running": {}}},
                    {"restartCount": 3, "state": {"waiting": {"reason": "ContainerWaitingReason"}}},
                ],
            },
        },
        ["test2", "1/2", "ContainerWaitingReason", "6", "<unknown>", "<none>", "<none>", "<none>", "<none>"],
    ),
]


def table_page(server: KubeApiServer, query: str = "includeObject=None", accept: str = TABLE) -> requests.Response:
    return requests.get(
        f"{server.url}/api/v1/pods?{query}", headers={"Accept": accept, **server.authorization}, timeout=10
    )


def each_pod(server: KubeApiServer, tmp: Path, one_ip_each: bool) -> dict[tuple[str, str], PodInfo]:
    """The pods as a run lists them (pages of 2)."""
    kube = Kube(api_client(Config(kubeconfig=(server.write_kubeconfig(tmp / "kubeconfig"),))), no_sleep_retry(), 2)
    pods: dict[tuple[str, str], PodInfo] = {}
    kube.each_pod(pods.__setitem__, one_ip_each)
    return pods


@pytest.mark.parametrize(("pod", "cells"), UPSTREAM, ids=["wide", "waiting"])
def test_the_test_server_prints_a_pod_as_kubernetes_printer_does(pod: dict[str, Any], cells: list[Any]) -> None:
    assert k8s_table.pod_cells(pod) == cells


def test_the_printer_says_age_status_and_completion_as_the_real_one() -> None:
    """HumanDuration's steps, `Terminating`, a podIP without podIPs, and the Completed condition."""
    assert [k8s_table.human_duration(s) for s in (-5, 0, 119, 125, 600, 10_800, 9 * 3600, 49 * 3600, 800 * 86400)] == [
        "<invalid>", "0s", "119s", "2m5s", "10m", "3h", "9h", "2d1h", "2y70d",
    ]  # fmt: skip
    gone = objects.pod("a", "old", "n1", ("100.96.0.1",))
    gone["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    gone["status"].pop("podIPs")
    cells = k8s_table.pod_cells(gone)
    assert (cells[2], cells[5]) == ("Terminating", "100.96.0.1")
    done = objects.pod("a", "job", "n1", ("100.96.0.2",))
    done["status"]["phase"] = "Succeeded"
    assert k8s_table.row(done, "None")["conditions"][0]["type"] == "Completed"


def test_the_server_serves_tables_of_pods_as_the_real_one(kubeapi: KubeApiServer) -> None:
    """Rows paged with `continue`, each page with its columns; `includeObject` says what each row
    carries (default Metadata, managedFields and all); anything else is a 400; a Table of another
    resource is passed over for the next type `Accept` lists."""
    for index in range(3):
        kubeapi.add_pod("shop", f"cart-{index}", "n1", f"100.96.0.{index + 1}")
    first = table_page(kubeapi, "includeObject=None&limit=2")
    assert first.headers["Content-Type"] == TABLE
    page = first.json()
    assert page["kind"] == "Table" and [c["name"] for c in page["columnDefinitions"]][5:7] == ["IP", "Node"]
    assert [(r["cells"][0], r["cells"][5], r["object"]) for r in page["rows"]] == [
        ("cart-0", "100.96.0.1", None),
        ("cart-1", "100.96.0.2", None),
    ]
    rest = table_page(kubeapi, f"includeObject=None&limit=2&continue={page['metadata']['continue']}").json()
    assert [r["cells"][0] for r in rest["rows"]] == ["cart-2"] and rest["columnDefinitions"]
    metadata = table_page(kubeapi, "").json()["rows"][0]["object"]
    assert metadata["kind"] == "PartialObjectMetadata" and metadata["metadata"]["managedFields"]
    whole = table_page(kubeapi, "includeObject=Object").json()["rows"][0]["object"]
    assert whole == kubeapi.get("/api/v1/namespaces/shop/pods", "cart-0")
    assert table_page(kubeapi, "includeObject=Everything").status_code == 400
    nodes = requests.get(
        f"{kubeapi.url}/api/v1/nodes", headers={"Accept": f"{TABLE}, {PROTOBUF}", **kubeapi.authorization}, timeout=10
    )
    assert nodes.headers["Content-Type"] == PROTOBUF
    assert table_page(kubeapi, accept=f"{TABLE};q=1").status_code == 200
    kubeapi.serves_tables = False
    assert table_page(kubeapi, accept=f"{TABLE}, {kube_protobuf.ACCEPT}").headers["Content-Type"] == PROTOBUF
    assert table_page(kubeapi, accept=TABLE).status_code == 406


def test_a_row_reads_as_its_pod_but_for_the_namespace(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    """Each pod's node and IP as the whole pod gives them (a dual-stack pod's first IP: the caller
    asks for rows only where that is every IP it can hold), keyed by name in any namespace; a
    server that prints no Table answers the pods themselves."""
    pods = [
        objects.pod("shop", "cart-1", "n1", ("100.96.0.1",)),
        objects.pod("shop", "pending-1", None),
        objects.pod("web", "cart-1", "n2", ("100.96.0.7",)),
        objects.with_every_field(objects.pod("shop", "dual-1", "n1", ("100.96.0.2", "fd00:96::2"))),
        bench.kdd.pod_object(3, 4),
    ]
    for pod in pods:
        kubeapi.put(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)
    whole = each_pod(kubeapi, tmp_path, one_ip_each=False)
    kubeapi.take_encoded_bytes()
    rows: list[tuple[tuple[str, str], PodInfo]] = []
    kube = Kube(api_client(Config(kubeconfig=(kubeapi.write_kubeconfig(tmp_path / "k"),))), no_sleep_retry(), 2)
    kube.each_pod(lambda key, pod: rows.append((key, pod)), one_ip_each=True)
    assert set(kubeapi.take_encoded_bytes()) == {"table /api/v1/pods"}
    expected = [((ANY_NAMESPACE, name), PodInfo(pod.node, pod.ips[:1])) for (_, name), pod in whole.items()]
    assert sorted(rows, key=repr) == sorted(expected, key=repr) and len(rows) == len(pods)
    kubeapi.serves_tables = False
    assert each_pod(kubeapi, tmp_path, one_ip_each=True) == whole


def test_a_table_costs_the_server_a_fraction_of_the_pods(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    """The bytes the server encodes for realistic pods (bench-kdd's, managedFields included): a
    row is a few dozen bytes of the pod's kilobytes, in protobuf or JSON."""
    for index in range(20):
        pod = bench.kdd.pod_object(index, 1)
        kubeapi.put(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)
    each_pod(kubeapi, tmp_path, one_ip_each=True)
    table = sum(kubeapi.take_encoded_bytes().values())
    each_pod(kubeapi, tmp_path, one_ip_each=False)
    protobuf = sum(kubeapi.take_encoded_bytes().values())
    kubeapi.serves_protobuf = kubeapi.serves_tables = False
    each_pod(kubeapi, tmp_path, one_ip_each=True)
    plain = sum(kubeapi.take_encoded_bytes().values())
    assert table < 0.2 * protobuf < 0.2 * plain, (table, protobuf, plain)


@pytest.mark.parametrize(
    ("columns", "cells", "said"),
    [
        (["Name", "Ready", "Node"], ["a", "1/1", "n1"], "without the column(s) IP"),
        (["Name", "IP", "Node"], ["a", "100.96.0.1"], "row 0 of a Table of pods has 2 cells"),
        (["Name", "IP", "Node"], ["a", 7, "n1"], "name 'a', IP 7, node 'n1'"),
        (["Name", "IP", "Node"], [None, "100.96.0.1", "n1"], "name None"),
    ],
    ids=["no-ip-column", "short-row", "ip-not-text", "no-name"],
)
def test_a_table_the_job_cannot_read_is_one_line_naming_what(
    kubeapi: KubeApiServer, tmp_path: Path, columns: list[str], cells: list[Any], said: str
) -> None:
    """As a broken proxy might print it (a real server prints every column, as text)."""
    page = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": [{"name": name, "type": "string"} for name in columns],
        "rows": [{"cells": cells, "object": None}],
    }
    kubeapi.fail("GET", "^/api/v1/pods$", 200, body=page)
    with pytest.raises(KubeError) as raised:
        each_pod(kubeapi, tmp_path, one_ip_each=True)
    assert raised.value.kind == "bad_answer" and said in str(raised.value) and "\n" not in str(raised.value)


def test_an_empty_page_needs_no_columns_and_an_empty_list_is_no_pods(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    assert each_pod(kubeapi, tmp_path, one_ip_each=True) == {}
    from_the_start = base64.urlsafe_b64encode(json.dumps({"last": ""}).encode()).decode()  # the test server's form
    page = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"continue": from_the_start}, "rows": []}
    kubeapi.add_pod("shop", "cart-1", "n1", "100.96.0.1")
    kubeapi.fail("GET", "^/api/v1/pods$", 200, body=page)
    assert each_pod(kubeapi, tmp_path, one_ip_each=True) == {
        (ANY_NAMESPACE, "cart-1"): PodInfo("n1", ("100.96.0.1",))
    }, "a page with no rows and no columns, then the rest by its continue token"


def test_fields_of_a_table_the_job_does_not_read_may_hold_anything(kubeapi: KubeApiServer, tmp_path: Path) -> None:
    """Other cells of any type, row conditions, objects, unknown top-level fields: skipped."""
    page = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "7", "remainingItemCount": 0},
        "columnDefinitions": [
            {"name": "Restarts", "type": "integer", "priority": 0},
            {"name": "Node"},
            {"name": "IP"},
            {"name": "Name"},
        ],
        "rows": [
            {
                "cells": [{"n": 3}, "n1", "100.96.0.1", "a"],
                "object": {"kind": "PartialObjectMetadata"},
                "conditions": [7],
            },
            {"cells": [None, "<none>", "<none>", "b"]},
        ],
        "somethingNewer": [1, 2],
    }
    kubeapi.fail("GET", "^/api/v1/pods$", 200, body=json.loads(json.dumps(page)))
    assert each_pod(kubeapi, tmp_path, one_ip_each=True) == {
        (ANY_NAMESPACE, "a"): PodInfo("n1", ("100.96.0.1",)),
        (ANY_NAMESPACE, "b"): PodInfo(None, ()),
    }

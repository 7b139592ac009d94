"""`make demo`: the real job, end to end, on a throwaway etcd and Kubernetes API test server.

Seeds a kops-like cluster (live nodes; an orphan holding the IP of a new node; an orphan with
pods and borrowed IPs; a host registered before orchRefs existed), then runs `python -m job`
exactly as the CronJob would: a dry run, an apply run, and a backlog clean with match-name.
Then lists the reports kept in the cluster, undoes the apply run with `restore` (a dry run,
then --apply), and shows IPAM garbage: an IPAM-only host left by a hand-run clean-up, and a stale
handle.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support import calico
from tests.support.etcd_server import EtcdServer
from tests.support.kubeapi import KubeApiServer
from tests.support.scenario import CONFLICT_ORPHAN, LIVE, NEW_NODE, POD_ORPHAN, kops_cluster

RUNS = [
    ("1. dry run (the default): nothing is written to etcd", []),
    ("2. --apply after the grace period (shortened here to 0s)", ["--apply", "--grace-period", "0s"]),
    (
        "3. --apply --unreferenced=match-name: the backlog without orchRefs",
        ["--apply", "--grace-period", "0s", "--unreferenced", "match-name"],
    ),
]


def broken_node_findings(kubeapi: KubeApiServer) -> None:
    """The new node's calico-node crash-loops on the orphan's IP; a fail-closed webhook is down."""
    node = kubeapi.get("/api/v1/nodes", NEW_NODE)
    assert node is not None
    node["status"]["conditions"] = [
        {
            "type": "NetworkUnavailable",
            "status": "True",
            "reason": "NoRouteCreated",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]
    for name in LIVE:
        kubeapi.add_calico_node_pod(name)
    kubeapi.add_calico_node_pod(
        NEW_NODE,
        ready=False,
        restarts=14,
        waiting="CrashLoopBackOff",
        log=f"2026-11-30 05:00:01.000 [WARNING][9] startup/startup.go 1021: Calico node '{CONFLICT_ORPHAN}' "
        "is already using the IPv4 address 10.0.1.13.\n",
    )
    kubeapi.put(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        {
            "metadata": {"name": "policy-engine"},
            "webhooks": [
                {
                    "name": "pods.policy.example.com",
                    "failurePolicy": "Fail",
                    "clientConfig": {"service": {"namespace": "policy", "name": "policy-webhook"}},
                    "rules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ],
                }
            ],
        },
    )


def job(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`calico-gc ...` as a user runs it: its summary on stdout, its logs on stderr."""
    return subprocess.run([sys.executable, "-m", "job", *args], env=env, capture_output=True, text=True)


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="calico-gc-demo-"))
    etcd, kubeapi = EtcdServer(workdir / "etcd"), KubeApiServer()
    (workdir / "etcd").mkdir()
    try:
        etcd.start()
        kubeapi.start()
        scenario = kops_cluster()
        pool = {"cidr": "100.96.0.0/16", "ipipMode": "Always"}
        scenario.seed.resource("ippools", "default-ipv4-ippool", "IPPool", pool)
        calico.load(etcd.url, scenario.seed.keys)
        for name, ip in scenario.k8s_nodes:
            kubeapi.add_node(name, ip)
        broken_node_findings(kubeapi)
        print(
            f"etcd {etcd.url} seeded with {len(scenario.seed.keys)} Calico keys; "
            f"Kubernetes API test server {kubeapi.url} with {len(scenario.k8s_nodes)} Nodes"
        )
        env = {
            **os.environ,
            "ETCD_ENDPOINTS": etcd.url,
            "POD_NAMESPACE": "kube-system",
            "KUBECONFIG": str(kubeapi.write_kubeconfig(workdir / "kubeconfig")),
        }
        kept_run = None
        for title, args in RUNS:
            before = len(calico.dump(etcd.url))
            report_file = workdir / "report.json"
            result = job(env, *args, "--report-file", str(report_file))
            report = json.loads(report_file.read_text())
            assert report["exit_code"] == result.returncode
            print(f"\n== {title} (etcd keys {before} -> {len(calico.dump(etcd.url))})")
            print(result.stdout, end="")
            if result.returncode != 0:
                print(result.stderr[-2000:], file=sys.stderr)
                return result.returncode
            kept_run = kept_run or (report["run_id"] if report.get("kept_as") else None)
        assert kept_run is not None, "the apply run keeps its report"
        # The run removed two hosts. One held the new node's address (its calico-node crash-looped on
        # it): the restore refuses to bring that one back (exit 4, dry run and apply alike) and
        # restores the other.
        steps = [
            ("4. calico-gc reports: the runs that changed the datastore, kept in ConfigMaps", ["reports"], 0),
            (f"5. calico-gc restore {kept_run}: a dry run of the undo", ["restore", kept_run], 4),
            (f"6. calico-gc restore {kept_run} --apply", ["restore", kept_run, "--apply"], 4),
        ]
        for title, args, expected in steps:
            before = len(calico.dump(etcd.url))
            result = job(env, *args)
            print(f"\n== {title} (etcd keys {before} -> {len(calico.dump(etcd.url))}, exit {result.returncode})")
            print(result.stdout, end="")
            if result.returncode != expected:
                print(result.stderr[-2000:], file=sys.stderr)
                return result.returncode or 1
        # IPAM garbage: someone "cleaned" the restored host by deleting only its Calico Node (its IPAM,
        # endpoints and config stay: an IPAM-only host); a crash left a live pod's handle counting
        # one IP more than its block holds; and web-2 was deleted while its CNI DEL was lost (its
        # endpoint is gone, its IP stays allocated: a leak).
        calico.delete(etcd.url, f"/calico/resources/v3/projectcalico.org/nodes/{POD_ORPHAN}")
        web2 = next(k for k in calico.dump(etcd.url) if "workloadendpoints/default/" in k and "web--2" in k)
        calico.delete(etcd.url, web2)
        keys = calico.dump(etcd.url)
        block = json.loads(keys["/calico/ipam/v2/assignment/ipv4/block/100.96.1.0-26"][0])
        web1 = next(a["handle_id"] for a in block["attributes"] if a["secondary"].get("pod") == "web-1")
        handle = f"/calico/ipam/v2/handle/{web1}"
        value = json.loads(keys[handle][0])
        value["block"] = {cidr: count + 1 for cidr, count in value["block"].items()}
        calico.load(etcd.url, {handle: json.dumps(value)})
        for title, args in [
            ("7. IPAM garbage, dry run: the IPAM-only host, the stale handle, the leaked IP", []),
            (
                "8. --apply --release-leaked-ips: the IPAM-only host goes; handle and leak wait out their grace",
                ["--apply", "--release-leaked-ips"],
            ),
        ]:
            before = len(calico.dump(etcd.url))
            result = job(env, *args, "--grace-period", "0s")
            print(f"\n== {title} (etcd keys {before} -> {len(calico.dump(etcd.url))}, exit {result.returncode})")
            print(result.stdout, end="")
            if result.returncode != 0:
                print(result.stderr[-2000:], file=sys.stderr)
                return result.returncode
        # The stale handle waits for a second sighting 5 minutes on, the leak for 15 minutes of being
        # seen leaked. A demo cannot wait that long: it moves the recorded first sightings back.
        state = kubeapi.get("/api/v1/namespaces/kube-system/configmaps", "calico-gc-state")
        assert state is not None
        document = json.loads(state["data"]["state.json"])
        earlier = datetime.now(UTC) - timedelta(minutes=20)
        document["orphans"] = {name: earlier.isoformat().replace("+00:00", "Z") for name in document["orphans"]}
        state["data"]["state.json"] = json.dumps(document)
        kubeapi.put("/api/v1/namespaces/kube-system/configmaps", state)
        before = len(calico.dump(etcd.url))
        result = job(env, "--apply", "--release-leaked-ips", "--grace-period", "0s")
        title = "9. 20 minutes later (the demo moved the first sightings back): the handle is repaired, the IP released"
        print(f"\n== {title} (etcd keys {before} -> {len(calico.dump(etcd.url))}, exit {result.returncode})")
        print(result.stdout, end="")
        if result.returncode != 0:
            print(result.stderr[-2000:], file=sys.stderr)
            return result.returncode
        state = kubeapi.get("/api/v1/namespaces/kube-system/configmaps", "calico-gc-state")
        shown = json.dumps(json.loads(state["data"]["state.json"]), indent=2) if state else None
        print(f"\ngrace state ConfigMap kube-system/calico-gc-state:\n{shown}")
        print("Each command printed its summary on stdout (--output json gives the JSON report); the runs also")
        print("wrote the full JSON report to --report-file (docs/report.md).")
        return 0
    finally:
        kubeapi.stop()
        etcd.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

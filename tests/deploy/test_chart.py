"""The Helm chart, through Helm's own engine (helm-python-sdk: Helm v4's Go SDK, in its own venv):
it lints clean, its schema refuses bad values, it installs into any namespace with names of its
own, and with default values it renders exactly what `manifests/cronjob` applies."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from job import __version__
from job.config import OPTIONS, load
from tests.deploy.test_manifests import baseline_violations, pod_spec, render

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "calico-gc"
HELM_PYTHON = Path(sys.executable).parent.parent / "helm" / "bin" / "python"  # .venv/helm, made by `make test`
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
DATASTORE_OVERLAYS = {"etcdv3": "cronjob", "etcdv2": "calico-2.x", "kubernetes": "kdd"}
RBAC = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM_PYTHON.exists(), "Helm's engine is installed by `make test` (.venv/helm)"
    return subprocess.run([str(HELM_PYTHON), str(ROOT / "tools" / "helm.py"), *args], capture_output=True, text=True)


def helm_render(
    values: dict[str, Any] | None = None, name: str = "calico-gc", namespace: str = "kube-system"
) -> list[dict[str, Any]]:
    done = helm("render", str(CHART), json.dumps(values or {}), name, namespace)
    assert done.returncode == 0, done.stderr
    rendered = json.loads(done.stdout)
    return [
        doc
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def by_name(docs: list[dict[str, Any]], kinds: tuple[str, ...] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs if kinds is None or d["kind"] in kinds}


def without_helm_labels(doc: dict[str, Any]) -> dict[str, Any]:
    """The object less the labels Helm adds (on the object, and on a CronJob's pod template)."""
    doc = json.loads(json.dumps(doc))
    holders = [doc["metadata"]]
    if doc["kind"] == "CronJob":
        holders.append(doc["spec"]["jobTemplate"]["spec"]["template"]["metadata"])
    for holder in holders:
        for label in HELM_LABELS:
            (holder.get("labels") or {}).pop(label, None)
    return doc


def test_the_chart_version_and_app_version_are_the_jobs() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__


@pytest.mark.parametrize("datastore", [None, "etcdv3", "etcdv2", "kubernetes"])
def test_lint_strict_is_clean(datastore: str | None) -> None:
    done = helm("lint", str(CHART), json.dumps({"datastore": datastore} if datastore else {}))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["errors"] == [] and report["total_charts_linted"] == 1
    # Only Helm's "icon is recommended" (severity 1, info) may remain: no warning, no error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


def test_the_default_render_is_the_kustomize_cronjob_object_by_object() -> None:
    chart = {key: without_helm_labels(doc) for key, doc in by_name(helm_render()).items()}
    kustomize = by_name(render("cronjob"))
    assert sorted(chart) == sorted(kustomize)
    for key, doc in kustomize.items():
        assert chart[key] == doc, key


@pytest.mark.parametrize("datastore", ["etcdv2", "kubernetes"])
def test_each_datastore_renders_its_overlays_rbac_and_settings(datastore: str) -> None:
    chart = {key: without_helm_labels(doc) for key, doc in by_name(helm_render({"datastore": datastore})).items()}
    overlay = by_name(render(DATASTORE_OVERLAYS[datastore]))
    for key, doc in overlay.items():
        if doc["kind"] in (*RBAC, "ConfigMap"):
            assert chart[key] == doc, key
    assert {k for k in chart if k[0] in RBAC} == {k for k in overlay if k[0] in RBAC}


def test_the_calico_api_group_is_set_only_when_given() -> None:
    def settings(values: dict[str, Any]) -> dict[str, str]:
        docs = by_name(helm_render({"datastore": "kubernetes", **values}))
        return next(d for k, d in docs.items() if k[0] == "ConfigMap" and k[1].endswith("-config"))["data"]

    assert "CALICO_API_GROUP" not in settings({}), "unset: chosen as Calico chooses it"
    assert settings({"calicoApiGroup": "projectcalico.org/v3"})["CALICO_API_GROUP"] == "projectcalico.org/v3"


def test_the_etcd_user_is_a_setting_and_its_password_a_mounted_file_only_when_given() -> None:
    docs = by_name(helm_render())
    _, pod = pod_spec(list(docs.values()))
    assert "ETCD_PASSWORD_FILE" not in {e["name"] for e in pod["containers"][0]["env"]}
    assert "ETCD_USERNAME" not in docs[("ConfigMap", "calico-gc-config")]["data"]
    docs = by_name(helm_render({"etcd": {"username": "calico-gc", "passwordSecret": "calico-gc-etcd-user"}}))
    _, pod = pod_spec(list(docs.values()))
    (container,) = pod["containers"]
    assert docs[("ConfigMap", "calico-gc-config")]["data"]["ETCD_USERNAME"] == "calico-gc"
    path = {e["name"]: e for e in container["env"]}["ETCD_PASSWORD_FILE"]["value"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])["secret"]
    assert volume["secretName"] == "calico-gc-etcd-user" and mount["readOnly"]
    assert volume["items"] == [{"key": "password", "path": path.rsplit("/", 1)[1]}]


def test_the_image_is_the_app_version_and_every_run_is_a_dry_run_by_default() -> None:
    docs = by_name(helm_render())
    _, pod = pod_spec(list(docs.values()))
    assert pod["containers"][0]["image"] == f"calico-gc:{__version__}"
    assert docs[("ConfigMap", "calico-gc-config")]["data"]["CALICO_GC_APPLY"] == "false"
    settings = by_name(helm_render({"apply": True}))[("ConfigMap", "calico-gc-config")]["data"]
    assert settings["CALICO_GC_APPLY"] == "true"


def test_installed_in_any_namespace_each_release_has_names_of_its_own() -> None:
    docs = helm_render(name="second", namespace="platform-tools")
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "platform-tools", doc["metadata"]["name"]
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "second-calico-gc", "namespace": "platform-tools"}
        ]
    named = by_name(docs)
    settings = named[("ConfigMap", "second-calico-gc-config")]["data"]
    assert set(settings) <= {option.env for option in OPTIONS}
    config = load([], {**settings, "POD_NAMESPACE": "platform-tools"})  # as the pod reads them
    granted = {
        name for rule in named[("Role", "second-calico-gc")]["rules"] for name in rule.get("resourceNames") or []
    }
    assert {config.lock_name, config.state_configmap} <= granted
    assert config.report_configmaps == "second-calico-gc-report"
    assert {f"second-calico-gc-report-{slot}-{part}" for slot in range(10) for part in range(4)} <= granted
    first = {
        name
        for rule in by_name(helm_render())[("Role", "calico-gc")]["rules"]
        for name in rule.get("resourceNames") or []
    }
    assert not first & granted, "two releases never share a Lease, state or report"
    assert not {k[1] for k in by_name(helm_render())} & {k[1] for k in named}


def test_host_networking_off_passes_the_baseline_checks() -> None:
    _, pod = pod_spec(helm_render({"hostNetwork": False}))
    assert baseline_violations(pod) == [] and pod["dnsPolicy"] == "ClusterFirst"
    _, pod = pod_spec(helm_render())
    assert baseline_violations(pod) == ["hostNetwork"] and pod["dnsPolicy"] == "Default"


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"datastore": "consul"}, "datastore"),
        ({"gracePeriod": "-5m"}, "gracePeriod"),
        ({"schedule": 5}, "schedule"),
        ({"maxDeletions": -1}, "maxDeletions"),
        ({"aply": True}, "aply"),
        ({"calicoApiGroup": "projectcalico.org/v1"}, "calicoApiGroup"),
        ({"prometheusRule": {"labels": {"release": ["kube-prometheus-stack"]}}}, "prometheusRule"),
        ({"prometheusRule": {"labels": {"not a label key": "x"}}}, "not a label key"),
        ({"prometheusRule": {"enabled": "yes"}}, "prometheusRule"),
    ],
)
def test_the_schema_refuses_bad_values(values: dict[str, Any], field: str) -> None:
    done = helm("render", str(CHART), json.dumps(values), "calico-gc", "kube-system")
    assert done.returncode == 1 and field in done.stderr, done.stderr
    assert "\n" not in done.stderr.strip(), "one line"


@pytest.mark.parametrize(
    "duration",
    ["365d", "8760h", "31536000000ms", "364d23h59m60s", "0.5s", "000000000030m", "0", "365d1ms", "300d100d", "8761h",
     "31536000001ms", "99999999999999999999999s", "1" * 400 + "d"],
)  # fmt: skip
def test_a_duration_the_job_would_refuse_as_too_long_is_refused_at_install(duration: str) -> None:
    """The schema's pattern cannot bound a sum of parts; the chart sums them as the job does
    (config.parse_duration, at most 365d), so a value the CronJob would refuse at every run is
    refused by `helm install`, in one line naming the value."""
    from job.config import ConfigError, parse_duration

    try:
        parse_duration(duration)
        taken = True
    except ConfigError:
        taken = False
    for field in ("gracePeriod", "conflictGracePeriod", "leaseDuration", "networkUnavailableThreshold"):
        done = helm("render", str(CHART), json.dumps({field: duration}), "calico-gc", "kube-system")
        assert (done.returncode == 0) is taken, (field, done.stderr)
        if not taken:
            assert f"{field}: " in done.stderr and "365d" in done.stderr and "\n" not in done.stderr.strip()


RULES = Path(__file__).resolve().parents[2] / "charts" / "calico-gc" / "files" / "calico-gc.rules.yaml"
# The Prometheus Operator's Duration (its CRD's pattern for a rule's `for`).
OPERATOR_DURATION = r"0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?"


def test_the_prometheus_rule_is_off_by_default_and_renders_the_rules_file_when_on() -> None:
    assert not [d for d in helm_render() if d["kind"] == "PrometheusRule"]
    values = {
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, "namespace": "monitoring"}
    }
    (rule,) = [d for d in helm_render(values) if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], "the one rules file, as it is"
    # What the Operator's CRD requires of each rule group and rule.
    for group in rule["spec"]["groups"]:
        assert isinstance(group["name"], str) and group["rules"]
        for each in group["rules"]:
            assert ("alert" in each) != ("record" in each) and isinstance(each["expr"], str)
            assert all(isinstance(v, str) for v in {**each.get("labels", {}), **each.get("annotations", {})}.values())
            assert re.fullmatch(OPERATOR_DURATION, each.get("for", "0")), each  # monitoring/v1 Duration


def test_the_kustomize_component_renders_the_same_rules() -> None:
    (rule,) = [d for d in render("examples/alerts") if d["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert rule["metadata"]["namespace"] == "kube-system" and rule["metadata"]["labels"]["release"]
    checked = subprocess.run([sys.executable, "tools/rules.py", "--check"], cwd=RULES.parents[3], capture_output=True)
    assert checked.returncode == 0, checked.stderr

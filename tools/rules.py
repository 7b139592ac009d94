"""manifests/components/prometheus-rule/prometheusrule.yaml from the one source of the alerts,
charts/calico-gc/files/calico-gc.rules.yaml (`make rules`; tests/flows/test_alerting.py fails
when the two differ). Kustomize cannot read a file outside the component, Helm none outside the
chart: this copy is how the same rules reach kustomize users."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "charts" / "calico-gc" / "files" / "calico-gc.rules.yaml"
COMPONENT = ROOT / "manifests" / "components" / "prometheus-rule" / "prometheusrule.yaml"
HEADER = "# Written by `make rules` from charts/calico-gc/files/calico-gc.rules.yaml: edit that file, not this one.\n"


def rendered() -> str:
    rules: dict[str, Any] = yaml.safe_load(SOURCE.read_text())
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "calico-gc",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "calico-gc"},
        },
        "spec": {"groups": rules["groups"]},
    }
    return HEADER + yaml.safe_dump(resource, sort_keys=False, width=1000)


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if COMPONENT.read_text() == rendered() else f"{COMPONENT} is stale: run `make rules`")
    COMPONENT.write_text(rendered())

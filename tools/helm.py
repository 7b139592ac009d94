"""Helm's own engine (helm-python-sdk, Helm v4's Go SDK) for the chart tests, run in its own venv
(`make` puts it in .venv/helm): `python tools/helm.py render CHART VALUES_JSON NAME NAMESPACE`
prints the rendered manifests as JSON ({template: text}), `manifests` (same arguments) as one YAML
stream, as `helm template` does (for checkov in `make lint`); `lint CHART VALUES_JSON` prints the
lint report. A refusal (a value the schema refuses, a template that fails) is one line on stderr, exit 1."""

from __future__ import annotations

import json
import sys

import helm_python as helm  # type: ignore[import-not-found]


def main(argv: list[str]) -> int:
    command, chart, values = argv[0], argv[1], json.loads(argv[2])
    try:
        if command in ("render", "manifests"):
            name, namespace = argv[3], argv[4]
            rendered = helm.Chart.load(chart).render(values, name=name, namespace=namespace, is_install=True)
            if command == "render":
                print(json.dumps(rendered))
            else:
                print("\n---\n".join(text for path, text in sorted(rendered.items()) if path.endswith(".yaml")))
        else:
            print(json.dumps(helm.lint(chart, values, strict=True)))
    except helm.HelmError as error:
        print(" ".join(str(error).split()), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

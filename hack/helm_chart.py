#!/usr/bin/env python3
"""Lints and renders a Helm chart offline with Helm's own engine, for the chart tests (xtask/tests/chart.rs).

No `helm` binary is packaged where CI installs from; PyPI's helm-python-sdk carries Helm v4's library
(libhelm_c, Helm's Go SDK behind a C ABI), which lints and renders without a cluster. This script is the
thin bridge: it prints JSON on stdout for the Rust tests to read.

  helm_chart.py lint CHART_DIR [VALUES_JSON]
      {"messages": [{"severity", "path", "error"}], "errors": [...]}        (severity 3 is an error)
  helm_chart.py render CHART_DIR VALUES_JSON RELEASE NAMESPACE
      {"manifests": {template path: YAML}, "crds": {file name: YAML}, "notes": text}
      or {"error": message} (exit status 1) when Helm refuses the values or a template fails

Exit status 3, with the reason on stderr, when the SDK is not installed (`pip install helm-python-sdk`).
"""

import json
import sys

try:
    import helm_python as helm
except ImportError as error:  # the tests skip, or fail under CI
    print(f"helm-python-sdk is not installed ({error}): pip install helm-python-sdk", file=sys.stderr)
    sys.exit(3)


def lint(chart_dir, values):
    report = helm.lint(chart_dir, values, strict=True)
    return {"messages": report.get("messages") or [], "errors": report.get("errors") or []}


def render(chart_dir, values, release, namespace):
    with helm.Chart.load(chart_dir) as chart:
        try:
            rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
        except helm.HelmError as error:
            return {"error": str(error)}
        crds = {crd["filename"]: crd["data"] for crd in chart.crds}
    notes = {path: text for path, text in rendered.items() if path.endswith("NOTES.txt")}
    manifests = {path: text for path, text in rendered.items() if path not in notes}
    return {"manifests": manifests, "crds": crds, "notes": "".join(notes.values())}


def main(argv):
    if len(argv) >= 2 and argv[0] == "lint":
        values = json.loads(argv[2]) if len(argv) > 2 else None
        print(json.dumps(lint(argv[1], values)))
        return 0
    if len(argv) == 5 and argv[0] == "render":
        result = render(argv[1], json.loads(argv[2]), argv[3], argv[4])
        print(json.dumps(result))
        return 1 if "error" in result else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

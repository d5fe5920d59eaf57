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

Helm's actions against a cluster (the envtest tier, tests/envtest/chart_actions.rs), each printing the
SDK's answer as JSON, or {"error": message} with exit status 1:

  helm_chart.py install KUBECONFIG CHART RELEASE NAMESPACE VALUES_JSON
  helm_chart.py upgrade KUBECONFIG CHART RELEASE NAMESPACE VALUES_JSON
  helm_chart.py rollback KUBECONFIG RELEASE NAMESPACE REVISION
  helm_chart.py uninstall KUBECONFIG RELEASE NAMESPACE
  helm_chart.py status KUBECONFIG RELEASE NAMESPACE            (with the release's manifest)
  helm_chart.py history KUBECONFIG RELEASE NAMESPACE
  helm_chart.py test KUBECONFIG RELEASE NAMESPACE TIMEOUT_SECONDS  (the release's test hooks, `helm test`)

CHART is a chart directory or a packaged chart (.tgz). And the fixture of the upgrade scenario, the chart as
a commit of this repository has it, packaged:

  helm_chart.py package-from-git COMMIT DESTINATION_DIR
      {"path": the .tgz written}

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


def action(argv):
    verb, kubeconfig = argv[0], argv[1]
    namespace = argv[4] if verb in ("install", "upgrade") else argv[3]
    config = helm.Config(kubeconfig_path=kubeconfig, namespace=namespace)
    try:
        if verb in ("install", "upgrade"):
            chart, release, values = argv[2], argv[3], json.loads(argv[5])
            run = config.install if verb == "install" else config.upgrade
            return run(chart, release, values, namespace=namespace, timeout=120)
        release = argv[2]
        if verb == "rollback":
            config.rollback(release, version=int(argv[4]), timeout=120)
            return {"rolled back to": int(argv[4])}
        if verb == "uninstall":
            return config.uninstall(release, timeout=120)
        if verb == "status":
            return config.status(release)
        if verb == "history":
            return {"revisions": config.history(release)}
        if verb == "test":
            return config.test(release, timeout=int(argv[4]))
    except helm.HelmError as error:
        return {"error": str(error)}
    finally:
        config.close()
    raise ValueError(verb)


def package_from_git(commit, destination):
    """git archive of charts/memcached-operator at COMMIT, packaged by Helm into DESTINATION."""
    import os
    import subprocess
    import tarfile
    import tempfile

    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                          text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        archive = subprocess.run(["git", "-C", root, "archive", commit, "charts/memcached-operator"],
                                 check=True, capture_output=True).stdout
        tar = os.path.join(scratch, "chart.tar")
        with open(tar, "wb") as out:
            out.write(archive)
        with tarfile.open(tar) as t:
            t.extractall(scratch, filter="data")
        path = helm.package(os.path.join(scratch, "charts/memcached-operator"),
                            destination=os.path.abspath(destination))
    return {"path": path}


ACTIONS = {"install": 6, "upgrade": 6, "rollback": 5, "uninstall": 4, "status": 4, "history": 4, "test": 5}


def main(argv):
    if argv and ACTIONS.get(argv[0]) == len(argv):
        result = action(argv)
        print(json.dumps(result, default=str))
        return 1 if isinstance(result, dict) and "error" in result else 0
    if len(argv) == 3 and argv[0] == "package-from-git":
        print(json.dumps(package_from_git(argv[1], argv[2])))
        return 0
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

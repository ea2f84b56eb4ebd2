"""The checks a platform team runs before it deploys: hadolint on the Dockerfiles, checkov
over every rendered overlay and the runner pods the controller builds (infra/examples/).
Nothing fails; every check skipped is skipped in the manifest, with its reason; and a pod
that breaks the rules is caught (the checks do run). checkov lives in a venv of its own
(`make policy-tools`: its pins conflict with the test tools'), found as EBB_CHECKOV, then
.venv-policy/bin/checkov, then on PATH."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_infra_manifests import OVERLAYS, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "infra" / "examples"
DOCKERFILES = sorted((ROOT / "infra" / "docker").glob("Dockerfile.*"))


def tool(name: str, *candidates: Path) -> str:
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    assert found, f"{name} is missing: `make policy-tools` (checkov) / `make install` (hadolint)"
    return found


def checkov() -> str:
    explicit = os.environ.get("EBB_CHECKOV")
    return tool(
        "checkov", *([Path(explicit)] if explicit else []), ROOT / ".venv-policy/bin/checkov"
    )


def test_hadolint_passes_the_dockerfiles():
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]
    hadolint = tool("hadolint", Path(sys.executable).parent / "hadolint")
    done = subprocess.run(
        [hadolint, "--failure-threshold", "info", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def broken_pod() -> dict:
    """A runner example with its security context and resources taken away."""
    pod = yaml.safe_load((EXAMPLES / "runner-gpu.yaml").read_text())
    bad = copy.deepcopy(pod)
    bad["metadata"]["name"] = "broken"
    del bad["spec"]["securityContext"]
    del bad["spec"]["containers"][0]["securityContext"]
    return bad


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> list[dict]:
    """One checkov run over every overlay, every runner example and one broken pod."""
    where = tmp_path_factory.mktemp("checkov")
    for overlay in OVERLAYS:
        (where / f"overlay-{overlay}.yaml").write_text(yaml.safe_dump_all(render(overlay)))
    for example in EXAMPLES.glob("runner-*.yaml"):
        shutil.copy(example, where / example.name)
    (where / "broken.yaml").write_text(yaml.safe_dump(broken_pod()))
    done = subprocess.run(
        [checkov(), "-d", str(where), "--framework", "kubernetes", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout, done.stderr
    reports = json.loads(done.stdout)
    return reports if isinstance(reports, list) else [reports]


def results(reports: list[dict], kind: str) -> list[dict]:
    return [r for report in reports for r in report["results"].get(kind, [])]


def test_checkov_passes_every_overlay_and_runner_pod(scanned):
    failed = [
        f"{r['check_id']} {r['check_name']}: {r['resource']} ({Path(r['file_path']).name})"
        for r in results(scanned, "failed_checks")
        if not r["resource"].endswith(".broken")
    ]
    assert failed == [], "\n".join(failed)
    checked = {r["resource"] for r in results(scanned, "passed_checks")}
    for name in ("Deployment.ebb.ebb-frontdoor", "Pod.ebb.ebb-runner-tp2-1"):
        assert name in checked


def test_every_skipped_check_says_why(scanned):
    skipped = results(scanned, "skipped_checks")
    assert skipped, "the manifests skip some checks"
    unexplained = [
        f"{r['check_id']} on {r['resource']}"
        for r in skipped
        if len((r.get("check_result") or {}).get("suppress_comment") or "") < 20
    ]
    assert unexplained == []


def test_a_pod_that_breaks_the_rules_is_caught(scanned):
    caught = {
        r["check_id"]
        for r in results(scanned, "failed_checks")
        if r["resource"].endswith(".broken")
    }
    assert {"CKV_K8S_20", "CKV_K8S_23", "CKV_K8S_28", "CKV_K8S_37"} <= caught, caught

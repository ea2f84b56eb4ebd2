"""The README's short tour runs as pasted (issue 52): its shell snippet (the key exported
from `.ebb/admin_key`, then curl) and its Python snippet (the official openai client),
against `ebb up` on the fake engine serving the tour's model name. Only the port differs
(the README says how to change it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import httpx
import pytest
from support import REPO_ROOT, deploy

pytestmark = pytest.mark.integration

README_PORT = "127.0.0.1:8000"


def _tour_blocks(lang: str) -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    tour = text.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", tour, re.DOTALL)


@pytest.fixture(scope="module")
def tour(platform, admin, tmp_path_factory):
    deploy(admin, "smollm2-135m-instruct", "fake://tour")
    # The repository root as `make run` leaves it: the admin key saved under .ebb.
    root = tmp_path_factory.mktemp("repo")
    (root / ".ebb").mkdir()
    (root / ".ebb" / "admin_key").write_text(platform.admin_key + "\n")
    return root, platform.base_url.removeprefix("http://")


def test_the_shell_snippet_exports_the_key_and_curl_gets_an_answer(tour, platform):
    root, address = tour
    block = _tour_blocks("sh")[0].replace(README_PORT, address)  # the next: the CLI's
    assert block.startswith("export EBB_KEY=$(cat .ebb/admin_key)\ncurl ")
    if shutil.which("curl"):
        done = subprocess.run(
            ["bash", "-euc", block], cwd=root, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
    else:  # the same request, as curl would send it
        body = json.loads(re.search(r"-d '(.*?)'", block, re.DOTALL)[1])
        headers = {"Authorization": f"Bearer {platform.admin_key}"}
        answer = httpx.post(f"http://{address}/v1/chat/completions", json=body, headers=headers)
        answer = answer.json()
    assert answer["model"] == "smollm2-135m-instruct", answer
    assert answer["choices"][0]["message"]["content"]


def test_the_python_snippet_runs_as_pasted_and_prints_only_the_answer(tour):
    root, address = tour
    [block] = _tour_blocks("python")
    env = {**os.environ, "EBB_KEY": (root / ".ebb" / "admin_key").read_text().strip()}
    done = subprocess.run(
        [sys.executable, "-c", block.replace(README_PORT, address)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text, _, usage = done.stdout.rstrip("\n").rpartition("\n")
    assert text.strip() and "None" not in done.stdout, done.stdout
    assert re.fullmatch(r"\(\d+ tokens\)", usage), done.stdout

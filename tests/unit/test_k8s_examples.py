"""infra/examples/: the runner pods the controller builds (a CPU runner, one GPU, tensor
parallel 2, a pool's stem) from the settings the overlays' ConfigMaps give it, committed
so a platform team reads and policy-checks them (test_policy_checks.py). They equal what
the code builds today; after a change, regenerate them:

    python tests/unit/test_k8s_examples.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_infra_manifests import by_kind, render  # noqa: E402

from ebb.coldstart.k8s_pods import GIB, PodTemplate, RunnerShape, runner_image_of, runner_pod
from ebb.coldstart.placement import Placement
from ebb.config import Settings
from ebb.launching.tiers import Tier

EXAMPLES = Path(__file__).resolve().parents[2] / "infra" / "examples"
HEADER = "# Rendered by tests/unit/test_k8s_examples.py (python tests/unit/test_k8s_examples.py).\n"


def template_of(overlay: str) -> PodTemplate:
    """The runner pods' template as a controller of `overlay` builds it: its ConfigMap's
    settings, the runner image its PodTemplate names."""
    docs = render(overlay)
    data = by_kind(docs, "ConfigMap")["ebb-config"]["data"]
    with mock.patch.dict(os.environ, {k: v for k, v in data.items() if k.startswith("EBB_")}):
        template = PodTemplate.from_settings(Settings())
    image = runner_image_of(by_kind(docs, "PodTemplate")[data["EBB_K8S_RUNNER_TEMPLATE"]])
    return PodTemplate(**{**template.__dict__, "image": image})


def examples() -> dict[str, dict]:
    cpu, cuda = template_of("cpu"), template_of("cuda")
    a100 = "NVIDIA-A100-SXM4-80GB"

    def pod(template: PodTemplate, runner_id: str, deployment: str | None, **kw) -> dict:
        tier = Tier.PREWARMED if deployment is None else Tier.FRESH
        kw.setdefault("placement", Placement())
        return runner_pod(template, runner_id, deployment, tier, launched_ms=0, **kw)

    return {
        "runner-cpu.yaml": pod(
            cpu, "cpu-1", "smollm2", shape=RunnerShape(memory_bytes=(4 + 1 + 1) * GIB)
        ),
        "runner-gpu.yaml": pod(
            cuda,
            "gpu-1",
            "llama-8b",
            shape=RunnerShape(gpus=1, memory_bytes=20 * GIB, accelerator=a100),
            placement=Placement("gpu-node-1", (0,)),
        ),
        "runner-tp2.yaml": pod(
            cuda,
            "tp2-1",
            "llama-70b",
            shape=RunnerShape(gpus=2, memory_bytes=136 * GIB, accelerator=a100),
        ),
        "runner-stem.yaml": pod(cuda, "stem-1", None, shape=RunnerShape(gpus=1), pool="a100"),
    }


def dump(pod: dict) -> str:
    return HEADER + yaml.safe_dump(pod, sort_keys=False)


def test_the_committed_runner_pod_examples_are_what_the_code_builds():
    built = examples()
    assert sorted(p.name for p in EXAMPLES.glob("runner-*.yaml")) == sorted(built)
    for name, pod in built.items():
        committed = (EXAMPLES / name).read_text()
        assert committed == dump(pod), f"{name} is stale: python tests/unit/test_k8s_examples.py"


if __name__ == "__main__":
    EXAMPLES.mkdir(exist_ok=True)
    for name, pod in examples().items():
        (EXAMPLES / name).write_text(dump(pod))
        print(f"wrote {EXAMPLES / name}")

"""The Ray two-node cluster on loopback (its own network namespace) with the real engine on
the default model: the pre-warmed stem, a Ray actor waiting on the worker node, becomes
the runner, answers through the frontdoor on the head, then drains to zero."""

from __future__ import annotations

import pytest
from support.ray_namespace import run_in_namespace

pytestmark = pytest.mark.e2e


def test_the_default_model_answers_from_the_ray_worker_node(default_local_model):
    run_in_namespace("--real-engine")

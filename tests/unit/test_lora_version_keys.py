"""An adapter's versions share its identity (uid) but not its files: a runner keeps each
version loaded apart, and claiming's affinity tells them apart too."""

from __future__ import annotations

from support.lora import write_adapter

from ebb.engine_options import LoraLimits
from ebb.queue.prefix import affinity_key
from ebb.queue.schema import AdapterRef, SamplingSpec, WorkItem
from ebb.runners.adapters import RunnerAdapters


def _work(ref: AdapterRef) -> WorkItem:
    sampling = SamplingSpec(max_tokens=4)
    return WorkItem(
        request_id="r", deployment="base", prompt_token_ids=[1], sampling=sampling, adapter=ref
    )


def _versions(tmp_path) -> tuple[AdapterRef, AdapterRef]:
    one = AdapterRef(name="ad", uid="dep_ad", source=str(write_adapter(tmp_path / "one")))
    two = AdapterRef(
        name="ad@v2", uid="dep_ad", source=str(write_adapter(tmp_path / "two", rank=16))
    )
    return one, two


def test_a_runner_keeps_each_version_of_an_adapter_loaded_apart(tmp_path):
    one, two = _versions(tmp_path)
    adapters = RunnerAdapters(tmp_path / "cache", limits=LoraLimits(2, 16, 4))
    first = adapters.for_work(_work(one))
    second = adapters.for_work(_work(two))
    assert adapters.cold_loads == 2
    assert first.int_id != second.int_id and first.path != second.path
    assert (first.name, second.name) == ("ad", "ad@v2")  # the engine tells them apart
    assert adapters.for_work(_work(one)) == first and adapters.for_work(_work(two)) == second
    assert adapters.cold_loads == 2


def test_claiming_affinity_tells_an_adapters_versions_apart(tmp_path):
    one, two = _versions(tmp_path)
    assert affinity_key(_work(one)) == "lora-dep_ad"  # version 1's key is unchanged
    assert affinity_key(_work(two)) != affinity_key(_work(one))

"""Each vLLM patch against the installed vLLM: it applies, does what it claims, applies once,
and when its target is not what it expects, fails (required) or warns once (optional).

vLLM is imported once for the module (~7 s). Patches are applied against a fresh record and
with their targets restored after each test (`isolated`), except the kernel stand-ins: their
registration cannot be undone, so that test leaves the process as a runner's preload does.
"""

from __future__ import annotations

import logging
import mmap
import os
import sys
from types import SimpleNamespace

import pytest

from ebb.runners import engine_patches, engine_patches_load, engine_patches_preload
from ebb.runners.engine_patches import VERIFIED_ON, VllmPatchError

ENV_VARIABLES = (
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK",
    "OMP_NUM_THREADS",
    "VLLM_CPU_KVCACHE_SPACE",
)


@pytest.fixture(scope="module")
def vllm():
    import vllm
    import vllm.logger
    import vllm.platforms
    import vllm.renderers.base
    import vllm.renderers.hf
    import vllm.v1.sample.sampler
    import vllm.v1.worker.utils
    from vllm.model_executor.layers import vocab_parallel_embedding
    from vllm.model_executor.models import registry

    return SimpleNamespace(
        package=vllm,
        logger=vllm.logger,
        platforms=vllm.platforms,
        renderer=vllm.renderers.hf,
        renderer_base=vllm.renderers.base,
        worker_utils=vllm.v1.worker.utils,
        embedding=vocab_parallel_embedding,
        registry=registry,
        sampler=vllm.v1.sample.sampler,
    )


@pytest.fixture
def isolated(vllm, monkeypatch):
    """A fresh patch record; the patched attributes and variables are restored after."""
    monkeypatch.setattr(engine_patches, "_applied", {})
    monkeypatch.setattr(engine_patches, "_warned", set())
    monkeypatch.setattr(engine_patches, "_defaulted", set())
    for host, attribute in (
        (vllm.registry, "_run_in_subprocess"),
        (vllm.renderer, "maybe_make_thread_pool"),
        (vllm.renderer_base.BaseRenderer, "get_eos_token_id"),
        (vllm.worker_utils, "torch"),
        (vllm.embedding.UnquantizedEmbeddingMethod, "process_weights_after_loading"),
        (vllm.sampler, "batched_count_greater_than"),
    ):
        monkeypatch.setattr(host, attribute, getattr(host, attribute))
    for variable in ENV_VARIABLES:
        # setenv first: delenv alone records nothing for an unset variable, and what a
        # test then sets would outlive it.
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    return vllm


def warnings_about(caplog, patch_name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == engine_patches.__name__
        and r.levelno == logging.WARNING
        and patch_name in r.getMessage()
    ]


def assert_warns_once(caplog, patch: engine_patches.Patch, problem: str) -> None:
    caplog.set_level(logging.WARNING, logger=engine_patches.__name__)
    assert engine_patches.apply(patch) is False
    assert engine_patches.apply(patch) is False
    (message,) = warnings_about(caplog, patch.name)
    assert f"verified on vLLM {VERIFIED_ON}" in message
    assert f"to vLLM {engine_patches.installed_version()}" in message
    assert problem in message
    assert patch.name not in engine_patches.applied()


# --- version and record -----------------------------------------------------------------


def test_the_record_names_the_installed_vllm_version(isolated):
    assert engine_patches.installed_version() == isolated.package.__version__
    assert engine_patches.apply(engine_patches_preload.LOGGING_CONFIGURED_EARLY)
    assert engine_patches.applied() == {"logging-configured-early": isolated.package.__version__}
    with pytest.raises(TypeError):
        engine_patches.applied()["forged"] = "0"  # type: ignore[index]


def test_a_patch_applied_once_is_not_installed_again(isolated):
    installs = []
    patch = engine_patches.Patch(
        name="counted",
        required=True,
        check=lambda: None,
        install=lambda: installs.append(1),
        without="nothing",
    )
    assert engine_patches.apply(patch) and engine_patches.apply(patch)
    assert installs == [1]


# --- process environment ----------------------------------------------------------------


def test_process_env_sets_defaults_and_an_operators_value_wins(isolated, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")  # as in a runner, before torch loads
    monkeypatch.setenv("VLLM_DO_NOT_TRACK", "0")
    engine_patches.set_process_env()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_NO_USAGE_STATS"] == "1"
    assert os.environ["VLLM_DO_NOT_TRACK"] == "0"
    assert int(os.environ["OMP_NUM_THREADS"]) == max(1, (os.cpu_count() or 2) - 1)
    assert {"in-process-engine-core", "no-usage-stats", "omp-threads"} <= set(
        engine_patches.applied()
    )


def test_an_env_default_vllm_no_longer_reads_only_warns(isolated, monkeypatch, caplog):
    monkeypatch.setattr(engine_patches, "vllm_env_source", lambda: '"VLLM_NO_USAGE_STATS": 1')
    assert_warns_once(
        caplog, engine_patches.NO_USAGE_STATS, "vLLM no longer reads VLLM_DO_NOT_TRACK"
    )
    assert "VLLM_NO_USAGE_STATS" not in os.environ


def test_omp_threads_set_after_torch_loaded_only_warns(isolated, caplog):
    assert "torch" in sys.modules  # vLLM's import loaded it
    assert_warns_once(caplog, engine_patches.OMP_THREADS, "torch is already imported")
    assert "OMP_NUM_THREADS" not in os.environ


def test_omp_threads_chosen_by_the_operator_is_kept(isolated, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert engine_patches.apply(engine_patches.OMP_THREADS)
    assert os.environ["OMP_NUM_THREADS"] == "7"


# --- per load ---------------------------------------------------------------------------


def test_cpu_kv_cache_space_is_set_for_every_load(isolated):
    engine_patches_load.apply_before_load(cuda=False, kv_cache_gib=3)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
    engine_patches_load.apply_before_load(cuda=False, kv_cache_gib=2)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "cpu-kv-cache-space" in engine_patches.applied()


def test_cpu_kv_cache_space_vllm_no_longer_reads_fails(isolated, monkeypatch):
    monkeypatch.setattr(engine_patches, "vllm_env_source", lambda: "")
    with pytest.raises(VllmPatchError) as failure:
        engine_patches_load.apply_before_load(cuda=False, kv_cache_gib=3)
    reason = str(failure.value)
    assert "'cpu-kv-cache-space'" in reason and f"verified on vLLM {VERIFIED_ON}" in reason
    assert "no longer reads VLLM_CPU_KVCACHE_SPACE" in reason
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ


def test_on_cuda_a_load_patches_nothing(isolated):
    original = isolated.registry._run_in_subprocess
    engine_patches_load.apply_before_load(cuda=True, kv_cache_gib=3)
    assert isolated.registry._run_in_subprocess is original
    assert engine_patches.applied() == {}


def test_each_cpu_load_keeps_the_engine_core_in_this_process(isolated):
    """A process whose environment was reset after its first engine (a test module's
    teardown) built the next one in other processes, where the LoRA guard (patched here)
    does not run: base requests batched beside adapters answered as an adapter."""
    engine_patches.set_process_env()
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    engine_patches_load.apply_before_load(cuda=False, kv_cache_gib=1)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_the_lora_guard_refuses_an_engine_core_it_cannot_reach(isolated, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # an operator's own value
    problem = engine_patches_load.LORA_BASE_ROWS_UNADAPTED.check()
    assert problem is not None and "another process" in problem
    with pytest.raises(engine_patches.VllmPatchError, match="lora-base-rows-unadapted"):
        engine_patches.apply(engine_patches_load.LORA_BASE_ROWS_UNADAPTED)


def test_model_inspection_runs_in_process(isolated):
    original = isolated.registry._run_in_subprocess
    if original is engine_patches_load._call_here:
        # An engine loaded earlier in this test process patched it: start from a stand-in
        # with vLLM's signature (the fixture puts the attribute back afterwards).
        def original(fn):
            raise AssertionError("ran in a subprocess")

        isolated.registry._run_in_subprocess = original
    assert engine_patches_load.IN_PROCESS_MODEL_INSPECTION.check() is None  # the real target fits
    assert engine_patches.apply(engine_patches_load.IN_PROCESS_MODEL_INSPECTION)
    replaced = isolated.registry._run_in_subprocess
    assert replaced is not original
    assert replaced(lambda: sys.modules[__name__]) is sys.modules[__name__]  # same process
    assert engine_patches.apply(engine_patches_load.IN_PROCESS_MODEL_INSPECTION)
    assert isolated.registry._run_in_subprocess is replaced


def test_model_inspection_moved_only_warns(isolated, monkeypatch, caplog):
    monkeypatch.delattr(isolated.registry, "_run_in_subprocess")
    assert_warns_once(caplog, engine_patches_load.IN_PROCESS_MODEL_INSPECTION, "is missing")


# --- preload ----------------------------------------------------------------------------


def test_renderer_pool_starts_empty_with_the_eos_id_read_first(isolated, monkeypatch):
    patch = engine_patches_preload.RENDERER_TOKENIZER_COPIES_ON_DEMAND
    assert patch.check() is None  # the real targets fit
    copies_asked = []
    pooled = []

    class Tokenizer:
        eos_token_id = 2

    def make_pool(tokenizer, copies=1):
        copies_asked.append(copies)
        pooled.append(tokenizer)
        # From here on, as in vLLM's pool, reading the id would borrow a copy.
        type(tokenizer).eos_token_id = property(lambda self: pytest.fail("borrowed"))
        return tokenizer

    monkeypatch.setattr(isolated.renderer, "maybe_make_thread_pool", make_pool)
    assert engine_patches.apply(patch)
    wrapped = isolated.renderer.maybe_make_thread_pool
    tokenizer = wrapped(Tokenizer(), 3)
    assert copies_asked == [0] and pooled == [tokenizer]
    renderer = SimpleNamespace(tokenizer=tokenizer)
    assert isolated.renderer_base.BaseRenderer.get_eos_token_id(renderer) == 2
    # A tokenizer that did not pass through the pool is asked, as vLLM asks it.
    other = SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=7))
    assert isolated.renderer_base.BaseRenderer.get_eos_token_id(other) == 7
    assert engine_patches.apply(patch)
    assert isolated.renderer.maybe_make_thread_pool is wrapped


def test_renderer_pool_with_another_signature_only_warns(isolated, monkeypatch, caplog):
    monkeypatch.setattr(isolated.renderer, "maybe_make_thread_pool", lambda tokenizer: None)
    assert_warns_once(
        caplog,
        engine_patches_preload.RENDERER_TOKENIZER_COPIES_ON_DEMAND,
        "takes (tokenizer), expected",
    )


def test_kv_cache_buffer_is_pages_on_demand(isolated):
    import torch

    patch = engine_patches_preload.KV_CACHE_PAGES_ON_DEMAND
    assert patch.check() is None  # the real target fits
    assert engine_patches.apply(patch)
    module_torch = isolated.worker_utils.torch
    assert module_torch is not torch and module_torch.int8 is torch.int8
    size = 3 * (64 << 20) // 2 + 1  # a cache of odd size, over the threshold in bfloat16
    buffer = module_torch.zeros(size, dtype=torch.bfloat16, device=torch.device("cpu"))
    assert buffer.shape == (size,) and buffer.dtype == torch.bfloat16
    assert buffer.untyped_storage().data_ptr() % mmap.PAGESIZE == 0  # a mapping of its own
    assert not buffer.any()  # zeros, as torch.zeros gives
    buffer[-1] = 1.5  # writable, and its own memory
    assert buffer[-1].item() == 1.5 and module_torch.zeros(size, dtype=torch.bfloat16).sum() == 0
    small = module_torch.zeros(4, 4)  # anything else is torch's own
    assert small.shape == (4, 4) and small.dtype == torch.get_default_dtype()
    assert engine_patches.apply(patch)
    assert isolated.worker_utils.torch is module_torch


def test_kv_cache_allocated_otherwise_only_warns(isolated, monkeypatch, caplog):
    def allocate_kv_cache(kv_cache_config, device, layout, kernel_block_sizes=None):
        return {}

    monkeypatch.setattr(isolated.worker_utils, "allocate_kv_cache", allocate_kv_cache)
    assert_warns_once(
        caplog, engine_patches_preload.KV_CACHE_PAGES_ON_DEMAND, "no longer makes its buffer"
    )


def test_logprob_ranks_are_counted_eagerly_as_the_sampler_ranks_them(isolated):
    import torch

    patch = engine_patches_preload.LOGPROB_RANKS_EAGER
    assert patch.check() is None  # the real target fits: a torch.compile'd function
    assert engine_patches.apply(patch)
    assert not hasattr(isolated.sampler.batched_count_greater_than, "_torchdynamo_orig_callable")
    logprobs = torch.tensor([[-0.1, -2.0, -3.0, -2.0], [-5.0, -0.5, -1.0, -0.7]])
    sampled = torch.tensor([0, 2])
    # The sampler's own gather (top-2 and the sampled token's rank: 1 is the most likely).
    gathered = isolated.sampler.Sampler.gather_logprobs(logprobs, 2, sampled)
    assert gathered.selected_token_ranks.tolist() == [1, 3]
    assert gathered.logprob_token_ids.tolist() == [[0, 0, 1], [2, 1, 3]]
    tied = isolated.sampler.batched_count_greater_than(logprobs, torch.tensor([[-2.0], [-9.0]]))
    assert tied.tolist() == [3, 4]  # ties count, as in vLLM's `>=`


def test_logprob_ranks_no_longer_compiled_only_warns(isolated, monkeypatch, caplog):
    def batched_count_greater_than(x, values):
        return (x >= values).sum(-1)

    monkeypatch.setattr(isolated.sampler, "batched_count_greater_than", batched_count_greater_than)
    assert_warns_once(
        caplog, engine_patches_preload.LOGPROB_RANKS_EAGER, "no longer a torch.compile'd"
    )


def embedding_layer(layer_class, vocab: int = 64, hidden: int = 32):
    """A layer of `layer_class` holding just a loaded table (vLLM's own init needs a
    tensor-parallel group; packing reads only the weight)."""
    import torch

    layer = layer_class.__new__(layer_class)
    torch.nn.Module.__init__(layer)
    layer.weight = torch.nn.Parameter(torch.randn(vocab, hidden), requires_grad=False)
    return layer


def test_an_input_embedding_is_packed_on_its_first_gemm_and_the_lm_head_at_load(
    isolated, monkeypatch
):
    import torch
    from vllm.model_executor.layers import utils as layer_utils

    patch = engine_patches_preload.EMBEDDING_PACKED_ON_FIRST_GEMM
    assert patch.check() is None  # the real target fits
    packed = []
    pack = layer_utils.dispatch_cpu_unquantized_gemm

    def counting_pack(layer, remove_weight):
        packed.append(layer)
        return pack(layer, remove_weight)

    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", counting_pack)
    assert engine_patches.apply(patch)
    method = isolated.embedding.UnquantizedEmbeddingMethod()

    table = embedding_layer(torch.nn.Module)
    method.process_weights_after_loading(table)
    assert packed == []  # looked up row by row: nothing packed at load
    assert torch.equal(method.embedding(table, torch.tensor([3, 5])), table.weight[[3, 5]])
    x = torch.randn(3, 32)
    expected = torch.nn.functional.linear(x, table.weight)
    for _ in range(2):  # a model that multiplies by it: packed once, on the first GEMM
        assert torch.allclose(method.apply(table, x), expected, atol=1e-4)
    assert packed == [table]

    lm_head = embedding_layer(isolated.embedding.ParallelLMHead)
    method.process_weights_after_loading(lm_head)
    assert packed == [table, lm_head]  # the logits' GEMM: packed at load
    assert torch.allclose(
        method.apply(lm_head, x), torch.nn.functional.linear(x, lm_head.weight), atol=1e-4
    )
    assert packed == [table, lm_head]
    installed = isolated.embedding.UnquantizedEmbeddingMethod.process_weights_after_loading
    assert engine_patches.apply(patch)
    assert installed is isolated.embedding.UnquantizedEmbeddingMethod.process_weights_after_loading


def test_embedding_packing_installs_over_itself_in_a_process_that_has_it(isolated):
    # A process that preloaded an engine has ebb's method already; a fresh record (another
    # load's, or a test's) must still find vLLM's code fitting and wrap it, not ebb's.
    import torch

    patch = engine_patches_preload.EMBEDDING_PACKED_ON_FIRST_GEMM
    assert engine_patches.apply(patch)
    engine_patches._applied.clear()
    assert patch.check() is None
    assert engine_patches.apply(patch)
    method = isolated.embedding.UnquantizedEmbeddingMethod()
    table = embedding_layer(torch.nn.Module)
    method.process_weights_after_loading(table)
    x = torch.randn(2, 32)
    assert torch.allclose(
        method.apply(table, x), torch.nn.functional.linear(x, table.weight), atol=1e-4
    )


def test_embedding_packing_moved_only_warns(isolated, monkeypatch, caplog):
    monkeypatch.setattr(
        isolated.embedding.UnquantizedEmbeddingMethod,
        "process_weights_after_loading",
        lambda self, layer: None,
    )
    assert_warns_once(
        caplog, engine_patches_preload.EMBEDDING_PACKED_ON_FIRST_GEMM, "no longer packs"
    )


def test_logging_is_configured_up_front(isolated):
    from vllm.engine.arg_utils import EngineArgs

    assert engine_patches.apply(engine_patches_preload.LOGGING_CONFIGURED_EARLY)
    expected = EngineArgs().create_logging_config()
    assert isolated.logger._last_configured_logging_config == expected


def test_logging_configuration_moved_only_warns(isolated, monkeypatch, caplog):
    monkeypatch.delattr(isolated.logger, "configure_logging_if_needed")
    assert_warns_once(caplog, engine_patches_preload.LOGGING_CONFIGURED_EARLY, "is missing")


def test_kernel_overrides_are_installed_once(vllm):
    # On the process's own record, and left applied: the stand-ins cannot be unregistered.
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.worker.block_table import ComputeSlotMappingKernel

    platform = vllm.platforms.current_platform
    if platform.is_cuda_alike():
        pytest.skip("Triton runs natively on GPUs: no stand-ins to install")
    assert engine_patches.apply(engine_patches_preload.KERNEL_OVERRIDES_ONCE)
    installed = ComputeSlotMappingKernel.kernel
    assert isinstance(installed, KernelOverride)
    assert engine_patches.apply(engine_patches_preload.KERNEL_OVERRIDES_ONCE)
    platform.register_triton_kernel_overrides()  # what engine init calls
    assert ComputeSlotMappingKernel.kernel is installed
    assert "kernel-overrides-once" in engine_patches.applied()


@pytest.mark.parametrize(
    ("platform", "problem"),
    [
        (SimpleNamespace(), "SimpleNamespace.register_triton_kernel_overrides is missing"),
        (SimpleNamespace(register_triton_kernel_overrides=1), "is not callable"),
        (
            SimpleNamespace(register_triton_kernel_overrides=lambda kernels: None),
            "takes (kernels), expected ()",
        ),
    ],
)
def test_kernel_overrides_that_do_not_fit_fail_the_preload(
    isolated, monkeypatch, platform, problem
):
    # What the preload imports, imported here while the real platform is current: a
    # module imported under the stand-in would keep it as its `current_platform`.
    import vllm.engine.arg_utils
    import vllm.inputs
    import vllm.sampling_params
    import vllm.v1.engine.llm_engine
    import vllm.v1.worker.cpu_worker  # noqa: F401

    from ebb.runners import engine_vllm

    monkeypatch.setattr(isolated.platforms, "_current_platform", platform)
    monkeypatch.setattr(engine_vllm, "_preloaded", False)
    monkeypatch.setattr(engine_vllm, "_has_cuda", lambda: False)
    with pytest.raises(VllmPatchError) as failure:
        engine_vllm.preload()
    reason = str(failure.value)
    assert reason.startswith(f"vLLM patch 'kernel-overrides-once' (verified on vLLM {VERIFIED_ON})")
    assert f"to vLLM {engine_patches.installed_version()}" in reason
    assert problem in reason
    assert "kernel-overrides-once" not in engine_patches.applied()
    assert engine_vllm._preloaded is False


def test_an_engine_loads_on_every_core_and_serves_on_the_cores_it_had(isolated):
    import torch

    from ebb.runners.engine_vllm import _every_core_while_loading

    serving = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        engine_patches.OMP_THREADS.install()  # no OMP_NUM_THREADS set: ebb's default
        assert engine_patches.thread_count_is_ours()
        with pytest.raises(RuntimeError), _every_core_while_loading(cuda=False):
            assert torch.get_num_threads() == (os.cpu_count() or 1)
            raise RuntimeError("the load failed")
        assert torch.get_num_threads() == 1
        with _every_core_while_loading(cuda=True):
            # On a GPU the host threads are not the load's bottleneck: left alone.
            assert torch.get_num_threads() == 1
    finally:
        torch._C.set_num_threads(serving)


def test_an_operators_thread_count_holds_while_loading(isolated, monkeypatch):
    import torch

    from ebb.runners.engine_vllm import _every_core_while_loading

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    engine_patches.OMP_THREADS.install()
    assert not engine_patches.thread_count_is_ours()
    serving = torch.get_num_threads()
    torch._C.set_num_threads(1)
    try:
        with _every_core_while_loading(cuda=False):
            assert torch.get_num_threads() == 1
    finally:
        torch._C.set_num_threads(serving)

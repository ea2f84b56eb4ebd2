"""The real conversion of the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) to bf16.

`default_local_model` (tests/conftest.py) converts it once per machine into
.ebb/test-weights; these tests check what vLLM and the frontdoor rely on.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from ebb.config import DEFAULT_MODEL_SOURCE
from ebb.weights_cache import cache as cache_module
from ebb.weights_cache import ensure, gguf_source, parse_source, verify

pytestmark = pytest.mark.e2e


def test_config_is_a_plain_bf16_llama(default_local_model):
    config = json.loads((default_local_model.path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16"
    assert default_local_model.max_model_len == config["max_position_embeddings"] > 0


def test_weights_load_and_match_the_gguf(default_local_model):
    import gguf
    from safetensors import safe_open

    with safe_open(default_local_model.path / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
        embed = f.get_tensor("model.embed_tokens.weight")
        v_proj = f.get_tensor("model.layers.0.self_attn.v_proj.weight")
    # Tied: vLLM rebuilds the head from the embedding; a saved copy would double it.
    assert "lm_head.weight" not in names
    assert str(embed.dtype) == "torch.bfloat16"

    gguf_path = gguf_source.locate_gguf(parse_source(DEFAULT_MODEL_SOURCE))
    tensors = {t.name: t for t in gguf.GGUFReader(gguf_path).tensors}
    for ours, theirs in ((embed[:64], "token_embd.weight"), (v_proj, "blk.0.attn_v.weight")):
        raw = tensors[theirs]
        rows = ours.shape[0]
        expected = gguf.quants.dequantize(raw.data[:rows], raw.tensor_type)
        # bf16 keeps 8 bits of mantissa: agreement to ~0.4% of the largest value.
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(ours.float().numpy(), expected, atol=scale * 4e-3)


def test_tokenizer_keeps_the_chat_template(default_local_model):
    from transformers import AutoTokenizer

    tokenizer_config = json.loads((default_local_model.path / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert tokenizer_config["model_max_length"] == default_local_model.max_model_len

    tokenizer = AutoTokenizer.from_pretrained(default_local_model.path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    assert (default_local_model.path / "generation_config.json").exists()


def test_the_frontdoors_tokenizer_gives_the_ids_transformers_gives(default_local_model):
    from transformers import AutoTokenizer

    from ebb.openai.tokenizer import HfPromptTokenizer

    reference = AutoTokenizer.from_pretrained(default_local_model.path)
    ours = HfPromptTokenizer.from_dir(default_local_model.path)
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "Answer in French. ¿Qué? 東京 🙂"},
            {"role": "user", "content": "  Two  spaces\nand a newline  "},
            {"role": "assistant", "content": "<|im_end|> is a special token"},
            {"role": "user", "content": ""},
        ],
    ]
    for chat in chats:
        text = reference.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert ours.render_chat(chat) == reference.encode(text, add_special_tokens=False)
    for prompt in ["The capital of France is", " leading space", "<|im_start|>user", ""]:
        assert ours.encode(prompt) == reference.encode(prompt, add_special_tokens=True)


def test_second_ensure_is_fast_and_converts_nothing(default_local_model, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a published model must not be converted or re-hashed again")

    monkeypatch.setattr(gguf_source, "convert_gguf", forbidden)
    monkeypatch.setattr(cache_module, "hash_files", forbidden)
    started = time.monotonic()
    again = ensure(DEFAULT_MODEL_SOURCE, default_local_model.manifest_path.parent.parent.parent)
    elapsed_s = time.monotonic() - started

    assert again == default_local_model
    print(f"second ensure: {elapsed_s * 1000:.1f} ms")


def test_published_files_match_their_manifest(default_local_model):
    verify(default_local_model, full=True)

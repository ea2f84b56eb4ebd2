"""LoRA adapters as peft saves them, written without torch: `adapter_config.json` and an
`adapter_model.safetensors` of zeros whose shapes are a decoder's (for the checks that
read only the config and the safetensors header). Real adapters come from peft itself
(tests/e2e/test_lora_e2e.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

# A small Llama-like decoder's shapes (what `check_against_base` compares against).
TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
}


def write_adapter(
    root: Path,
    *,
    rank: int = 8,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    config: dict | None = None,
    hidden: int | None = None,
    **extra: object,
) -> Path:
    """A LoRA adapter directory for a base of `config` (TINY_CONFIG by default);
    `hidden` overrides the input width it was trained for (another architecture)."""
    base = config or TINY_CONFIG
    root.mkdir(parents=True, exist_ok=True)
    adapter_config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(targets),
        "base_model_name_or_path": "tiny",
        **extra,
    }
    (root / "adapter_config.json").write_text(json.dumps(adapter_config))
    shapes = _shapes(base, hidden)
    tensors = {}
    for layer in range(base["num_hidden_layers"]):
        for module in targets:
            in_f, out_f = shapes.get(module, (base["hidden_size"], base["hidden_size"]))
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = [rank, in_f]
            tensors[f"{prefix}.lora_B.weight"] = [out_f, rank]
    _write_safetensors(root / "adapter_model.safetensors", tensors)
    return root


def _shapes(config: dict, hidden: int | None) -> dict[str, tuple[int, int]]:
    h = hidden or config["hidden_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["hidden_size"] // heads
    inner = config["intermediate_size"]
    return {
        "q_proj": (h, heads * head_dim),
        "k_proj": (h, kv * head_dim),
        "v_proj": (h, kv * head_dim),
        "o_proj": (heads * head_dim, h),
        "gate_proj": (h, inner),
        "up_proj": (h, inner),
        "down_proj": (inner, h),
    }


def _write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header: dict[str, object] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * shape[0] * shape[1]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(bytes(offset))


def write_raw_safetensors(path: Path, header_json: bytes, data_bytes: int = 64) -> None:
    """A safetensors file with the header `header_json` as given (a hostile one's)."""
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header_json)))
        f.write(header_json)
        f.write(bytes(data_bytes))


# Greedy tokens compared with transformers + peft: the first few, where two float32
# implementations agree (summation order may part them on a near tie later).
FIRST_TOKENS = 4


def peft_adapters(model_path: Path, root: Path, question: str) -> dict:
    """Adapters peft saves from the model at `model_path` under `root`: "zero" (as peft
    initialises it, lora_B = 0), "random" (seeded) and "wide" (rank 32); with the chat
    prompt of `question` and the random one's first greedy tokens under transformers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = get_peft_model(
        base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    model.save_pretrained(root / "zero")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.normal_(0, 0.1)
    model.save_pretrained(root / "random")
    out = model.generate(torch.tensor([prompt]), max_new_tokens=FIRST_TOKENS, do_sample=False)
    wide = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_path),
        LoraConfig(r=32, target_modules=["q_proj"]),
    )
    wide.save_pretrained(root / "wide")
    return {"root": root, "prompt": prompt, "random_tokens": out[0][len(prompt) :].tolist()}

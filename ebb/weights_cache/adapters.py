"""LoRA adapters (PEFT's saved layout) in the weight cache, and whether a base can serve one.

An adapter deployment's source is a directory as `peft`'s `save_pretrained` writes it:
`adapter_config.json` and `adapter_model.safetensors`. It is fetched, hashed, verified
and cached like any weights (`ensure_adapter`, the cache's `Layout` for adapters), and
checked against its base before any runner loads it: the checks are pure functions of
the adapter's files and the base's `config.json`, so the frontdoor refuses a bad adapter
at deploy (when it can read both) and a runner fails its request with the same message
otherwise. Every message says what to change.

Nothing here imports torch or peft: the shapes come from the safetensors header.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebb.errors import WeightsError
from ebb.weights_cache.cache import Layout, LocalModel, cached_manifest, ensure
from ebb.weights_cache.options import CacheOptions

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# The projections vLLM applies LoRA to in the decoder models it serves (its packed
# names included). Anything else (embeddings, lm_head, norms, `modules_to_save`) is
# refused rather than silently ignored.
SERVABLE_TARGET_MODULES = frozenset(
    {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "qkv_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "gate_up_proj",
    }
)

_HEADER_MAX_BYTES = 16 * 1024 * 1024
_LORA_KEY = re.compile(r"layers\.(\d+)\.(?:[\w.]*\.)?(\w+)\.lora_([AB])\.weight$")


class AdapterError(WeightsError):
    """An adapter its base cannot serve (a 400 at deploy: the tenant's input is wrong)."""

    code = "invalid_adapter"


@dataclass(frozen=True)
class AdapterFacts:
    """What a base needs to know of an adapter before loading it."""

    rank: int
    target_modules: frozenset[str]
    # (layer, module) -> (in_features, out_features), from the lora_A / lora_B shapes.
    shapes: dict[tuple[int, str], tuple[int, int]]
    size_bytes: int


def read_adapter(root: Path) -> AdapterFacts:
    """The facts of the adapter saved under `root`; AdapterError naming what is wrong."""
    config = _read_config(root)
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(
            f"{ADAPTER_CONFIG} says peft_type {config.get('peft_type')!r}; only LoRA adapters "
            "are served (save a peft LoraConfig adapter)"
        )
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"{ADAPTER_CONFIG} has no positive integer rank 'r' (got {rank!r})")
    for flag in ("use_dora", "modules_to_save"):
        if config.get(flag):
            raise AdapterError(
                f"{ADAPTER_CONFIG} sets {flag}={config[flag]!r}, which the engine cannot "
                f"serve; train the adapter without {flag}"
            )
    targets = _target_modules(config)
    weights = root / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise AdapterError(
            f"the adapter has no {ADAPTER_WEIGHTS}; save it with peft's save_pretrained "
            "(safetensors, the default; .bin files are not served)"
        )
    shapes = _lora_shapes(weights)
    return AdapterFacts(rank, targets, shapes, weights.stat().st_size)


def check_against_base(
    facts: AdapterFacts, base_config: dict[str, Any] | None, max_lora_rank: int
) -> None:
    """AdapterError unless a base of `base_config` (its config.json; None: unknown, the
    shapes are not checked) with `max_lora_rank` can serve the adapter."""
    if facts.rank > max_lora_rank:
        raise AdapterError(
            f"the adapter's rank is {facts.rank}, above its base's max_lora_rank "
            f"{max_lora_rank}; raise the base's engine.max_lora_rank or train a smaller rank"
        )
    if base_config is None:
        return
    expected = expected_shapes(base_config)
    layers = base_config.get("num_hidden_layers")
    for (layer, module), shape in sorted(facts.shapes.items()):
        if isinstance(layers, int) and layer >= layers:
            raise AdapterError(
                f"the adapter has weights for layer {layer}, but its base has {layers} layers: "
                "it was trained for another model"
            )
        want = expected.get(module)
        if want is not None and shape != want:
            raise AdapterError(
                f"the adapter's {module} is {shape[0]}->{shape[1]}, its base's is "
                f"{want[0]}->{want[1]}: it was trained for another architecture "
                f"({base_config.get('model_type', 'unknown')} base here)"
            )


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each servable projection of a decoder of `config`."""
    hidden = config.get("hidden_size")
    heads = config.get("num_attention_heads")
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1:
        return {}
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    inner = config.get("intermediate_size")
    shapes = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
    if isinstance(inner, int):
        shapes |= {"gate_proj": (hidden, inner), "up_proj": (hidden, inner)}
        shapes["down_proj"] = (inner, hidden)
    return shapes


def check_adapter_layout(root: Path) -> None:
    """The cache's check before it publishes an adapter entry."""
    read_adapter(root)


ADAPTER_LAYOUT = Layout(check_adapter_layout, lambda root: 0)


def ensure_adapter(
    source: str, cache_dir: Path, *, options: CacheOptions | None = None, hold: bool = False
) -> LocalModel:
    """A verified local copy of the adapter at `source` (see `cache.ensure`)."""
    return ensure(source, cache_dir, options=options, hold=hold, layout=ADAPTER_LAYOUT)


def cached_base_config(source: str, cache_dir: Path) -> dict[str, Any] | None:
    """The config.json of the model at `source` once it is in the cache at `cache_dir`,
    else None (nothing to check the adapter's shapes against yet)."""
    try:
        cached = cached_manifest(source, cache_dir)
    except Exception:  # a source the cache does not serve (fake://, a malformed one)
        return None
    if cached is None:
        return None
    manifest, entry_dir = cached
    root = Path(manifest.root) if manifest.root else entry_dir
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _read_config(root: Path) -> dict[str, Any]:
    try:
        config = json.loads((root / ADAPTER_CONFIG).read_text())
    except FileNotFoundError as e:
        raise AdapterError(
            f"the adapter has no {ADAPTER_CONFIG}; point source at the directory peft's "
            "save_pretrained wrote"
        ) from e
    except (OSError, ValueError) as e:
        raise AdapterError(f"{ADAPTER_CONFIG} is unreadable: {e}") from e
    if not isinstance(config, dict):
        raise AdapterError(f"{ADAPTER_CONFIG} is not a JSON object")
    return config


def _target_modules(config: dict[str, Any]) -> frozenset[str]:
    raw = config.get("target_modules")
    if isinstance(raw, str):  # peft allows a regex; only plain names can be checked
        raise AdapterError(
            f"{ADAPTER_CONFIG} gives target_modules as a pattern ({raw!r}); list the module "
            f"names instead, from: {', '.join(sorted(SERVABLE_TARGET_MODULES))}"
        )
    if not isinstance(raw, list) or not raw or not all(isinstance(m, str) for m in raw):
        raise AdapterError(f"{ADAPTER_CONFIG} lists no target_modules")
    unservable = sorted(set(raw) - SERVABLE_TARGET_MODULES)
    if unservable:
        raise AdapterError(
            f"the adapter targets {', '.join(unservable)}, which the engine cannot serve; "
            f"train it on these only: {', '.join(sorted(SERVABLE_TARGET_MODULES))}"
        )
    return frozenset(raw)


def _lora_shapes(weights: Path) -> dict[tuple[int, str], tuple[int, int]]:
    """(layer, module) -> (in, out) from the safetensors header alone."""
    header = _safetensors_header(weights)
    a_in: dict[tuple[int, str], int] = {}
    b_out: dict[tuple[int, str], int] = {}
    for name, entry in header.items():
        match = _LORA_KEY.search(name)
        if match is None or not isinstance(entry, dict):
            continue
        shape = entry.get("shape")
        if not isinstance(shape, list) or len(shape) != 2:
            raise AdapterError(f"{ADAPTER_WEIGHTS}: {name} is not a matrix")
        key = (int(match.group(1)), match.group(2))
        if match.group(3) == "A":
            a_in[key] = int(shape[1])
        else:
            b_out[key] = int(shape[0])
    if not a_in:
        raise AdapterError(f"{ADAPTER_WEIGHTS} holds no lora_A/lora_B weights")
    return {key: (a_in[key], b_out.get(key, 0)) for key in a_in}


def _safetensors_header(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > _HEADER_MAX_BYTES:
                raise AdapterError(f"{ADAPTER_WEIGHTS} has an implausible header")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as e:
        raise AdapterError(f"{ADAPTER_WEIGHTS} is not a safetensors file: {e}") from e
    if not isinstance(header, dict):
        raise AdapterError(f"{ADAPTER_WEIGHTS} has no tensor table")
    return header

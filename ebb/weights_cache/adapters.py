"""LoRA adapters (PEFT's saved layout) in the weight cache, and whether a base can serve one.

An adapter deployment's source is a directory as `peft`'s `save_pretrained` writes it:
`adapter_config.json` and `adapter_model.safetensors`. It is fetched, hashed, verified
and cached like any weights (`ensure_adapter`, the cache's `Layout` for adapters), and
checked against its base before any runner loads it: the checks are pure functions of
the adapter's files and the base's `config.json`, so the frontdoor refuses a bad adapter
at deploy (when it can read both) and a runner fails its request with the same message
otherwise. Every message says what to change.

Nothing here imports torch or peft: the shapes come from the safetensors header.

The files are a tenant's, read as hostile (`_open_regular`): every directory of the
path is opened without following a symbolic link (a link under an allowed prefix could
name anything on the disk), and each file must be a regular file (not a FIFO, which
blocks its reader, nor a device such as /dev/zero), its size bounded before it is read.
Messages name the file and what is wrong, and quote no text from it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

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
_CONFIG_MAX_BYTES = 1024 * 1024  # peft writes about 1 KB
# The widest projection any served decoder has is well below this: a larger dimension in
# a header is not one of a real adapter.
_MAX_DIM = 1 << 20
_LORA_KEY = re.compile(r"layers\.([0-9]{1,6})\.(?:[\w.]*\.)?(\w+)\.lora_([AB])\.weight$", re.ASCII)


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
    dir_fd = _open_dir(root)
    try:
        config = _read_config(dir_fd)
        facts = _facts(config, dir_fd)
    finally:
        os.close(dir_fd)
    return facts


def _facts(config: dict[str, Any], dir_fd: int) -> AdapterFacts:
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(
            f"{ADAPTER_CONFIG} has a peft_type other than LORA; only LoRA adapters are "
            "served (save a peft LoraConfig adapter)"
        )
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= _MAX_DIM:
        raise AdapterError(f"{ADAPTER_CONFIG} has no positive integer rank 'r'")
    for flag in ("use_dora", "modules_to_save"):
        if config.get(flag):
            raise AdapterError(
                f"{ADAPTER_CONFIG} sets {flag}, which the engine cannot serve; train the "
                f"adapter without {flag}"
            )
    targets = _target_modules(config)
    try:
        fd = _open_regular(ADAPTER_WEIGHTS, dir_fd)
    except FileNotFoundError as e:
        raise AdapterError(
            f"the adapter has no {ADAPTER_WEIGHTS}; save it with peft's save_pretrained "
            "(safetensors, the default; .bin files are not served)"
        ) from e
    with os.fdopen(fd, "rb") as f:
        size_bytes = os.fstat(f.fileno()).st_size
        shapes = _lora_shapes(_safetensors_header(f, size_bytes))
    return AdapterFacts(rank, targets, shapes, size_bytes)


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
                f"{want[0]}->{want[1]}: it was trained for another architecture"
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


def _open_dir(root: Path) -> int:
    """A descriptor of the directory `root`, each directory of its path opened without
    following a symbolic link; AdapterError when one is a link or not a directory."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(os.path.abspath(root)).parts[1:]:
            child = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as e:
        os.close(fd)
        if isinstance(e, FileNotFoundError):
            raise AdapterError(
                "the adapter's directory does not exist; point source at the directory "
                "peft's save_pretrained wrote"
            ) from e
        raise AdapterError(
            "the adapter's path is not a directory reached without symbolic links; point "
            "source at the real directory peft's save_pretrained wrote"
        ) from e
    return fd


def _open_regular(name: str, dir_fd: int) -> int:
    """A descriptor of the regular file `name` in `dir_fd`, not through a symbolic link;
    FileNotFoundError when it is absent, AdapterError when it is anything else. Opened
    non-blocking: opening a FIFO would otherwise wait for a writer."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symbolic link
        raise AdapterError(f"the adapter's {name} is not a regular file") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise AdapterError(f"the adapter's {name} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _read_config(dir_fd: int) -> dict[str, Any]:
    try:
        fd = _open_regular(ADAPTER_CONFIG, dir_fd)
    except FileNotFoundError as e:
        raise AdapterError(
            f"the adapter has no {ADAPTER_CONFIG}; point source at the directory peft's "
            "save_pretrained wrote"
        ) from e
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size > _CONFIG_MAX_BYTES:
            raise AdapterError(f"{ADAPTER_CONFIG} is larger than {_CONFIG_MAX_BYTES} bytes")
        raw = f.read(_CONFIG_MAX_BYTES + 1)
    if len(raw) > _CONFIG_MAX_BYTES:
        raise AdapterError(f"{ADAPTER_CONFIG} is larger than {_CONFIG_MAX_BYTES} bytes")
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise AdapterError(f"{ADAPTER_CONFIG} is not valid JSON") from e
    if not isinstance(config, dict):
        raise AdapterError(f"{ADAPTER_CONFIG} is not a JSON object")
    return config


def _target_modules(config: dict[str, Any]) -> frozenset[str]:
    raw = config.get("target_modules")
    servable = ", ".join(sorted(SERVABLE_TARGET_MODULES))
    if isinstance(raw, str):  # peft allows a regex; only plain names can be checked
        raise AdapterError(
            f"{ADAPTER_CONFIG} gives target_modules as a pattern; list the module names "
            f"instead, from: {servable}"
        )
    if not isinstance(raw, list) or not raw or not all(isinstance(m, str) for m in raw):
        raise AdapterError(f"{ADAPTER_CONFIG} lists no target_modules")
    unservable = sorted(set(raw) - SERVABLE_TARGET_MODULES)
    if unservable:
        raise AdapterError(
            f"the adapter targets {len(unservable)} module(s) the engine cannot serve; "
            f"train it on these only: {servable}"
        )
    return frozenset(raw)


def _lora_shapes(header: dict[str, Any]) -> dict[tuple[int, str], tuple[int, int]]:
    """(layer, module) -> (in, out) from the safetensors header alone."""
    a_in: dict[tuple[int, str], int] = {}
    b_out: dict[tuple[int, str], int] = {}
    for name, entry in header.items():
        match = _LORA_KEY.search(name)
        if match is None or not isinstance(entry, dict):
            continue
        rows, cols = _matrix(entry.get("shape"))
        key = (int(match.group(1)), match.group(2))
        if match.group(3) == "A":
            a_in[key] = cols
        else:
            b_out[key] = rows
    if not a_in:
        raise AdapterError(f"{ADAPTER_WEIGHTS} holds no lora_A/lora_B weights")
    return {key: (a_in[key], b_out.get(key, 0)) for key in a_in}


def _matrix(shape: object) -> tuple[int, int]:
    """A LoRA weight's (rows, columns); AdapterError unless two integers 1 to _MAX_DIM."""
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or not all(1 <= d <= _MAX_DIM for d in shape)
    ):
        raise AdapterError(
            f"{ADAPTER_WEIGHTS} has a lora weight whose shape is not a matrix of two "
            f"integers from 1 to {_MAX_DIM}"
        )
    return shape[0], shape[1]


def _safetensors_header(f: BinaryIO, size_bytes: int) -> dict[str, Any]:
    """The JSON header of the open safetensors file `f` of `size_bytes`, bounded."""
    not_safetensors = AdapterError(f"{ADAPTER_WEIGHTS} is not a safetensors file")
    try:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > _HEADER_MAX_BYTES or length > size_bytes - 8:
            raise AdapterError(f"{ADAPTER_WEIGHTS} has an implausible header")
        header = json.loads(f.read(length))
    except (OSError, ValueError, RecursionError, struct.error) as e:
        raise not_safetensors from e
    if not isinstance(header, dict):
        raise AdapterError(f"{ADAPTER_WEIGHTS} has no tensor table")
    return header

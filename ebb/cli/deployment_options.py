"""The options of `ebb deploy` and `ebb scale`, declared once.

Each option names the field of the deployments API it sets, so both commands offer the
same flags (names, help, validation) and send them the same way: a new deployment option
added to `SETTINGS` appears in both. Options left unset stay out of the request body, so
the platform keeps its choice (for a new deployment its default, for a change the current
value).
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import typer

from ebb.billing.pricing import parse_money

# What a command declared with an OptionSet receives: each option's value by its name.
Given = Mapping[str, Any]
# The default of a command's `options` parameter, which OptionSet.command replaces.
NONE_GIVEN: Given = MappingProxyType({})

Section = Literal["", "engine", "serving"]


@dataclass(frozen=True)
class DeploymentOption:
    """One CLI option and the API field it sets.

    `param` is the command's parameter and `kind` its type (as typer reads it); `section`
    "" is a top-level field, "engine" or "serving" one of that object. `read` turns the
    option's value into the field's; a ValueError from it is the user's mistake.
    """

    param: str
    kind: object
    option: Any  # typer.Option(...): typer types it Any
    field: str
    section: Section = ""
    read: Callable[[Any], object] | None = None

    @property
    def flag(self) -> str:
        """The option as the user writes it, e.g. `--chat-template`."""
        decls = self.option.param_decls
        return decls[0].split("/")[0] if decls else "--" + self.param.replace("_", "-")


def _price(param: str, help: str, field: str) -> DeploymentOption:
    """A price option: a decimal amount, sent as integer micros."""
    flag = "--" + param.replace("_", "-")
    return DeploymentOption(
        param,
        str | None,
        typer.Option(None, flag, help=help),
        field,
        read=lambda text: parse_money(text, flag),
    )


# Scaling, queue and admission limits, engine and serving options: what a deployment is
# created with and what `ebb scale` changes.
SETTINGS = (
    DeploymentOption(
        "min_replicas",
        int | None,
        typer.Option(None, "--min", min=0, help="Runners kept even when idle."),
        "min_replicas",
    ),
    DeploymentOption(
        "max_replicas",
        int | None,
        typer.Option(None, "--max", min=1, help="Most runners at once."),
        "max_replicas",
    ),
    DeploymentOption(
        "idle_timeout",
        float | None,
        typer.Option(
            None,
            "--idle-timeout",
            help="Seconds idle before a runner is given back (the keep-alive window).",
        ),
        "idle_timeout_s",
    ),
    DeploymentOption(
        "max_concurrency",
        int | None,
        typer.Option(
            None,
            "--max-concurrency",
            min=1,
            help="Requests one runner batches at once (default 32).",
        ),
        "max_concurrency",
    ),
    DeploymentOption(
        "queue_depth_limit",
        int | None,
        typer.Option(
            None,
            "--queue-depth-limit",
            min=1,
            help="Waiting requests before 503 (platform default).",
        ),
        "queue_depth_limit",
    ),
    DeploymentOption(
        "admission_timeout",
        float | None,
        typer.Option(
            None,
            "--admission-timeout",
            help="Seconds a request may wait for a runner (default 10).",
        ),
        "admission_timeout_s",
    ),
    DeploymentOption(
        "priority",
        str | None,
        typer.Option(
            None, help="critical, standard or sheddable: never shares a GPU with another class."
        ),
        "priority",
    ),
    DeploymentOption(
        "max_model_len",
        int | None,
        typer.Option(None, help="Context length (default: the model's)."),
        "max_model_len",
    ),
    DeploymentOption(
        "dtype",
        str | None,
        typer.Option(None, help="auto, float16, bfloat16 or float32."),
        "dtype",
        "engine",
    ),
    DeploymentOption(
        "quantization",
        str | None,
        typer.Option(None, help="A vLLM method: awq, gptq, fp8, ..."),
        "quantization",
        "engine",
    ),
    DeploymentOption(
        "max_num_seqs",
        int | None,
        typer.Option(None, help="Sequences the engine batches at once."),
        "max_num_seqs",
        "engine",
    ),
    DeploymentOption(
        "tensor_parallel_size",
        int | None,
        typer.Option(None, "--tensor-parallel-size", "--tp", help="GPUs of one host per runner."),
        "tensor_parallel_size",
        "engine",
    ),
    DeploymentOption(
        "prefix_caching",
        bool | None,
        typer.Option(
            None,
            "--prefix-caching/--no-prefix-caching",
            help="vLLM's automatic prefix caching.",
        ),
        "enable_prefix_caching",
        "engine",
    ),
    DeploymentOption(
        "gpu_memory_gib",
        float | None,
        typer.Option(None, help="The runner's GPU memory, instead of the estimate."),
        "gpu_memory_gib",
        "engine",
    ),
    DeploymentOption(
        "enforce_eager",
        bool | None,
        typer.Option(
            None, "--enforce-eager/--cuda-graphs", help="Eager mode, or CUDA graphs (GPUs)."
        ),
        "enforce_eager",
        "engine",
    ),
    DeploymentOption(
        "enable_lora",
        bool | None,
        typer.Option(
            None, "--enable-lora/--no-lora", help="Serve LoRA adapter deployments (--base)."
        ),
        "enable_lora",
        "engine",
    ),
    DeploymentOption(
        "max_loras",
        int | None,
        typer.Option(None, help="LoRA: adapters in one batch."),
        "max_loras",
        "engine",
    ),
    DeploymentOption(
        "max_lora_rank",
        int | None,
        typer.Option(None, help="LoRA: the highest adapter rank served."),
        "max_lora_rank",
        "engine",
    ),
    DeploymentOption(
        "max_cpu_loras",
        int | None,
        typer.Option(None, help="LoRA: adapters kept loaded (LRU)."),
        "max_cpu_loras",
        "engine",
    ),
    DeploymentOption(
        "tool_parser",
        str | None,
        typer.Option(
            None, help="hermes, llama3_json, mistral, none, or '' to pick by the chat template."
        ),
        "tool_parser",
        "serving",
    ),
    DeploymentOption(
        "default_max_tokens",
        int | None,
        typer.Option(
            None, min=1, help="Output tokens of a request that names no max_tokens (2048)."
        ),
        "default_max_tokens",
        "serving",
    ),
    DeploymentOption(
        "max_tokens_limit",
        int | None,
        typer.Option(
            None, min=0, help="Most output tokens a request may ask for (0: the context)."
        ),
        "max_tokens_limit",
        "serving",
    ),
    DeploymentOption(
        "max_request",
        float | None,
        typer.Option(
            None,
            "--max-request-s",
            min=0,
            help="Seconds a request may run before it is stopped (600; 0: no limit).",
        ),
        "max_request_s",
        "serving",
    ),
    DeploymentOption(
        "chat_template",
        str | None,
        typer.Option(None, help="A Jinja chat template instead of the model's."),
        "chat_template",
        "serving",
    ),
    DeploymentOption(
        "chat_template_file",
        Path | None,
        typer.Option(
            None, exists=True, dir_okay=False, help="Read the chat template from this file."
        ),
        "chat_template",
        "serving",
        read=Path.read_text,
    ),
    DeploymentOption(
        "task",
        str | None,
        typer.Option(None, help="generate (chat, completions) or embed (embeddings)."),
        "task",
        "serving",
    ),
    DeploymentOption(
        "scaling",
        str | None,
        typer.Option(
            None,
            help="The scaling block as JSON, e.g. "
            '\'{"policy": "slo", "slo": {"ttft_p90_s": 1}}\' (docs/COLDSTART.md).',
        ),
        "scaling",
        read=lambda text: _json_object(text, "--scaling"),
    ),
)


def _json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{flag} takes a JSON object")
    return value


BatchDiscountOpt = typer.Option(
    None, "--batch-discount", min=0, max=100, help="Batch API token prices: percent off."
)

# Billing and sharing: the admin's, given when deploying (later changes: `ebb price` and
# `ebb deployments share`).
ADMIN = (
    DeploymentOption(
        "batch_discount", int | None, BatchDiscountOpt, "batch_discount_pct", "serving"
    ),
    DeploymentOption(
        "owner",
        str | None,
        typer.Option(None, help="The tenant that owns it and is billed its GPU time."),
        "owner",
    ),
    _price("input_price", "Per 1M input tokens, e.g. 0.15.", "price_per_1m_input_tokens_micros"),
    _price("output_price", "Per 1M output tokens, e.g. 0.60.", "price_per_1m_output_tokens_micros"),
    _price("gpu_second_price", "Per GPU-second (the owner).", "price_per_gpu_second_micros"),
    DeploymentOption(
        "visibility",
        str | None,
        typer.Option(
            None, help="public (every tenant may call it) or private (its owner and --share-with)."
        ),
        "visibility",
    ),
    DeploymentOption(
        "share_with",
        list[str] | None,
        typer.Option(None, "--share-with", help="A tenant that may call it (repeat for several)."),
        "shared_with",
    ),
)


# A LoRA adapter deployment (`ebb deploy NAME --base BASE --source ADAPTER_DIR`).
ADAPTER = (
    DeploymentOption(
        "base",
        str | None,
        typer.Option(
            None, help="A LoRA adapter: the deployment serving it (--source: the adapter's dir)."
        ),
        "base",
    ),
)


class OptionSet:
    """Options a command takes in place of its `options: Given = NONE_GIVEN` parameter,
    and the request body they make."""

    def __init__(self, *options: DeploymentOption) -> None:
        self.options = options

    def command(self, command: Callable[..., None]) -> Callable[..., None]:
        """`command` with these options as parameters (for typer), handed to it as one
        `options` mapping."""
        hints = typing.get_type_hints(command)
        params: list[inspect.Parameter] = []
        for param in inspect.signature(command).parameters.values():
            if param.name != "options":
                params.append(param.replace(annotation=hints[param.name]))
                continue
            params += [
                inspect.Parameter(
                    o.param, param.POSITIONAL_OR_KEYWORD, default=o.option, annotation=o.kind
                )
                for o in self.options
            ]
        names = [o.param for o in self.options]

        @functools.wraps(command)
        def with_options(**values: Any) -> None:
            given = {name: values.pop(name) for name in names}
            command(**values, options=given)

        # typer reads a command's parameters from its signature and type hints.
        with_options.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in params}
        return with_options

    def body(self, given: Given) -> dict[str, Any]:
        """The request body of the options given: top-level fields, `engine` and `serving`
        objects when not empty; usage errors (BadParameter) for a value its option cannot
        read and for two options that set one field."""
        body: dict[str, Any] = {}
        setters: dict[tuple[str, str], DeploymentOption] = {}
        for option in self.options:
            value = given[option.param]
            if value is None or value == []:
                continue
            if (earlier := setters.get((option.section, option.field))) is not None:
                raise typer.BadParameter(f"give {earlier.flag} or {option.flag}, not both")
            setters[(option.section, option.field)] = option
            if option.read is not None:
                try:
                    value = option.read(value)
                except ValueError as e:
                    raise typer.BadParameter(str(e)) from e
            (body.setdefault(option.section, {}) if option.section else body)[option.field] = value
        return body


def price_fields(
    input_price: str | None,
    output_price: str | None,
    gpu_second: str | None,
    options: tuple[str, str, str],
) -> dict[str, int]:
    """Prices as micros (decimal amounts, exact to a micro-unit); `options` name them."""
    prices = {
        "price_per_1m_input_tokens_micros": (input_price, options[0]),
        "price_per_1m_output_tokens_micros": (output_price, options[1]),
        "price_per_gpu_second_micros": (gpu_second, options[2]),
    }
    fields: dict[str, int] = {}
    try:
        for field, (text, option) in prices.items():
            if text is not None:
                fields[field] = parse_money(text, option)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    return fields

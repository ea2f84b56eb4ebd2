"""The options of `ebb deploy` and `ebb scale`: one per field of the deployments API, and
the request body they make (unset options are left out, so the platform keeps its choice)."""

from __future__ import annotations

from pathlib import Path

import typer

from ebb.billing.pricing import parse_money

MinOpt = typer.Option(None, "--min", min=0, help="Runners kept even when idle.")
MaxOpt = typer.Option(None, "--max", min=1, help="Most runners at once.")
IdleOpt = typer.Option(None, "--idle-timeout", help="Seconds idle before a runner drains.")
ConcurrencyOpt = typer.Option(
    None, "--max-concurrency", min=1, help="Requests one runner batches at once (default 32)."
)
QueueDepthOpt = typer.Option(
    None, "--queue-depth-limit", min=1, help="Waiting requests before 503 (platform default)."
)
AdmissionOpt = typer.Option(
    None, "--admission-timeout", help="Seconds a request may wait for a runner (default 10)."
)
MaxModelLenOpt = typer.Option(None, help="Context length (default: the model's).")
OwnerOpt = typer.Option(None, help="The tenant that owns it and is billed its GPU time.")
DtypeOpt = typer.Option(None, help="auto, float16, bfloat16 or float32.")
QuantizationOpt = typer.Option(None, help="A vLLM method: awq, gptq, fp8, ...")
MaxNumSeqsOpt = typer.Option(None, help="Sequences the engine batches at once.")
TpOpt = typer.Option(None, "--tensor-parallel-size", "--tp", help="GPUs of one host per runner.")
PrefixCachingOpt = typer.Option(
    None, "--prefix-caching/--no-prefix-caching", help="vLLM's automatic prefix caching."
)
GpuMemoryOpt = typer.Option(None, help="The runner's GPU memory, instead of the estimate.")
EagerOpt = typer.Option(
    None, "--enforce-eager/--cuda-graphs", help="Eager mode, or CUDA graphs (GPUs)."
)
ToolParserOpt = typer.Option(
    None, help="hermes, llama3_json, mistral, none, or '' to pick by the chat template."
)
ChatTemplateOpt = typer.Option(None, help="A Jinja chat template instead of the model's.")
ChatTemplateFileOpt = typer.Option(
    None, exists=True, dir_okay=False, help="Read the chat template from this file."
)
TaskOpt = typer.Option(None, help="generate (chat, completions) or embed (embeddings).")
BatchDiscountOpt = typer.Option(
    None, "--batch-discount", min=0, max=100, help="Batch API token prices: percent off."
)
InputPriceOpt = typer.Option(None, "--input-price", help="Per 1M input tokens, e.g. 0.15.")
OutputPriceOpt = typer.Option(None, "--output-price", help="Per 1M output tokens, e.g. 0.60.")
GpuSecondPriceOpt = typer.Option(None, "--gpu-second-price", help="Per GPU-second (the owner).")
VisibilityOpt = typer.Option(
    None, help="public (every tenant may call it) or private (its owner and --share-with)."
)
ShareWithOpt = typer.Option(
    None, "--share-with", help="A tenant that may call it (repeat for several)."
)


def engine_body(**options: object) -> dict:
    """`engine` of the body: the options given (names as the API spells them)."""
    return {k: v for k, v in options.items() if v is not None}


def serving_body(
    *,
    tool_parser: str | None,
    chat_template: str | None,
    chat_template_file: Path | None,
    task: str | None,
    batch_discount: int | None,
) -> dict:
    if chat_template is not None and chat_template_file is not None:
        raise typer.BadParameter("give --chat-template or --chat-template-file, not both")
    if chat_template_file is not None:
        chat_template = chat_template_file.read_text()
    serving = {
        "tool_parser": tool_parser,
        "chat_template": chat_template,
        "task": task,
        "batch_discount_pct": batch_discount,
    }
    return {k: v for k, v in serving.items() if v is not None}


def price_fields(
    input_price: str | None, output_price: str | None, gpu_second: str | None, options: tuple
) -> dict:
    """Prices as micros (decimal amounts, exact to a micro-unit); `options` name them."""
    prices = {
        "price_per_1m_input_tokens_micros": (input_price, options[0]),
        "price_per_1m_output_tokens_micros": (output_price, options[1]),
        "price_per_gpu_second_micros": (gpu_second, options[2]),
    }
    fields = {}
    try:
        for field, (text, option) in prices.items():
            if text is not None:
                fields[field] = parse_money(text, option)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    return fields


def deployment_body(fields: dict, *, engine: dict, serving: dict) -> dict:
    """The API body: the fields given, with `engine` and `serving` when not empty."""
    body = {k: v for k, v in fields.items() if v is not None and v != []}
    if engine:
        body["engine"] = engine
    if serving:
        body["serving"] = serving
    return body

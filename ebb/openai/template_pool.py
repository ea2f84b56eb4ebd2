"""Chat template renders in a small pool of processes (`EBB_CHAT_TEMPLATE_PROCESSES`).

Why processes and not threads: a render is pure Python, so in a thread it holds the GIL
against the event loop for as long as it runs. Measured on the dev host (2 shared cores),
a 1 ms sleep's overshoot on the loop while one hostile render burned its 2 s budget: in a
thread, 3-8 ms at the median and 24-42 ms at p99, and the loop got ~110 turns; in a worker
process, 0.14-0.34 ms and 10-25 ms, ~400 turns (idle: 0.15 ms, 6 ms). The hop costs a
pickle of the messages and of the text back, about a millisecond for a long chat.

The worker renders under the same budget (`template_budget`), so a render stops there at
its limits as it would anywhere; a worker that dies (the kernel's OOM killer) breaks the
pool, which is made again for the next render. Short bodies' renders stay on the event
loop up to INLINE_MAX_STEPS and never come here.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ebb.errors import InvalidRequest
from ebb.openai.template_budget import TemplateLimits

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
# (kind, text) or (kind, message, param, code): exceptions with keyword-only fields do not
# survive a pickle, so the worker answers in plain values.
Outcome = tuple[Any, ...]


def render_in_pool(
    source: str,
    special_tokens: dict[str, str],
    messages: list[dict[str, Any]],
    limits: TemplateLimits,
    variables: dict[str, Any],
) -> str:
    """The template's render in a worker process (blocking the calling thread, never the
    event loop: the caller runs off it). Raises InvalidRequest as ChatTemplate.render."""
    pool = _the_pool(limits.processes)
    args = (source, tuple(sorted(special_tokens.items())), messages, limits, variables)
    try:
        outcome: Outcome = pool.submit(_render_here, *args).result()
    except BrokenProcessPool as e:
        _forget(pool)
        raise InvalidRequest(
            "This deployment's chat template exceeded its render budget (its render "
            "process died, e.g. out of memory); simplify the template "
            "(serving.chat_template).",
            param="messages",
            code="chat_template_budget",
        ) from e
    if outcome[0] == "ok":
        return str(outcome[1])
    _, message, param, code = outcome
    raise InvalidRequest(message, param=param, code=code)


def _the_pool(processes: int) -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # spawn: the frontdoor has threads (and a loop) that a fork would copy mid-state.
            context = multiprocessing.get_context("spawn")
            _pool = ProcessPoolExecutor(max_workers=processes, mp_context=context)
        return _pool


def _forget(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _pool_lock:
        if _pool is pool:
            _pool = None
    pool.shutdown(wait=False, cancel_futures=True)


def _render_here(
    source: str,
    special_tokens: tuple[tuple[str, str], ...],
    messages: list[dict[str, Any]],
    limits: TemplateLimits,
    variables: dict[str, Any],
) -> Outcome:
    """In the worker: the render, as plain values."""
    try:
        text = _compiled(source, special_tokens).render_here(messages, limits, **variables)
    except InvalidRequest as e:
        return ("error", e.message, e.param, e.code)
    return ("ok", text)


@functools.lru_cache(maxsize=64)
def _compiled(source: str, special_tokens: tuple[tuple[str, str], ...]) -> Any:
    from ebb.openai.chat_template import compile_template

    return compile_template(source, dict(special_tokens))

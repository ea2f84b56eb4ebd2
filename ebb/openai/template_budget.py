"""What one chat template render may spend: steps, time, and characters built.

A chat template is code, and a deployment's (`serving.chat_template`) or a model's own
(its tokenizer_config.json, from a tenant's weights) is a tenant's code: the sandbox
(`ebb.openai.template_sandbox`) charges every loop iteration, call, filter and string or
list operation of a render to its `RenderBudget` and stops the render with
`TemplateBudgetExceeded` the moment any limit is passed. The budget is what stops the CPU
work: a thread cannot be killed, so the wall-clock limit is checked inside the render
(every step) rather than around it.

The budget of the render in progress is a context variable, set by `rendering` in the
thread that renders (each render is one thread's synchronous call).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

# All the values one render builds together may take this many times its output limit:
# a real template builds each message a few times over (`+` chains, `trim`, `tojson`).
BUILT_PER_OUTPUT = 16
# A list of n items is charged as n * this many characters (its pointers).
LIST_ITEM_CHARS = 8
# Macros calling macros deeper than this are refused (a recursion, not a template).
MAX_MACRO_DEPTH = 64
# The clock is read once per this many steps (a step is well under a microsecond).
_CLOCK_EVERY_STEPS = 64
# A render on the event loop (a short body) may take this many steps; past them it stops
# with RenderNeedsThread and runs again in a worker thread with the full budget. A real
# template on a short chat takes a few hundred.
INLINE_MAX_STEPS = 5_000


@dataclass(frozen=True)
class TemplateLimits:
    """A render's limits (settings `EBB_CHAT_TEMPLATE_*`)."""

    max_steps: int = 1_000_000
    timeout_s: float = 2.0
    max_output_chars: int = 4 * 2**20
    # Worker processes renders run in (`template_pool`); 0: in the calling thread.
    processes: int = 0


class TemplateBudgetExceeded(Exception):
    """The render passed one of its limits; `what` says which, for the caller's 400."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class RenderNeedsThread(TemplateBudgetExceeded):
    """An inline render (on the event loop) ran past INLINE_MAX_STEPS: run it again in a
    worker thread, with the full budget."""


class RenderBudget:
    """One render's remaining allowance; every sandboxed operation charges it."""

    def __init__(self, limits: TemplateLimits, *, inline: bool = False):
        self.limits = limits
        self.inline = inline
        self.steps_left = min(limits.max_steps, INLINE_MAX_STEPS) if inline else limits.max_steps
        self.built_left = limits.max_output_chars * BUILT_PER_OUTPUT
        self.macro_depth = 0
        self._deadline = time.monotonic() + limits.timeout_s
        self._until_clock = _CLOCK_EVERY_STEPS

    def step(self, n: int = 1) -> None:
        self.steps_left -= n
        if self.steps_left < 0:
            if self.inline and self.limits.max_steps > INLINE_MAX_STEPS:
                raise RenderNeedsThread("inline steps")
            raise TemplateBudgetExceeded(f"more than {self.limits.max_steps:,} steps")
        self._until_clock -= n
        if self._until_clock <= 0:
            self._until_clock = _CLOCK_EVERY_STEPS
            if time.monotonic() > self._deadline:
                raise TemplateBudgetExceeded(f"longer than {self.limits.timeout_s:g} s")

    def size(self, chars: int) -> None:
        """Refuse a value of `chars` characters (or list items * LIST_ITEM_CHARS) before it
        is built: one value is at most the output limit, all of them together
        BUILT_PER_OUTPUT times it."""
        limit = self.limits.max_output_chars
        if chars > limit:
            raise TemplateBudgetExceeded(f"a value of {chars:,} characters (at most {limit:,})")
        self.built_left -= chars
        if self.built_left < 0:
            raise TemplateBudgetExceeded(
                f"more than {limit * BUILT_PER_OUTPUT:,} characters built in all"
            )


_CURRENT: ContextVar[RenderBudget | None] = ContextVar("ebb_template_budget", default=None)
# Set by `inline_renders`: renders in this context run under the inline step cap.
_INLINE: ContextVar[bool] = ContextVar("ebb_template_inline", default=False)


def current() -> RenderBudget:
    budget = _CURRENT.get()
    if budget is None:  # a sandboxed template is only ever rendered through `rendering`
        raise RuntimeError("a chat template was rendered outside a render budget")
    return budget


@contextmanager
def rendering(limits: TemplateLimits) -> Iterator[RenderBudget]:
    """The budget of one render, current for the sandbox until it returns."""
    token = _CURRENT.set(RenderBudget(limits, inline=_INLINE.get()))
    try:
        yield current()
    finally:
        _CURRENT.reset(token)


@contextmanager
def inline_renders() -> Iterator[None]:
    """Renders inside this block run on the caller's thread (the event loop) and stop with
    RenderNeedsThread past INLINE_MAX_STEPS, for the caller to run them off the loop."""
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)


def rendering_inline() -> bool:
    """Whether a render now would run inline (inside `inline_renders`)."""
    return _INLINE.get()


def counted(iterable: Iterable[object]) -> Iterator[object]:
    """`iterable`, one step charged per item (every for-loop of a template iterates this)."""
    budget = current()
    for item in iterable:
        budget.step()
        yield item

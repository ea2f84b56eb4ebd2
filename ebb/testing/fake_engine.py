"""A deterministic stand-in for vLLM, for unit and integration tests only.

Serves the deployment sources `fake://NAME?...` (see `ebb.testing.fake_model`) when test
engines are on. Every step emits one byte of a fixed reply per running choice, so tests
can predict text and token counts exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ebb.engine_options import LoraLimits
from ebb.queue.schema import ChoiceDelta, FinishReason, SamplingSpec, TokenLogprob, TopLogprob
from ebb.runners.engine import (
    EngineOptions,
    EngineRequestError,
    EngineStats,
    LoraAdapter,
    StepOutput,
)
from ebb.testing.fake_model import FAKE_JSON_REPLY, FAKE_REPLY, FakeModel


@dataclass
class _Choice:
    index: int
    reply: bytes
    produced: int = 0  # bytes of `reply` out, a continuation's replayed ones included
    done: bool = False
    replayed: int = 0  # of those, the ones a continuation's prompt ended with


@dataclass
class _Request:
    prompt_tokens: int
    sampling: SamplingSpec
    priority: int = 1  # its class's rank: 0 is the most urgent
    arrival: int = 0  # order of arrival, for the waiting queue's ties
    choices: list[_Choice] = field(default_factory=list)
    uncached_tokens: int = 0  # prompt tokens its prefill must compute (not in the cache)

    @property
    def completion_tokens(self) -> int:
        return sum(c.produced - c.replayed for c in self.choices)


def _reply(prompt_token_ids: list[int], sampling: SamplingSpec) -> bytes:
    """What the fake model says: JSON under guided decoding, a tool call when the prompt
    offers tools and no tool result is in yet (in hermes syntax, calling the first
    function listed), else FAKE_REPLY."""
    schema = sampling.json_schema
    if schema is not None and schema.get("type") == "array":  # tool_choice "required"
        name = schema["items"]["anyOf"][0]["properties"]["name"]["enum"][0]
        return json.dumps([{"name": name, "parameters": json.loads(FAKE_JSON_REPLY)}]).encode()
    if sampling.json_object or schema is not None:
        return FAKE_JSON_REPLY.encode()
    prompt = bytes(t for t in prompt_token_ids if t < 256)
    offered = re.search(rb'<tools>\n\{"type": "function", "function": \{"name": "([^"]+)"', prompt)
    if b"<|tool|>" in prompt:
        offered = None  # a tool's result came back: the model answers in words
    if offered is not None:
        call = {"name": offered.group(1).decode(), "arguments": json.loads(FAKE_JSON_REPLY)}
        return f"<tool_call>{json.dumps(call)}</tool_call>".encode()
    return (FAKE_REPLY * 8).encode()


FAKE_EMBEDDING_DIMS = 8


def fake_embedding(prompt_token_ids: list[int], dimensions: int | None) -> list[float]:
    """A unit vector that depends only on the prompt: equal inputs, equal vectors."""
    raw = [float(1 + sum(t * (i + 1) for t in prompt_token_ids) % (97 + i)) for i in range(8)]
    raw = raw[: dimensions or FAKE_EMBEDDING_DIMS]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


# Fake figures: a KV cache of this many tokens, and the prompts remembered as "cached"
# (the prefix cache: the most recent ones, as an LRU of whole prompts).
_FAKE_KV_CACHE_TOKENS = 16384
_FAKE_PREFIXES_KEPT = 64


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Tokens `a` and `b` start with alike. A binary search over slice comparisons (C
    speed), so thousand-token prompts against the whole cache cost microseconds."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def _first_to_hang(name: str) -> bool:
    """True for the first engine on this host to claim the hang of model `name`."""
    home = os.environ.get("EBB_HOME") or tempfile.gettempdir()
    try:
        os.close(os.open(os.path.join(home, f"fake-hang-{name}"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


class FakeEngine:
    """Batches as vLLM's v1 scheduler with `scheduling_policy="priority"` does: at most
    `max_num_seqs` requests run (None: no limit); a step first admits waiting requests
    into the free places, most urgent first (lowest `priority`, then earliest arrival),
    and a waiting request never displaces a running one for its place, whatever their
    classes (vLLM preempts only when the KV cache runs out, which this engine does not
    model). So a critical request added to a full batch waits until one of it ends."""

    def __init__(
        self,
        model: FakeModel,
        *,
        pooling: bool = False,
        lora: LoraLimits | None = None,
        max_num_seqs: int | None = None,
    ):
        self.model = model
        self.max_num_seqs = max_num_seqs
        self._running: set[str] = set()  # ids of the requests in the batch
        self.pooling = pooling
        # LoRA as vLLM models it: adapters loaded on first use, kept LRU (max_cpu_loras).
        self.lora = lora
        self.loaded_adapters: OrderedDict[int, str] = OrderedDict()
        self.adapter_loads = 0
        self._embeddings: dict[str, tuple[int, list[float]]] = {}
        self._requests: dict[str, _Request] = {}
        # Prefix-cache figures as vLLM would count them, against the last few prompts.
        self._recent_prompts: list[tuple[str, list[int]]] = []  # (cache salt, prompt)
        self._prefix_queried_tokens = 0
        self._prefix_hit_tokens = 0
        self.aborted: list[str] = []
        self.sleeping = False
        self._added = 0  # requests seen, for error_pct
        self._hung_elsewhere = False  # hang_once: another engine took the hang
        self._child: subprocess.Popen[bytes] | None = None  # load_child

    @classmethod
    def load(cls, options: EngineOptions) -> FakeEngine:
        """The engine for `options.source` (the registry's engine contract)."""
        model = FakeModel.parse(options.source)
        child = _start_child() if model.load_child else None
        if model.load_s:
            _wait_loading(model.load_s, shielded=model.load_shielded)  # weight loading
        if model.fail:
            raise RuntimeError(f"fake engine {model.name} failed to load (fail=1)")
        engine = cls(
            model,
            pooling=options.task == "embed",
            lora=options.lora,
            max_num_seqs=options.max_num_seqs,
        )
        engine._child = child
        return engine

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingSpec,
        continued: int = 0,
        priority: int = 1,
        lora: LoraAdapter | None = None,
        cache_salt: str = "",
    ) -> None:
        """A continuation (`continued` > 0) answers as the uninterrupted request would
        have: the reply is chosen by the prompt without the replayed tokens, and goes on
        from the byte after them."""
        if sampling.max_tokens < 1:
            raise EngineRequestError("max_tokens must be at least 1")
        self._added += 1
        pct = self.model.error_pct
        if pct and self._added * pct // 100 > (self._added - 1) * pct // 100:
            raise EngineRequestError(f"fake engine {self.model.name} refused it (error_pct={pct})")
        if sampling.embed != self.pooling:
            raise EngineRequestError("this fake engine does not serve that kind of request")
        if sampling.embed:
            if sampling.dimensions is not None and sampling.dimensions > FAKE_EMBEDDING_DIMS:
                raise EngineRequestError(f"dimensions must be at most {FAKE_EMBEDDING_DIMS}")
            vector = fake_embedding(prompt_token_ids, sampling.dimensions)
            self._embeddings[request_id] = (len(prompt_token_ids), vector)
            return
        original = prompt_token_ids[: len(prompt_token_ids) - continued]
        reply = _reply(original, sampling)
        if lora is not None:
            reply = self._with_adapter(lora, reply)
        cached = self._count_prefix_hits(list(prompt_token_ids), cache_salt)
        request = _Request(
            prompt_tokens=len(prompt_token_ids),
            sampling=sampling,
            priority=priority,
            arrival=self._added,
            uncached_tokens=len(prompt_token_ids) - cached,
        )
        request.choices = [
            _Choice(i, reply, continued, replayed=continued) for i in range(sampling.n)
        ]
        self._requests[request_id] = request

    def _with_adapter(self, lora: LoraAdapter, reply: bytes) -> bytes:
        """Load `lora` (LRU) and answer as it would: a plain reply starts with its name,
        so each adapter answers differently, and always alike."""
        if self.lora is None:
            raise EngineRequestError("this engine runs without LoRA; it cannot serve adapters")
        if lora.int_id in self.loaded_adapters:
            self.loaded_adapters.move_to_end(lora.int_id)
        else:
            self.adapter_loads += 1
            self.loaded_adapters[lora.int_id] = lora.name
            while len(self.loaded_adapters) > self.lora.max_cpu_loras:
                self.loaded_adapters.popitem(last=False)
        if reply != (FAKE_REPLY * 8).encode():
            return reply  # guided decoding's JSON, tool calls: the schema decides
        return f"[{lora.name}] ".encode() + reply

    def _count_prefix_hits(self, prompt: list[int], salt: str) -> int:
        """The tokens of `prompt` found in the prefix cache among prompts of the same
        `salt` (counted as vLLM's figures count them); the prompt is then the cache's most
        recent entry."""
        longest = max(
            (common_prefix_len(seen, prompt) for s, seen in self._recent_prompts if s == salt),
            default=0,
        )
        self._prefix_queried_tokens += len(prompt)
        self._prefix_hit_tokens += longest
        kept = self._recent_prompts[-(_FAKE_PREFIXES_KEPT - 1) :]
        self._recent_prompts = [*kept, (salt, prompt)]
        return longest

    def stats(self) -> EngineStats:
        held = sum(r.prompt_tokens + r.completion_tokens for r in self._requests.values())
        return EngineStats(
            kv_cache_usage_ratio=min(1.0, held / _FAKE_KV_CACHE_TOKENS),
            prefix_cache_queried_tokens=self._prefix_queried_tokens,
            prefix_cache_hit_tokens=self._prefix_hit_tokens,
        )

    def abort(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._embeddings.pop(request_id, None)
            self._running.discard(request_id)
            if self._requests.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._requests or self._embeddings)

    def step(self) -> list[StepOutput]:
        if self.sleeping:
            raise RuntimeError("step() on a sleeping engine")
        if self.model.step_ms:
            time.sleep(self.model.step_ms / 1000)  # simulates one forward pass
        self._maybe_hang()
        self._schedule()
        if self.model.step_ms_per_seq:
            # ...which takes longer with more requests in the batch (known once scheduled).
            time.sleep(self.model.step_ms_per_seq * len(self._running) / 1000)
        self._prefill()
        outputs = [self._embedded(rid, *done) for rid, done in self._embeddings.items()]
        self._embeddings.clear()
        for request_id, request in list(self._requests.items()):
            if request_id not in self._running:
                continue  # waits for a place in the batch
            deltas = [self._advance(c, request.sampling) for c in request.choices if not c.done]
            finished = all(c.done for c in request.choices)
            outputs.append(
                StepOutput(
                    request_id=request_id,
                    choices=[d for d in deltas if d is not None],
                    finished=finished,
                    prompt_tokens=request.prompt_tokens,
                    completion_tokens=request.completion_tokens,
                )
            )
            if finished:
                del self._requests[request_id]
                self._running.discard(request_id)
        return outputs

    def _schedule(self) -> None:
        """Admit waiting requests into the batch's free places, most urgent first."""
        waiting = [r for r in self._requests if r not in self._running]
        waiting.sort(key=lambda r: (self._requests[r].priority, self._requests[r].arrival))
        if self.max_num_seqs is not None:
            waiting = waiting[: max(0, self.max_num_seqs - len(self._running))]
        self._running.update(waiting)

    def running_ids(self) -> set[str]:
        """The requests in the batch now (the others wait for a place)."""
        return set(self._running)

    def _maybe_hang(self) -> None:
        """Block this step for an hour once a request reached `hang_after` tokens (see
        FakeModel); the wait releases the GIL, so the runner's heartbeat lives on."""
        hang_after = self.model.hang_after
        if hang_after is None or self._hung_elsewhere:
            return
        if not any(r.completion_tokens >= hang_after for r in self._requests.values()):
            return
        if self.model.hang_once and not _first_to_hang(self.model.name):
            self._hung_elsewhere = True
            return
        threading.Event().wait(3600)

    def _prefill(self) -> None:
        """Simulates the prefill of the requests that have no output yet: a flat
        `prefill_ms`, plus `prefill_ms_per_1k_tokens` for what the prefix cache lacked."""
        new = [
            r for i, r in self._requests.items() if i in self._running and not r.completion_tokens
        ]
        if not new:
            return
        per_token_ms = self.model.prefill_ms_per_1k_tokens / 1000
        pause_ms = self.model.prefill_ms + per_token_ms * sum(r.uncached_tokens for r in new)
        if pause_ms:
            time.sleep(pause_ms / 1000)

    @staticmethod
    def _embedded(request_id: str, prompt_tokens: int, vector: list[float]) -> StepOutput:
        delta = ChoiceDelta(index=0, text="", token_count=0, finish_reason="stop", embedding=vector)
        return StepOutput(request_id, [delta], True, prompt_tokens, 0)

    def _advance(self, choice: _Choice, sampling: SamplingSpec) -> ChoiceDelta | None:
        at = choice.produced % len(choice.reply)
        token = choice.reply[at : at + 1]
        choice.produced += 1
        text_so_far = (choice.reply * 8)[: choice.produced].decode(errors="ignore")
        finish: FinishReason | None = None
        new = choice.produced - choice.replayed  # max_tokens and min_tokens count these
        # As in vLLM, stop conditions other than the length only apply past min_tokens.
        may_stop = new > sampling.min_tokens
        stop_id = bool(token) and token[0] in sampling.stop_token_ids
        if may_stop and (stop_id or any(text_so_far.endswith(s) for s in sampling.stop)):
            finish, token = "stop", b""
        elif choice.produced >= len(choice.reply) and not choice.reply.startswith(b"The"):
            finish = "stop"
        elif new >= sampling.max_tokens:
            finish = "length"
        choice.done = finish is not None
        logprobs = None
        if sampling.logprobs is not None and token:
            text = token.decode(errors="replace")
            top = [TopLogprob(text, -0.5, list(token))] * sampling.logprobs
            logprobs = [TokenLogprob(text, -0.5, list(token), top)]
        return ChoiceDelta(
            index=choice.index,
            text=token.decode(errors="replace"),
            token_count=1,
            logprobs=logprobs,
            finish_reason=finish,
            token_ids=list(token),
        )

    @property
    def supports_sleep(self) -> bool:
        return self.model.sleep

    @property
    def cpu_threads(self) -> int:
        return 0  # sleeps through its steps: nothing to give a core

    def sleep(self) -> None:
        if not self.model.sleep:
            raise RuntimeError("this fake engine was not deployed with sleep=1")
        self.sleeping = True

    def wake_up(self) -> None:
        self.sleeping = False

    def shutdown(self) -> None:
        self._requests.clear()
        self._running.clear()
        if self._child is not None:
            self._child.kill()
            self._child.wait()


def _wait_loading(seconds: float, *, shielded: bool) -> None:
    """Sleep `seconds`; `shielded`: to the end, whatever is raised meanwhile."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            time.sleep(left)
        except BaseException:
            if not shielded:
                raise


def _start_child() -> subprocess.Popen[bytes]:
    """A process the engine starts as it loads, as vLLM's workers: idle until killed."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"], stdin=subprocess.DEVNULL
    )

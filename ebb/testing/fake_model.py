"""The fake test model's source, `fake://NAME?ctx=2048&step_ms=2&step_ms_per_seq=0&load_s=0&
fail=0&sleep=0&prefill_ms=0&prefill_ms_per_1k_tokens=0&gpu_gib=0&error_pct=0&hang_after=N&
hang_once=0&load_shielded=0&load_child=0`,
and its registry entry.
Light on purpose: the frontdoor process reads it (through the
registry) to admit requests, so it imports nothing of `ebb.runners`; the engine itself is
`ebb.testing.fake_engine`.

Tokens are UTF-8 bytes (the frontdoor pairs it with `ByteTokenizer`); the engine emits
one byte of a fixed reply per step, so tests can predict text and token counts exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from ebb.engines import EngineEntry
from ebb.errors import InvalidRequest

FAKE_SCHEME = "fake"
FAKE_REPLY = "The capital of France is Paris. "
FAKE_JSON_REPLY = '{"answer": "Paris"}'
_FORM = (
    "fake://<name>?ctx=2048&step_ms=2&step_ms_per_seq=0&load_s=0&fail=0&sleep=0&prefill_ms=0"
    "&prefill_ms_per_1k_tokens=0&gpu_gib=0&error_pct=0&hang_after=N&hang_once=0"
    "&load_shielded=0&load_child=0"
)


@dataclass(frozen=True)
class FakeModel:
    name: str
    max_model_len: int = 2048
    step_ms: float = 2.0
    # ...plus this per request in the batch: TPOT grows with the batch, as on a real engine.
    step_ms_per_seq: float = 0.0
    load_s: float = 0.0
    fail: bool = False  # the engine raises while loading
    sleep: bool = False  # the engine supports sleep mode, as vLLM does on a GPU
    prefill_ms: float = 0.0  # a step holding a request with no output yet takes this long
    # ...plus this per 1,000 prompt tokens the engine's prefix cache did not hold: a
    # runner that served a prompt's prefix recently prefills it faster, as vLLM's does.
    prefill_ms_per_1k_tokens: float = 0.0
    gpu_gib: float = 0.0  # the GPU memory a runner of it needs (placement's estimate)
    error_pct: int = 0  # this share of requests (spread evenly) fails as the engine refuses it
    # A step that begins with a request holding this many completion tokens never returns
    # (0: its prefill), as a deadlocked engine's; the runner's other threads live on.
    hang_after: int | None = None
    # ...only in the first engine on this host (EBB_HOME) to get there: the runner its
    # requests move to serves them.
    hang_once: bool = False
    # The `load_s` wait runs to its end whatever interrupts it, as a load that swallows a
    # stop (library code catching BaseException) would: it finishes after the stop.
    load_shielded: bool = False
    # The engine starts a child process as it loads (as vLLM's workers), ended by shutdown.
    load_child: bool = False

    @classmethod
    def parse(cls, source: str) -> FakeModel:
        """The model `source` describes; ValueError when it is not a fake source."""
        parts = urlsplit(source)
        if parts.scheme != FAKE_SCHEME:
            raise ValueError(f"not a fake source: {source}")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        return cls(
            name=parts.netloc or parts.path,
            max_model_len=int(query.get("ctx", 2048)),
            step_ms=float(query.get("step_ms", 2.0)),
            step_ms_per_seq=float(query.get("step_ms_per_seq", 0.0)),
            load_s=float(query.get("load_s", 0.0)),
            fail=query.get("fail", "0") == "1",
            sleep=query.get("sleep", "0") == "1",
            prefill_ms=float(query.get("prefill_ms", 0.0)),
            prefill_ms_per_1k_tokens=float(query.get("prefill_ms_per_1k_tokens", 0.0)),
            gpu_gib=float(query.get("gpu_gib", 0.0)),
            error_pct=int(query.get("error_pct", 0)),
            hang_after=int(query["hang_after"]) if "hang_after" in query else None,
            hang_once=query.get("hang_once", "0") == "1",
            load_shielded=query.get("load_shielded", "0") == "1",
            load_child=query.get("load_child", "0") == "1",
        )


def validate(source: str) -> FakeModel:
    """The model `source` describes; InvalidRequest (400) naming the form otherwise."""
    if not source.lower().startswith(FAKE_SCHEME + "://"):
        raise _invalid(f"{source!r}: a fake model source looks like {_FORM}")
    try:
        model = FakeModel.parse(source)
    except ValueError as e:
        raise _invalid(f"{source!r}: {e}; a fake model source looks like {_FORM}") from e
    if not model.name:
        raise _invalid(f"{source!r}: a fake model source looks like {_FORM}")
    return model


def max_model_len(source: str) -> int:
    return FakeModel.parse(source).max_model_len


def gpu_memory_need(source: str) -> int:
    """The bytes of GPU memory one runner of `source` needs (its `gpu_gib`)."""
    return int(FakeModel.parse(source).gpu_gib * 1024**3)


def _invalid(message: str) -> InvalidRequest:
    return InvalidRequest(message, param="source")


FAKE_ENTRY = EngineEntry(
    name="fake",
    schemes=(FAKE_SCHEME,),
    validate="ebb.testing.fake_model:validate",
    engine="ebb.testing.fake_engine:FakeEngine.load",
    prepares_weights=False,
    tokenizer="ebb.openai.tokenizer:ByteTokenizer",
    context_len="ebb.testing.fake_model:max_model_len",
    memory_need="ebb.testing.fake_model:gpu_memory_need",
)

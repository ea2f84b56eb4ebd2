"""Every Redis key name and key-related TTL of the platform, in one place.

Nothing outside `ebb/queue/` spells a key. Lua scripts receive the keys they touch in
KEYS, or a prefix in ARGV for keys they can only name after reading an id (a claim does
not know which requests it will pop).
"""

from __future__ import annotations

PREFIX = "ebb:"

DEPLOYMENTS = PREFIX + "deployments"  # hash: name -> DeploymentSpec (json)
LEASES = PREFIX + "leases"  # zset: request id -> lease expiry (ms, Redis clock)
RUNNERS = PREFIX + "runners"  # set of runner ids, live or not yet reaped
STEMS = PREFIX + "stems"  # set of pre-warmed runner ids waiting for an assignment
WAKE = PREFIX + "wake"  # list: deployment names that want the controller's attention now
API_KEYS = PREFIX + "apikeys"  # hash: sha256(key) -> ApiKeyRecord (json)
USAGE = PREFIX + "usage"  # stream: one UsageRecord per finished request
COLD_STARTS = PREFIX + "coldstarts"  # stream: one ColdStartRecord per runner start (capped)
SCALE_DECISIONS = PREFIX + "scale_decisions"  # hash: "deployment|up" / "|down" -> count

# Cold-start records kept for metrics scrapes; older ones have long been scraped.
COLD_STARTS_MAX = 10_000

REQUEST_PREFIX = PREFIX + "req:"  # hash per request: work, state, deployment, ...
EVENTS_PREFIX = PREFIX + "ev:"  # stream per request: runner -> frontdoor events
RUNNER_CANCELS_PREFIX = PREFIX + "rcancel:"  # set per runner: request ids to abort

# A signal list holds at most this many wake tokens; more would only repeat themselves.
SIGNAL_LIST_MAX = 1024


def queue(deployment: str) -> str:
    """Sorted set of queued request ids, scored by enqueue time (ms)."""
    return f"{PREFIX}q:{deployment}"


def queue_signal(deployment: str) -> str:
    """List an idle runner blocks on; every enqueue pushes one token."""
    return f"{PREFIX}qsig:{deployment}"


def request(request_id: str) -> str:
    return REQUEST_PREFIX + request_id


def events(request_id: str) -> str:
    return EVENTS_PREFIX + request_id


def runner(runner_id: str) -> str:
    return f"{PREFIX}runner:{runner_id}"


def runner_cancels(runner_id: str) -> str:
    return RUNNER_CANCELS_PREFIX + runner_id


def runner_assignment(runner_id: str) -> str:
    """List a pre-warmed runner blocks on until the controller assigns it a deployment."""
    return f"{PREFIX}rassign:{runner_id}"


def sleepers(deployment: str) -> str:
    """Set of a deployment's runners whose engines sleep, ready to be woken."""
    return f"{PREFIX}sleepers:{deployment}"


def runner_log(runner_id: str) -> str:
    """Capped list of a runner's last log lines, shown when it fails."""
    return f"{PREFIX}rlog:{runner_id}"


def coldstart(deployment: str) -> str:
    """Hash of moving averages of observed cold-start phases (ms), per tier."""
    return f"{PREFIX}coldstart:{deployment}"


def deployment_status(deployment: str) -> str:
    """Hash: weights state, failure counts, last error of a deployment."""
    return f"{PREFIX}dstatus:{deployment}"

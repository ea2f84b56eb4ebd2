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
FORK_SERVER = PREFIX + "fork_server"  # string: the controller's fork server state
CONTROLLER_LEADER = PREFIX + "controller:leader"  # string: holder id, expires (PX) unless renewed
CONTROLLER_TERM = PREFIX + "controller:term"  # counter: one more per leadership acquired
# hash: "metric|label|label" -> running total, counted by any process, read by /metrics
METRIC_COUNTERS = PREFIX + "metrics:counters"
GPU_INVENTORY = PREFIX + "gpus"  # hash: host -> HostInventory (json), refreshed by the controller
GPU_PLACEMENTS = PREFIX + "placements"  # hash: runner id -> GpuPlacement (json) it holds
# zset: process id ("host:pid") -> when it last reported its memory (ms); each report is
# its own key (process_memory) that expires unless renewed, so a dead process drops out.
PROCESSES = PREFIX + "processes"
PROCESS_MEMORY_TTL_S = 30
# hash: node -> NodeCache (json): the sources its weight cache holds, from its prefetcher
NODE_CACHES = PREFIX + "node_caches"
TENANT_QUOTAS = PREFIX + "tenant_quotas"  # hash: tenant -> TenantQuota (json), set by the admin
# hash: deployment name -> its uid (DeploymentSpec.uid), written and removed with the
# deployment's record: what a claim compares a runner's uid with, without decoding a spec
DEPLOYMENT_UIDS = PREFIX + "deployment_uids"

# Cold-start records kept for metrics scrapes; older ones have long been scraped.
COLD_STARTS_MAX = 10_000

REQUEST_PREFIX = PREFIX + "req:"  # hash per request: work, state, deployment, ...
EVENTS_PREFIX = PREFIX + "ev:"  # stream per request: runner -> frontdoor events
RUNNER_CANCELS_PREFIX = PREFIX + "rcancel:"  # set per runner: request ids to abort

# A signal list holds at most this many wake tokens; more would only repeat themselves.
SIGNAL_LIST_MAX = 1024


QUEUE_PREFIX = PREFIX + "q:"
QUEUE_SIGNAL_PREFIX = PREFIX + "qsig:"


def queue(deployment: str) -> str:
    """Sorted set of queued request ids, scored by enqueue time (ms) plus their priority
    class's offset (ebb.queue.priority)."""
    return QUEUE_PREFIX + deployment


def queue_signal(deployment: str) -> str:
    """List an idle runner blocks on; every enqueue pushes one token. Also the channel
    on which those scripts publish, for busy runners (see work_news.py)."""
    return QUEUE_SIGNAL_PREFIX + deployment


def claiming(deployment: str) -> str:
    """String, expiring after CLAIMING_TTL_MS: set by each claim that leaves a runner of
    `deployment` room for more, deleted when one drains, sleeps or stops. While it is set,
    a request queued for the deployment is a claiming runner's to take, and enqueue.lua
    does not wake the controller for it."""
    return f"{PREFIX}claiming:{deployment}"


# A runner with room claims between engine steps, and an idle one at least every half
# second: two seconds of silence mean no runner is claiming, or one is inside a long step
# (a prefill of thousands of tokens on a CPU), when a wake-up costs nothing but a reconcile.
CLAIMING_TTL_MS = 2000


def request(request_id: str) -> str:
    return REQUEST_PREFIX + request_id


def events(request_id: str) -> str:
    return EVENTS_PREFIX + request_id


RUNNER_PREFIX = PREFIX + "runner:"  # hash per runner: its RunnerRecord


def runner(runner_id: str) -> str:
    return RUNNER_PREFIX + runner_id


# A field of the runner hash, outside its RunnerRecord: the controller asked it to drain.
RUNNER_DRAIN_REQUESTED = "drain_requested"


RUNNER_SIGNAL_PREFIX = PREFIX + "rsig:"


def runner_signal(runner_id: str) -> str:
    """List a runner blocks on beside its queue's signal: a claim that left a request for
    this runner (its prompt prefix) wakes it here. At most one token. Also the channel
    that claim publishes on, for the runner when busy (see work_news.py)."""
    return RUNNER_SIGNAL_PREFIX + runner_id


def prefix_owners(deployment: str) -> str:
    """Hash: prompt-prefix key -> "runner id|claimed ms" of the runner that last claimed a
    request with that prefix (prefix-aware claiming); capped, and gone when unused."""
    return f"{PREFIX}prefix:{deployment}"


def claimers(deployment: str) -> str:
    """Sorted set: runner id -> when it last claimed (ms, Redis clock), for least-loaded
    claiming; entries older than a lease are dropped by the next claim (see claim.lua)."""
    return f"{PREFIX}claimers:{deployment}"


# Prefix owners: dropped this long after the last claim of a deployment, and reset when a
# deployment's hash reaches this many prefixes (a bound, not an eviction policy).
PREFIX_OWNERS_TTL_S = 120
PREFIX_OWNERS_MAX = 4096
# Queued requests a claim may look at beyond the number it wants (passed over, stale).
CLAIM_SCAN_EXTRA = 64


def runner_cancels(runner_id: str) -> str:
    """Set of request ids the runner is asked to abort (taken by its next claim). Also
    the channel on which the scripts that add one publish (see work_news.py)."""
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


def runner_stats(runner_id: str) -> str:
    """String: the runner's latest engine figures (RunnerStats json), expiring unless renewed."""
    return f"{PREFIX}rstats:{runner_id}"


# Runner stats outlive a few missed reports, not a dead runner.
RUNNER_STATS_TTL_S = 10


def coldstart(deployment: str) -> str:
    """Hash of moving averages of observed cold-start phases (ms), per tier."""
    return f"{PREFIX}coldstart:{deployment}"


def deployment_status(deployment: str) -> str:
    """Hash: weights state, failure counts, last error of a deployment."""
    return f"{PREFIX}dstatus:{deployment}"


# --- billing: ledger, aggregates, export, rate limits, GPU metering ----------------------

GPU_USAGE = PREFIX + "gpu_usage"  # stream: GPU-time segments of runners + hour-close markers
LEDGER_STATE = PREFIX + "ledger:state"  # hash: consumer cursors per stream, closed_through_ms
LEDGER_HOURS = PREFIX + "ledger:hours"  # zset: hour start ms of every hour with aggregates
LEDGER_PENDING = PREFIX + "ledger:pending"  # zset: closed hours whose file is not exported yet
LEDGER_EXPORTED = PREFIX + "ledger:exported"  # hash: hour start ms -> sha256 of its file
LEDGER_AGG_PREFIX = PREFIX + "ledger:agg:"  # hash per hour: "tenant|deployment|metric" -> int
LEDGER_LINES_PREFIX = PREFIX + "ledger:lines:"  # list per hour: booked entries (json), to export
LEDGER_SEEN_PREFIX = PREFIX + "ledger:seen:"  # hash per UTC day: request id -> 1 (billed once)
RATE_LIMITS = PREFIX + "ratelimits"  # hash: "key:ID:rpm" / "tenant:T:tpm" ... -> int
RATE_BUCKET_PREFIX = PREFIX + "rl:"  # hash per subject: token-bucket levels and times
PRIORITIES = PREFIX + "priorities"  # hash: "key:ID" / "tenant:T" -> priority class

# A rate-limit bucket left alone this long has refilled completely: let it expire.
RATE_BUCKET_TTL_S = 120
# Request ids are remembered this long for the billed-once check (two UTC days are read).
LEDGER_SEEN_TTL_S = 3 * 86400


def ledger_aggregates(hour_ms: int) -> str:
    return f"{LEDGER_AGG_PREFIX}{hour_ms}"


def ledger_lines(hour_ms: int) -> str:
    return f"{LEDGER_LINES_PREFIX}{hour_ms}"


def rate_bucket(subject: str) -> str:
    """Token buckets of one rate-limited subject, "key:ID" or "tenant:NAME"."""
    return RATE_BUCKET_PREFIX + subject


# --- spend caps (budgets) -----------------------------------------------------------------

BUDGETS = PREFIX + "budgets"  # hash: "key:ID" / "tenant:T" -> Budget (json), set by the admin
# hash: tenant -> the URL its tenant-level events (budget.soft_limit_reached) are sent to
TENANT_WEBHOOKS = PREFIX + "tenant_webhooks"
BUDGET_SPEND_PREFIX = PREFIX + "spend:"  # hash per subject and period: committed, spent, soft

# A period's spend outlives the period long enough for a request admitted at its very end
# to settle into it (and to be read back); a lifetime budget's spend never expires.
BUDGET_SPEND_TTL_S = {"day": 3 * 86400, "month": 63 * 86400}


def budget_spend(subject: str, period_label: str) -> str:
    """What a subject ("key:ID" / "tenant:T") spent and holds reserved in one period
    (`period_label`: "d20261206", "m202612" or "life", see budget_periods)."""
    return f"{BUDGET_SPEND_PREFIX}{subject}:{period_label}"


# Every synchronous request's reservation until it is settled, so that the controller's
# reaper can settle or release one whose frontdoor died (ebb.queue.budget_holds).
BUDGET_HOLDS = PREFIX + "budget_holds"  # hash: request id -> BudgetHoldRecord (json)
BUDGET_HOLDS_AT = PREFIX + "budget_holds_at"  # zset: request id -> when reserved (ms)
# Bumped whenever a budget is set or removed: frontdoors skip the reserve script for
# subjects known to have no budget only while it is unchanged (ebb.frontdoor.budget_presence).
BUDGETS_VERSION = PREFIX + "budgets_version"
FRONTDOOR_ALIVE_PREFIX = PREFIX + "frontdoor_alive:"  # string per frontdoor process, expiring
FRONTDOOR_ALIVE_TTL_S = 10  # renewed every third of it; gone this long after a SIGKILL


def frontdoor_alive(instance: str) -> str:
    """Present while the frontdoor process `instance` heartbeats."""
    return FRONTDOOR_ALIVE_PREFIX + instance


# --- async jobs and webhook deliveries ----------------------------------------------------

JOB_PREFIX = PREFIX + "job:"  # hash per job: JobRecord fields (see job_store)
JOBS_WAITING = PREFIX + "jobs:waiting"  # zset: job id -> TTL deadline (ms) while queued
# zset: job id -> park time (ms), jobs accepted before their request could be tokenized
# (weights being prepared); the frontdoor queues them once it can.
JOBS_PARKED = PREFIX + "jobs:parked"
JOBS_WATCH = PREFIX + "jobs:watch"  # set: job ids the collector must look at (claimed, settled)
JOBS_SIGNAL = PREFIX + "jobs:signal"  # list: a token per job attempt claimed or ended
DELIVERIES_DUE = PREFIX + "wh:due"  # zset: webhook id -> next attempt (ms) or in-flight lease
DELIVERIES_SIGNAL = PREFIX + "wh:signal"  # list: a token per new delivery wakes the workers
DELIVERY_PREFIX = PREFIX + "whd:"  # hash per delivery (one event of one job)
JOB_QUEUE_PREFIX = PREFIX + "jq:"

# Finished job attempts keep their request record and event stream until the collector has
# turned them into a job result; a week covers any worker outage worth surviving.
JOB_ATTEMPT_TTL_S = 7 * 86400


def job_queue(deployment: str) -> str:
    """Sorted set of queued job attempts (request ids), scored by enqueue time (ms) plus
    their priority class's offset (ebb.queue.priority), as the synchronous queue is.

    Separate from the synchronous queue so that a runner takes jobs only when no
    synchronous request waits (see claim.lua)."""
    return JOB_QUEUE_PREFIX + deployment


def job(job_id: str) -> str:
    return JOB_PREFIX + job_id


def job_deliveries(job_id: str) -> str:
    """List of the webhook ids of a job's deliveries, in creation order."""
    return f"{PREFIX}jobwh:{job_id}"


def tenant_jobs(tenant: str) -> str:
    """Sorted set of a tenant's job ids, all scored 0: ids sort by creation time (lex)."""
    return f"{PREFIX}jobs:tenant:{tenant}"


def job_idempotency(tenant: str, key_digest: str) -> str:
    """String: 'job id|body digest' for a tenant's Idempotency-Key."""
    return f"{PREFIX}jobidem:{tenant}:{key_digest}"


def delivery(webhook_id: str) -> str:
    return DELIVERY_PREFIX + webhook_id


def delivery_attempts(webhook_id: str) -> str:
    """List of a delivery's attempt records (json), oldest first."""
    return f"{PREFIX}wha:{webhook_id}"


def webhook_secret(tenant: str) -> str:
    """Hash: a tenant's current signing secret and the previous one during an overlap."""
    return f"{PREFIX}whsec:{tenant}"


# --- the Batch API ----------------------------------------------------------------------

BATCH_PREFIX = PREFIX + "batch:"  # string per batch: BatchRecord (json)
BATCHES_ACTIVE = PREFIX + "batches:active"  # set: batch ids not settled yet


def batch_announced(batch_id: str) -> str:
    """String set once a settled batch's webhook delivery exists (never twice)."""
    return f"{PREFIX}batchwh:{batch_id}"


def batch(batch_id: str) -> str:
    return BATCH_PREFIX + batch_id


def tenant_batches(tenant: str) -> str:
    """Sorted set of a tenant's batch ids, all scored 0: ids sort by creation time (lex)."""
    return f"{PREFIX}batches:tenant:{tenant}"


# --- the Files API ----------------------------------------------------------------------

# zset: "<file id> <tenant>" scored by the second the file expires (the retention sweep's)
FILES_EXPIRY = PREFIX + "files:expiry"


def tenant_files(tenant: str) -> str:
    """Hash of a tenant's stored files: file id -> its size in bytes (the count cap's)."""
    return f"{PREFIX}files:tenant:{tenant}"


def tenant_file_bytes(tenant: str) -> str:
    """String: the bytes a tenant's stored files hold together (the bytes cap's)."""
    return f"{PREFIX}files:bytes:{tenant}"


def batch_worker(batch_id: str) -> str:
    """String, expiring: the frontdoor queueing a validating batch's lines now (its lease)."""
    return f"{PREFIX}batchwork:{batch_id}"


def process_memory(process_id: str) -> str:
    """string: one platform process's last ProcessMemory report (json), expiring."""
    return f"{PREFIX}procmem:{process_id}"


# --- deployment versions and traffic splits -----------------------------------------------


def deployment_versions(deployment: str) -> str:
    """Hash: version number -> VersionRecord (json) of a deployment's immutable versions."""
    return f"{PREFIX}dversions:{deployment}"


def traffic(deployment: str) -> str:
    """String: the deployment's TrafficSplit (json): weights per version and its rollout."""
    return f"{PREFIX}traffic:{deployment}"


# --- the Responses API --------------------------------------------------------------------


def stored_response(tenant: str, response_id: str) -> str:
    """String: a StoredResponse (json), expiring after EBB_RESPONSES_RETENTION_S. Under its
    tenant's name, so no other tenant's lookup can reach it."""
    return f"{PREFIX}resp:{tenant}:{response_id}"


def tenant_responses(tenant: str) -> str:
    """Sorted set: a tenant's stored responses (and the room held for ones not stored
    yet), scored by when each expires (s): what EBB_RESPONSES_MAX_PER_TENANT counts."""
    return f"{PREFIX}respidx:{tenant}"


def tenant_response_bytes(tenant: str) -> str:
    """Hash: the size of each of a tenant's stored responses (bytes) and, under `_total`,
    their sum: what EBB_RESPONSES_MAX_TENANT_BYTES bounds."""
    return f"{PREFIX}respbytes:{tenant}"


# --- resumable streams --------------------------------------------------------------------


def stream_view(tenant: str, request_id: str) -> str:
    """String: the StreamView (json) a frontdoor renders a streamed request's events with,
    so that any frontdoor can replay them to a client resuming it. Under its tenant's
    name, so no other tenant's lookup can reach it; it expires with the request's record."""
    return f"{PREFIX}sview:{tenant}:{request_id}"

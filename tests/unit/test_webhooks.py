"""Webhook signatures, retry schedule, SSRF checks, job views and job record encoding."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json

import pytest
from standardwebhooks import Webhook

from ebb.queue.job_schema import (
    JobErrorInfo,
    JobEvent,
    JobRecord,
    JobStatus,
    decode_job,
    encode_job,
)
from ebb.queue.schema import SamplingSpec, WorkItem
from ebb.queue.webhook_secrets import SecretSet
from ebb.webhooks.retry import RetryPolicy
from ebb.webhooks.signing import new_secret, sign, webhook_headers
from ebb.webhooks.ssrf import Target, UnsafeUrl, parse_url, refusal, resolve_target
from ebb.webhooks.views import current_status, event_body, job_view

# --- signatures ------------------------------------------------------------------------


def test_secrets_are_whsec_with_24_random_bytes():
    secret = new_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 24
    assert new_secret() != secret


def test_signature_matches_the_reference_library():
    secret, body = new_secret(), b'{"type": "job.succeeded"}'
    ours = sign(secret, "msg_1", 1_700_000_000, body)
    theirs = Webhook(secret).sign("msg_1", dt.datetime.fromtimestamp(1_700_000_000), body.decode())
    assert ours == theirs


def test_headers_verify_with_every_secret_in_the_overlap():
    old, new = new_secret(), new_secret()
    body = json.dumps({"type": "job.started"}).encode()
    now_s = int(dt.datetime.now(tz=dt.UTC).timestamp())
    headers = webhook_headers([new, old], "msg_2", now_s, body)
    assert headers["webhook-id"] == "msg_2" and headers["webhook-timestamp"] == str(now_s)
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers) == {"type": "job.started"}
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(new_secret()).verify(body, headers)


def test_previous_secret_signs_only_during_its_overlap():
    secrets = SecretSet(current="whsec_b", previous="whsec_a", previous_until_ms=1000)
    assert secrets.signing_secrets(now_ms=999) == ["whsec_b", "whsec_a"]
    assert secrets.signing_secrets(now_ms=1000) == ["whsec_b"]
    assert SecretSet(current="whsec_b").signing_secrets(now_ms=0) == ["whsec_b"]


# --- retries ---------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_and_is_capped():
    policy = RetryPolicy(base_s=5, max_delay_s=3600, give_up_s=86400)
    assert [policy.delay_s(n, rand=lambda: 1.0) for n in (1, 2, 3)] == [5, 10, 20]
    assert [policy.delay_s(n, rand=lambda: 0.0) for n in (1, 2, 3)] == [2.5, 5, 10]
    assert policy.delay_s(30, rand=lambda: 1.0) == 3600


def test_retries_last_a_day_then_give_up():
    policy = RetryPolicy(base_s=5, max_delay_s=3600, give_up_s=86400)
    now_ms, attempts = 0, 1
    while (
        nxt := policy.next_attempt_ms(
            failed_attempts=attempts, created_ms=0, now_ms=now_ms, rand=lambda: 0.5
        )
    ) is not None:
        now_ms, attempts = nxt, attempts + 1
    assert 20 * 3600_000 < now_ms <= 86400_000, "the last attempt is late on the first day"
    assert 30 <= attempts <= 50


# --- SSRF ------------------------------------------------------------------------------

LOCAL = [ipaddress.ip_network("127.0.0.0/8")]


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.0.1", "a private address"),
        ("100.64.0.1", "a private address"),
        ("127.0.0.1", "a loopback address"),
        ("::1", "a loopback address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("fc00::1", "a private address"),
        ("0.0.0.0", "a private address"),
        ("224.0.0.1", "a reserved address"),
        ("::ffff:10.0.0.1", "a private address"),
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
    ],
)
def test_only_public_addresses_may_be_called(address, why):
    assert refusal(ipaddress.ip_address(address), []) == why


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("2002:7f00:1::", "a loopback address (127.0.0.1, embedded"),  # 6to4
        ("2002:a00:1::1", "a private address (10.0.0.1, embedded"),
        ("64:ff9b::7f00:1", "a loopback address (127.0.0.1, embedded"),  # NAT64
        ("64:ff9b::a9fe:a9fe", "a link-local address (169.254.169.254, embedded"),
        ("64:ff9b:1::a00:1", "a local-use NAT64 address"),
        # Teredo: server 65.54.227.120, client (obfuscated) 127.0.0.1
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "a loopback address (127.0.0.1, embedded"),
        ("::127.0.0.1", "a loopback address (127.0.0.1, embedded"),  # IPv4-compatible
        ("::ffff:127.0.0.1", "a loopback address"),
    ],
)
def test_ipv6_forms_embedding_a_non_public_ipv4_are_refused(address, why):
    assert (refusal(ipaddress.ip_address(address), []) or "").startswith(why)


def test_6to4_of_a_public_address_is_public():
    assert refusal(ipaddress.ip_address("2002:808:808::1"), []) is None


async def test_embedded_loopback_url_is_refused_at_submission():
    with pytest.raises(UnsafeUrl, match="127.0.0.1, embedded"):
        await resolve_target("http://[2002:7f00:1::]/hook", [])


def test_allowed_networks_open_exactly_themselves():
    assert refusal(ipaddress.ip_address("127.0.0.1"), LOCAL) is None
    assert refusal(ipaddress.ip_address("::ffff:127.0.0.1"), LOCAL) is None
    assert refusal(ipaddress.ip_address("::1"), LOCAL) == "a loopback address"
    assert refusal(ipaddress.ip_address("10.0.0.1"), LOCAL) == "a private address"


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "example.com/hook", "http:///path", "http://h:99999/"]
)
def test_only_http_urls_are_accepted(url):
    with pytest.raises(UnsafeUrl, match="webhook.url"):
        parse_url(url)


async def test_literal_urls_are_checked_without_dns():
    with pytest.raises(UnsafeUrl, match="10.0.0.9, a private address"):
        await resolve_target("http://10.0.0.9/h", [])
    target = await resolve_target("http://127.0.0.1:8080/h?x=1", LOCAL)
    assert target.pinned_url() == "http://127.0.0.1:8080/h?x=1"
    assert target.endpoint == "http://127.0.0.1:8080"


def test_pinned_url_keeps_the_host_for_the_header_and_sni():
    target = Target(
        url="https://hooks.example.com/in?a=b",
        scheme="https",
        host="hooks.example.com",
        port=443,
        address=ipaddress.ip_address("2606:4700::1111"),
    )
    assert target.pinned_url() == "https://[2606:4700::1111]:443/in?a=b"
    assert target.host_header == "hooks.example.com"
    other = Target("http://u:p@h.example:8080/", "http", "h.example", 8080, target.address)
    assert other.host_header == "h.example:8080"
    assert other.pinned_url() == "http://u:p@[2606:4700::1111]:8080/", "credentials kept"


# --- job views and records -------------------------------------------------------------


def record(**changes) -> JobRecord:
    work = WorkItem(
        request_id="job_1.1",
        deployment="m",
        prompt_token_ids=[1],
        sampling=SamplingSpec(max_tokens=4),
        job_id="job_1",
    )
    base = JobRecord(
        job_id="job_1",
        tenant="acme",
        deployment="m",
        endpoint="chat.completions",
        work=work,
        request_id="job_1.1",
        created_ms=1_000,
        started_ms=3_000,
        finished_ms=7_500,
        webhook_url="https://example.com/h",
        webhook_events=[JobEvent.SUCCEEDED],
    )
    for name, value in changes.items():
        setattr(base, name, value)
    return base


@pytest.mark.parametrize(
    ("status", "attempt", "shown"),
    [
        (JobStatus.QUEUED, "queued", JobStatus.QUEUED),
        (JobStatus.QUEUED, "claimed", JobStatus.RUNNING),
        (JobStatus.RUNNING, "finished", JobStatus.RUNNING),
        (JobStatus.QUEUED, "failed", JobStatus.RUNNING),
        (JobStatus.SUCCEEDED, None, JobStatus.SUCCEEDED),
        (JobStatus.CANCELLED, "cancelled", JobStatus.CANCELLED),
    ],
)
def test_status_reads_through_to_the_attempt(status, attempt, shown):
    assert current_status(record(status=status), attempt) is shown


def test_view_has_timings_and_the_started_event_predates_the_end():
    done = record(
        status=JobStatus.SUCCEEDED,
        result={"id": "job_1"},
        usage={"total_tokens": 3},
        error=None,
    )
    view = job_view(done)
    assert view["timings"] == {"queued_s": 2.0, "run_s": 4.5, "total_s": 6.5}
    assert view["webhook"] == {"url": "https://example.com/h", "events": ["job.succeeded"]}
    assert "deliveries" not in view
    started = json.loads(event_body(JobEvent.STARTED, done))
    assert started["type"] == "job.started" and started["timestamp"].endswith("Z")
    assert started["data"]["status"] == "running" and started["data"]["result"] is None
    ended = json.loads(event_body(JobEvent.SUCCEEDED, done))
    assert ended["data"] == view
    assert ended["timestamp"] == "1970-01-01T00:00:07.500000Z"


def test_an_expired_job_is_announced_as_failed():
    assert JobEvent.ending(JobStatus.EXPIRED) is JobEvent.FAILED
    assert JobEvent.ending(JobStatus.CANCELLED) is JobEvent.CANCELLED


def test_job_records_survive_their_hash_encoding():
    original = record(
        metadata={"k": "v"},
        cancel_requested=True,
        error=JobErrorInfo("x", "y"),
        result={"choices": []},
    )
    raw = {k.encode(): v.encode() for k, v in encode_job(original).items()}
    raw[b"ann:job.started"] = b"msg_1"
    decoded = decode_job(raw)
    assert decoded.announced == [JobEvent.STARTED]
    decoded.announced = []
    assert decoded == original

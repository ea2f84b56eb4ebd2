"""infra/observability against a real Prometheus (Debian's `prometheus`, on a loopback
port with its own data directory): it scrapes a live platform (fake engine) under a
little traffic, loads the alert rules, and every dashboard query returns data; promtool
checks the rules and runs their unit tests."""

from __future__ import annotations

import json
import math
import subprocess

import httpx
import pytest
import yaml
from support import REPO_ROOT, Platform, deploy, free_port, temp_home, wait_until
from support.billing import new_key, tenant_client

pytestmark = pytest.mark.integration

INFRA = REPO_ROOT / "infra" / "observability"
DASHBOARD = INFRA / "grafana" / "dashboards" / "ebb-serving.json"
RULES = INFRA / "prometheus" / "alerts.yml"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
METRICS_TOKEN = "ebb-metrics-test-token"
# Panels whose series exist only where runners see GPUs (NVML); none on this machine.
GPU_ONLY_METRICS = ("ebb_gpu_utilization_ratio", "ebb_gpu_memory_used_bytes", "ebb_gpu_temperature")


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = INFRA / "prometheus" / "alerts_test.yml"
    run = subprocess.run(
        ["promtool", "test", "rules", tests.name], cwd=tests.parent, capture_output=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # --syntax-only: the token file the config names exists only where Prometheus runs.
    config = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(INFRA / "prometheus/prometheus.yml")],
        capture_output=True,
    )
    assert config.returncode == 0, config.stdout + config.stderr


def test_grafana_provisioning_points_at_the_dashboard_and_its_datasource():
    dashboards = yaml.safe_load((INFRA / "grafana/provisioning/dashboards/ebb.yml").read_text())
    assert dashboards["providers"][0]["type"] == "file"
    sources = yaml.safe_load(
        (INFRA / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    uid = sources["datasources"][0]["uid"]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert {p["datasource"]["uid"] for p in panels} == {uid}
    titles = " ".join(p["title"] for p in panels).lower()
    needed = ["traffic", "rejection", "first token", "queue", "replicas", "cold start"]
    needed += ["tokens/s", "gpu-seconds", "cost per 1m", "kv-cache", "prefix", "gpu util"]
    for panel in needed:
        assert panel in titles, panel


@pytest.fixture(scope="module")
def platform():
    env = {
        "EBB_GPU_METER_INTERVAL_S": "1",
        "EBB_GPU_SECOND_COST_MICROS": "250",
        "EBB_WEBHOOK_ALLOWED_CIDRS": "127.0.0.0/8",
        "EBB_METRICS_TOKEN": METRICS_TOKEN,
    }
    p = Platform(home=temp_home("ebb-prom-"), redis_url=None, env_extra=env).start()
    yield p
    assert p.stop() == 0


class Prometheus:
    """A real Prometheus scraping the platform every second, with the alert rules."""

    def __init__(self, target_port: int):
        self.dir = temp_home("ebb-prometheus-")
        self.port = free_port()
        config = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(RULES)]
        job = config["scrape_configs"][0]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{target_port}"]}]
        (self.dir / "token").write_text(METRICS_TOKEN)
        job["authorization"]["credentials_file"] = str(self.dir / "token")
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._log = open(self.dir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def is_ready(self) -> bool:
        # The query API answers 503 until the TSDB has opened; /-/ready says when it has.
        assert self.proc.poll() is None, (self.dir / "prometheus.log").read_text()
        try:
            return self.http.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self) -> None:
        wait_until(self.is_ready, 60, "Prometheus ready")

    def query(self, expr: str) -> list[dict]:
        response = self.http.get("/api/v1/query", params={"query": expr})
        assert response.status_code == 200, (expr, response.text)
        return response.json()["data"]["result"]

    def scrapes(self) -> int:
        try:
            result = self.query('count_over_time(up{job="ebb"}[10m])')
        except httpx.HTTPError:
            return 0
        return int(float(result[0]["value"][1])) if result else 0

    def wait_for_scrapes(self, more: int) -> None:
        start = self.scrapes()
        wait_until(lambda: self.scrapes() >= start + more, 60, f"{more} more scrapes")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._log.close()


@pytest.fixture(scope="module")
def prometheus(platform):
    p = Prometheus(platform.port)
    p.wait_ready()
    yield p
    p.stop()


def traffic(platform, admin: httpx.Client, limited: httpx.Client) -> None:
    """A round of everything the dashboard shows: plain and streamed requests, a 429."""
    for _ in range(3):
        body = {"model": "obs", "messages": MESSAGES, "max_tokens": 6}
        assert admin.post("/v1/chat/completions", json=body).status_code == 200
        with admin.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            r.read()
    assert limited.post("/v1/chat/completions", json={**body, "max_tokens": 1}).status_code in (
        200,
        429,
    )


def test_every_dashboard_query_returns_data_from_a_live_platform(
    platform, admin, prometheus, receiver
):
    deploy(admin, "obs", "fake://obs?step_ms=5", idle_timeout_s=600)
    deploy(admin, "never", "fake://never?load_s=60", admission_timeout_s=0.5)
    limited = tenant_client(platform, new_key(admin, "prom-t", requests_per_minute=1))
    prometheus.wait_for_scrapes(2)
    assert (
        admin.post(
            "/v1/chat/completions", json={"model": "never", "messages": MESSAGES}
        ).status_code
        == 503
    )
    job = {
        "model": "obs",
        "endpoint": "chat.completions",
        "body": {"messages": MESSAGES, "max_tokens": 2},
        "webhook": {"url": receiver.url, "events": ["job.succeeded"]},
    }
    assert admin.post("/v1/jobs", json=job).status_code == 202
    for _ in range(3):  # rates need increases between scrapes
        traffic(platform, admin, limited)
        prometheus.wait_for_scrapes(2)
    wait_until(lambda: receiver.accepted(), 30, "the job's webhook")
    prometheus.wait_for_scrapes(2)

    missing = []
    for title, expr in dashboard_queries():
        if any(metric in expr for metric in GPU_ONLY_METRICS):
            continue
        concrete = expr.replace("$deployment", ".*").replace("$__rate_interval", "30s")
        values = [float(r["value"][1]) for r in prometheus.query(concrete)]
        if not any(math.isfinite(v) for v in values):
            missing.append((title, concrete, values))
    assert not missing, f"dashboard queries without data: {missing}"
    # The rules loaded and evaluate against the live series.
    rules = prometheus.http.get("/api/v1/rules").json()["data"]["groups"]
    assert {r["name"] for g in rules for r in g["rules"]} >= {
        "EbbHighRejectionRate",
        "EbbRedisDown",
    }
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules

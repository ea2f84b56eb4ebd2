"""The console's operator actions in a real browser (Playwright driving Debian's chromium)
against a real platform on the fake engine: every deployment field in the deploy form,
the live log tail, tenant and key rate limits, submitting and cancelling jobs, rotating the
webhook secret, and tools and embeddings in the playground. One platform for the module;
the tests run in order, as one operator's session would. Screenshots go to
test-output/console-ops/."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect
from support import REPO_ROOT, Platform, deploy, temp_home, wait_until
from support.console import WIDE, chromium, console_page, sign_in

from ebb.logtail import runner_log

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SHOTS = REPO_ROOT / "test-output" / "console-ops"
CHAT = "chat"
SLOW = "slow"
EMBED = "emb"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def platform() -> Iterator[Platform]:
    p = Platform(home=temp_home("ebb-console-ops-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def deployed(admin) -> None:
    deploy(admin, CHAT, source="fake://m?ctx=4096", min_replicas=1)
    # Slow enough that a job is still running when the test cancels it.
    deploy(admin, SLOW, source="fake://m?ctx=8192&step_ms=200")
    wait_until(
        lambda: admin.get(f"/v1/deployments/{CHAT}").json()["status"] == "ready",
        120,
        f"{CHAT} to have a ready runner",
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(SHOTS) as b:
        yield b


@pytest.fixture(scope="module")
def script_errors() -> list[str]:
    return []


@pytest.fixture(scope="module")
def page(browser, platform, deployed, script_errors) -> Iterator[Page]:
    with console_page(browser, platform.base_url, script_errors, admin_key=platform.admin_key) as p:
        yield p


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def open_view(page: Page, route: str) -> None:
    page.evaluate("route => { location.hash = route; }", f"#/{route}")
    expect(page.locator("main h1")).to_be_visible()


def schema_leaves(schema: dict) -> list[str]:
    """Every field DeploymentCreate takes that a form can hold, one object level deep
    (`engine.dtype`)."""
    components = schema["components"]["schemas"]

    def ref_of(prop: dict) -> str | None:
        for p in [prop, *prop.get("anyOf", []), *prop.get("allOf", [])]:
            if "$ref" in p:
                return p["$ref"].split("/")[-1]
        return None

    def scalar(prop: dict) -> bool:
        """A value a form field can hold: a scalar, a list of strings, a map of strings."""
        for p in [prop, *prop.get("anyOf", [])]:
            kind = p.get("type")
            if kind in ("string", "integer", "number", "boolean"):
                return True
            if kind == "array" and p.get("items", {}).get("type") == "string":
                return True
            if kind == "object" and p.get("additionalProperties", {}).get("type") == "string":
                return True
        return False

    leaves = []
    for name, prop in components["DeploymentCreate"]["properties"].items():
        ref = ref_of(prop)
        if ref and "properties" in components[ref]:
            fields = components[ref]["properties"].items()
            leaves += [f"{name}.{sub}" for sub, leaf in fields if scalar(leaf)]
        elif scalar(prop):
            leaves.append(name)
    return leaves


def test_the_deploy_form_sets_every_field_the_api_takes(page, admin):
    open_view(page, "deploy")
    leaves = schema_leaves(admin.get("/openapi.json").json())
    assert {"serving.task", "max_concurrency", "owner", "engine.dtype", "shared_with"} <= set(
        leaves
    )
    form = page.get_by_role("form", name="Deploy a model")
    expect(form.locator('[data-param="serving.task"]')).to_be_visible()
    missing = [
        (p, form.locator(f'[data-param="{p}"]').count())
        for p in leaves
        if form.locator(f'[data-param="{p}"]').count() != 1
    ]
    assert missing == [], f"the deploy form has no field for {missing}"

    page.get_by_label("Name", exact=True).fill(EMBED)
    page.get_by_label("Source").fill("fake://m?ctx=64")
    page.get_by_label("Task").select_option("embed")
    page.get_by_label("Max concurrency").fill("4")
    page.get_by_label("Queue depth limit").fill("50")
    page.get_by_label("Admission timeout (s)").fill("8")
    page.get_by_label("Owner (tenant)").fill("acme")
    page.get_by_label("Batch discount (%)").fill("150")
    page.get_by_label("Prefix caching").select_option("false")
    page.get_by_label("Visibility").select_option("private")
    page.get_by_label("Shared with (tenants)").fill("beta, gamma")
    page.get_by_role("button", name="Deploy").click()
    # The platform's bound lands next to the field it is about, and nothing is created.
    discount = page.locator(".field", has=page.get_by_label("Batch discount (%)"))
    expect(discount.locator(".field-error")).to_contain_text("100")
    assert admin.get(f"/v1/deployments/{EMBED}").status_code == 404

    page.get_by_label("Batch discount (%)").fill("50")
    shot(page, "01-deploy-form")
    page.get_by_role("button", name="Deploy").click()
    expect(page.get_by_role("heading", name=re.compile(f"{EMBED}"))).to_be_visible()
    created = admin.get(f"/v1/deployments/{EMBED}").json()
    assert created["serving"]["task"] == "embed"
    assert created["serving"]["batch_discount_pct"] == 50
    assert (created["max_concurrency"], created["queue_depth_limit"]) == (4, 50)
    assert (created["admission_timeout_s"], created["owner"]) == (8, "acme")
    assert created["engine"]["enable_prefix_caching"] is False
    assert (created["visibility"], created["shared_with"]) == ("private", ["beta", "gamma"])
    # The same deployment as a command: the CLI takes the same fields.
    hint = page.locator(".cli-hint code")
    for flag in ("--task embed", "--batch-discount 50", "--owner acme", "--no-prefix-caching"):
        expect(hint).to_contain_text(flag)
    expect(hint).to_contain_text("--share-with beta --share-with gamma")
    shot(page, "02-deploy-progress")


def test_the_logs_view_follows_a_runner_live(page, admin, platform):
    runner = admin.get(f"/v1/deployments/{CHAT}").json()["runners"][0]["id"]
    open_view(page, f"deployments/{CHAT}")
    page.get_by_role("link", name=f"Follow the log of {runner}").click()
    expect(page.get_by_role("heading", name="Logs", exact=True)).to_be_visible()
    expect(page.get_by_label("Show")).to_have_value(f"runner:{CHAT}/{runner}")
    lines = page.get_by_label("Log lines")
    expect(lines).not_to_have_attribute("data-lines", "0")
    expect(page.locator('[data-logs="following"]')).to_contain_text("Following")
    # A line the runner writes after the view opened shows up without a reload.
    marker = "console-follow-marker " + runner
    with runner_log(platform.home / "logs", runner).open("a") as log:
        log.write(marker + "\n")
    expect(lines).to_contain_text(marker, timeout=15_000)
    shot(page, "02-logs-runner")

    # The whole deployment: lines say which runner's file they come from.
    page.get_by_label("Show").select_option(f"deployment:{CHAT}")
    expect(page.get_by_label("Log lines")).to_contain_text(f"[runner-{runner}] {marker}")
    # Paused, nothing new is appended; following again catches up.
    page.get_by_label("Follow new lines").uncheck()
    expect(page.locator('[data-logs="following"]')).to_contain_text("Paused")
    later = "console-after-pause " + runner
    with runner_log(platform.home / "logs", runner).open("a") as log:
        log.write(later + "\n")
    page.get_by_label("Follow new lines").check()
    expect(page.get_by_label("Log lines")).to_contain_text(later, timeout=15_000)


def test_tenant_and_key_rate_limits(page, admin):
    key = admin.post("/v1/keys", json={"tenant": "acme", "name": "limited"}).json()
    open_view(page, "keys")
    page.get_by_label("Limits of").select_option("tenant")
    page.get_by_label("Tenant or key id").fill("acme")
    page.get_by_label("Requests per minute").fill("120")
    page.get_by_label("Tokens per minute").fill("50000")
    page.get_by_label("Priority").select_option("critical")
    page.get_by_role("button", name="Set limits").click()
    expect(page.get_by_text("Limits of tenant acme: 120/min requests")).to_be_visible()
    row = page.locator('.table-wrap[aria-label="Tenants"] tr[data-key="acme"]')
    expect(row.locator('td[data-label="Requests"]')).to_have_text("120/min")
    expect(row.locator('td[data-label="Tokens"]')).to_have_text("50,000/min")
    expect(row.locator('td[data-label="Priority"]')).to_have_text("critical")
    tenants = {t["tenant"]: t for t in admin.get("/v1/tenants").json()["data"]}
    assert tenants["acme"]["limits"] == {"requests_per_minute": 120, "tokens_per_minute": 50000}
    assert tenants["acme"]["priority"] == "critical"
    page.get_by_label("Priority").select_option("")

    # A key that does not exist: the platform's answer lands next to the id.
    page.get_by_label("Limits of").select_option("key")
    page.get_by_label("Tenant or key id").fill("key_nope")
    page.get_by_role("button", name="Set limits").click()
    target = page.locator(".field", has=page.get_by_label("Tenant or key id"))
    expect(target.locator(".field-error")).to_contain_text("No key with id 'key_nope'")

    page.get_by_label("Tenant or key id").fill(key["id"])
    page.get_by_label("Requests per minute").fill("7")
    page.get_by_label("Tokens per minute").fill("")
    page.get_by_role("button", name="Set limits").click()
    key_row = page.locator(f'.table-wrap[aria-label="API keys"] tr[data-key="{key["id"]}"]')
    expect(key_row.locator('td[data-label="Limits"]')).to_have_text("7/min req · unlimited tok")
    listed = {k["id"]: k for k in admin.get("/v1/keys").json()["data"]}
    assert listed[key["id"]]["limits"] == {"requests_per_minute": 7, "tokens_per_minute": None}
    shot(page, "03-limits")


def test_a_tenant_deploys_its_own_model_within_the_quota_the_admin_set(
    page, browser, admin, platform
):
    key = admin.post("/v1/keys", json={"tenant": "solo", "name": "self-service"}).json()
    open_view(page, "keys")
    page.get_by_label("Quota of tenant").fill("solo")
    page.get_by_label("Max deployments").fill("1")
    page.get_by_label("Max replicas (summed)").fill("1")
    page.get_by_label("Max GPUs (summed)").fill("1")
    page.get_by_label("Allowed sources").fill("fake://")
    page.get_by_role("button", name="Set quota").click()
    expect(page.get_by_text("Quota of solo: 1 deployments, 1 replicas, 1 GPUs")).to_be_visible()
    # The tenants table shows the quota just set (it had no quota column).
    solo = page.locator('.table-wrap[aria-label="Tenants"] tr[data-key="solo"]')
    expect(solo.locator('td[data-label="Quota"]')).to_have_text(
        "1 deployments · 1 replicas · 1 GPUs"
    )
    quota = admin.get("/v1/tenants/solo/quota").json()
    assert (quota["max_deployments"], quota["allowed_sources"]) == (1, ["fake://"])

    tenant = browser.new_context(viewport=WIDE).new_page()
    tenant.goto(platform.base_url + "/console")
    sign_in(tenant, key["key"])
    expect(tenant.get_by_text("Signed in with a tenant key")).to_be_visible()
    tenant.get_by_role("navigation", name="Main").get_by_role(
        "link", name="Deploy", exact=True
    ).click()
    tenant.get_by_label("Name", exact=True).fill("solo-chat")
    tenant.get_by_label("Source").fill("fake://m?ctx=4096")
    tenant.get_by_role("button", name="Deploy").click()
    expect(tenant.get_by_role("heading", name=re.compile("solo-chat"))).to_be_visible()
    assert admin.get("/v1/deployments/solo-chat").json()["owner"] == "solo"

    # Its own deployment: the tenant may scale and delete it; a second one is over quota.
    tenant.get_by_role("link", name="Open deployment").click()
    expect(tenant.get_by_role("button", name="Delete deployment")).to_be_visible()
    tenant.get_by_role("navigation", name="Main").get_by_role(
        "link", name="Deploy", exact=True
    ).click()
    tenant.get_by_label("Name", exact=True).fill("solo-two")
    tenant.get_by_label("Source").fill("fake://m?ctx=4096")
    tenant.get_by_role("button", name="Deploy").click()
    # The refusal lands in the form (next to the field it names, or on top).
    expect(tenant.get_by_role("form", name="Deploy a model")).to_contain_text(
        "may own at most 1 deployments and owns 1"
    )
    assert admin.get("/v1/deployments/solo-two").status_code == 404
    shot(tenant, "04-tenant-over-quota")

    # Its logs view follows its own deployments' runners, never the platform's or others'.
    tenant.get_by_role("navigation", name="Main").get_by_role("link", name="Logs").click()
    expect(tenant.get_by_label("Show")).to_have_value("deployment:solo-chat")
    options = (
        tenant.get_by_label("Show")
        .locator("option")
        .evaluate_all("options => options.map(o => o.value)")
    )
    assert options == ["deployment:solo-chat"], options
    expect(tenant.locator('[data-logs="following"]')).to_contain_text("Following")
    tenant.context.close()


def test_submit_a_job_and_see_its_result(page, admin):
    open_view(page, "jobs")
    page.get_by_label("Model", exact=True).select_option(CHAT)
    page.get_by_label("Prompt").fill("What is the capital of France?")
    page.get_by_label("Max tokens", exact=True).fill("8")
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_text(re.compile(r"^Submitted job_"))).to_be_visible()
    job_id = page.url.rsplit("/", 1)[-1]
    expect(page.locator(".meta .badge")).to_have_text("Succeeded", timeout=30_000)
    expect(page.locator("#result-title")).to_be_visible()
    job = admin.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["model"] == CHAT
    assert job["usage"]["completion_tokens"] == 8
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
    shot(page, "04-job-succeeded")


def test_cancel_a_running_job(page, admin):
    open_view(page, "jobs")
    page.get_by_label("Model", exact=True).select_option(SLOW)
    page.get_by_label("Prompt").fill("Write a very long story.")
    page.get_by_label("Max tokens", exact=True).fill("4000")
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_text(re.compile(r"^Submitted job_"))).to_be_visible()
    job_id = page.url.rsplit("/", 1)[-1]
    page.get_by_role("button", name="Cancel job", exact=True).click()
    dialog = page.get_by_role("dialog", name=f"Cancel {job_id}?")
    expect(dialog.get_by_role("button", name="Cancel", exact=True)).to_be_focused()
    dialog.get_by_role("button", name="Cancel job", exact=True).click()
    expect(page.locator(".meta .badge")).to_have_text("Cancelled", timeout=30_000)
    assert admin.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    shot(page, "05-job-cancelled")


def test_rotate_the_webhook_secret(page, admin):
    open_view(page, "jobs")
    secret = page.get_by_label("Current secret")
    expect(secret).to_have_value(re.compile(r"^whsec_"))
    before = secret.input_value()
    assert before == admin.get("/v1/webhooks/secret").json()["secret"]
    expect(secret).to_have_attribute("type", "password")  # not on screen until asked
    page.get_by_label("Old secret stays valid for (s)").fill("600")
    page.get_by_role("button", name="Rotate secret").click()
    page.get_by_role("dialog", name="Rotate the webhook secret?").get_by_role(
        "button", name="Rotate"
    ).click()
    expect(page.get_by_text("Rotated: deliveries are signed with the new secret")).to_be_visible()
    expect(secret).not_to_have_value(before)
    after = admin.get("/v1/webhooks/secret").json()
    assert secret.input_value() == after["secret"] != before
    assert after["previous_secret_expires_at"] is not None
    expect(page.get_by_text("The previous secret is still accepted until")).to_be_visible()
    page.get_by_role("button", name="Show", exact=True).click()
    expect(secret).to_have_attribute("type", "text")
    shot(page, "06-webhook-secret")


def test_the_playground_sends_tools_and_shows_the_tool_call(page):
    open_view(page, f"playground/{CHAT}")
    expect(page.locator('.playground[data-mode="chat"]')).to_be_visible()
    # An empty box with an example as its placeholder, not JSON that reads as content.
    box = page.get_by_label("Tools (JSON, optional)")
    expect(box).to_have_value("")
    assert (box.get_attribute("placeholder") or "").startswith("e.g. ")
    page.get_by_label("Tools (JSON, optional)").fill("[not json")
    page.get_by_role("textbox", name="Message").fill("What is the weather in Paris?")
    page.get_by_role("button", name="Send").click()
    tools = page.locator(".field", has=page.get_by_label("Tools (JSON, optional)"))
    expect(tools.locator(".field-error")).to_contain_text("Tools must be JSON")

    page.get_by_label("Tools (JSON, optional)").fill(json.dumps([WEATHER]))
    page.get_by_role("button", name="Send").click()
    answer = page.locator(".bubble.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=30_000)
    call = answer.locator('.tool-call[data-tool="get_weather"]')
    expect(call).to_contain_text("Tool call: get_weather")
    arguments = json.loads(call.locator("pre").inner_text())  # assembled from the deltas
    assert isinstance(arguments, dict) and arguments
    expect(page.locator('[data-stat="finish"]')).to_have_text("tool_calls")
    expect(page.locator('[data-stat="ttft"]')).to_have_text(re.compile(r"^[\d.]+ m?s$"))
    expect(page.get_by_label("Tools (JSON, optional)")).not_to_have_attribute(
        "aria-invalid", "true"
    )
    call_id = call.get_attribute("data-call-id")
    expect(page.get_by_text(f"result of tool call get_weather ({call_id})")).to_be_visible()
    shot(page, "07-playground-tool-call")

    # The next message goes back as the tool's result; the model then answers in words.
    page.get_by_role("textbox", name="Message").fill('{"celsius": 18}')
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".bubble.tool")).to_contain_text('{"celsius": 18}')
    reply = page.locator(".bubble.assistant").last
    expect(reply).to_have_attribute("data-state", "done", timeout=30_000)
    expect(reply.locator(".tool-call")).to_have_count(0)
    expect(reply.locator(".bubble-text")).not_to_be_empty()
    shot(page, "08-playground-tool-result")


def test_the_playground_embeds_with_a_pooling_deployment(page):
    open_view(page, f"playground/{EMBED}")
    expect(page.locator('.playground[data-mode="embeddings"]')).to_be_visible()
    expect(page.get_by_role("textbox", name="Message")).to_have_count(0)
    page.get_by_label("Inputs", exact=True).fill("Paris\nParis\nRome")
    page.get_by_role("button", name="Embed").click()
    rows = page.locator('.table-wrap[aria-label="Embeddings"] tbody tr')
    expect(rows).to_have_count(3, timeout=30_000)
    dims = rows.locator('td[data-label="Dimensions"]')
    expect(dims).to_have_text(["8", "8", "8"])
    norms = rows.locator('td[data-label="Norm"]').all_inner_texts()
    firsts = rows.locator('td[data-label="First values"]').all_inner_texts()
    assert firsts[0] == firsts[1] != firsts[2] and norms[0] == norms[1]
    expect(page.locator('[data-stat="prompt"]')).to_have_text(str(len("ParisParisRome")))
    shot(page, "09-playground-embeddings")


def test_the_deployments_table_fits_a_1366_px_screen(page, admin):
    # A long name and a load error in the status column: the widest rows it shows.
    broken = "a-deployment-whose-model-failed-to-load"
    deploy(admin, broken, source="fake://m?fail=1", min_replicas=1)
    wait_until(
        lambda: admin.get(f"/v1/deployments/{broken}").json()["error"],
        120,
        f"{broken} to report its load error",
    )
    page.set_viewport_size({"width": 1366, "height": 768})
    try:
        open_view(page, "deployments")
        wrap = page.locator('.table-wrap[aria-label="Deployments"]')
        expect(wrap.locator(f'tr[data-key="{broken}"] .sub.error')).to_be_visible()
        shot(page, "10-deployments-1366")
        # Neither the table nor the page scrolls sideways: the last column is on screen.
        widths = wrap.evaluate(
            "w => [w.scrollWidth, w.clientWidth, document.documentElement.scrollWidth]"
        )
        assert widths[0] <= widths[1] and widths[2] <= 1366, widths
        box = wrap.locator("thead th").last.bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1366, box
    finally:
        page.set_viewport_size(WIDE)
        admin.delete(f"/v1/deployments/{broken}")


def test_cost_per_day_at_a_price_of_zero_is_not_no_usage(page, admin):
    total = admin.get("/v1/usage").json()["total"]
    assert total["requests"] > 0 and total["cost_micros"] == 0, total
    open_view(page, "usage")
    chart = page.locator(".chart-card", has=page.locator("figcaption", has_text="Cost per day"))
    expect(chart.locator(".chart-empty")).to_have_text("All $0.00 in this period")
    # The token charts have tokens, so no text over them.
    tokens = page.locator(".chart-card", has=page.locator("figcaption", has_text="Tokens per day"))
    expect(tokens.locator(".chart-empty")).to_have_count(0)
    shot(page, "11-usage-at-zero-cost")


def test_no_unlabelled_controls_and_no_script_errors(page, script_errors):
    for route in ("deploy", "keys", "jobs", "logs", f"playground/{CHAT}", f"playground/{EMBED}"):
        open_view(page, route)
        unlabelled = page.evaluate(
            """() => [...document.querySelectorAll('input, select, textarea')]
                .filter(el => !el.labels.length && !el.getAttribute('aria-label'))
                .map(el => el.outerHTML)"""
        )
        assert unlabelled == [], route
    assert script_errors == []

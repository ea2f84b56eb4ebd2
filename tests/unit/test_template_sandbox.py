"""Chat templates render in a budgeted sandbox: loops, calls, string and list growth and
macro recursion are charged and stopped at their limits with a 400 that says so; a real
template renders exactly as transformers' own sandbox renders it; a template that does not
compile is refused when deployed, naming the line."""

from __future__ import annotations

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ebb.errors import InvalidRequest
from ebb.openai.chat_template import ChatTemplate, _raise_exception, _tojson, compile_template
from ebb.openai.template_budget import (
    INLINE_MAX_STEPS,
    RenderNeedsThread,
    TemplateLimits,
    inline_renders,
)
from ebb.openai.tokenizer import ByteTokenizer

LIMITS = TemplateLimits(max_steps=200_000, timeout_s=60.0, max_output_chars=1_000_000)
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}

# A template in the style of Llama 3.1's and Hermes' (tools as JSON, namespaces, macros,
# loop.last, slicing, string methods), to compare with the unbudgeted sandbox.
REAL = """{%- macro kind(spec) -%}
{%- if spec.type == 'array' %}list[{{ kind(spec['items']) }}]{% else %}{{ spec.type }}{% endif -%}
{%- endmacro -%}
{{- bos_token }}
{%- set ns = namespace(system='', seen=0) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + ns.system }}
{%- if tools %}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {%- for name, p in t.function.parameters.properties | items %}
            {{- '\\n' ~ name ~ ': ' ~ kind(p) }}{% if not loop.last %},{% endif %}
        {%- endfor %}
    {%- endfor %}
{%- endif %}
{{- '<|eot_id|>' }}
{%- for message in messages %}
    {%- set ns.seen = ns.seen + 1 %}
    {%- if message.role not in ['user', 'assistant'] %}
        {{- raise_exception('roles are user or assistant') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'].strip().replace('  ', ' ') | trim }}
    {{- '%s|%d' % (message.role.upper(), loop.index) }}{{ '{}:{}'.format(ns.seen, 'x'.center(5)) }}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>' }}{% endif %}
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Looks a thing up.",
            "parameters": {
                "type": "object",
                "properties": {
                    "q": {"type": "string"},
                    "ids": {"type": "array", "items": {"type": "integer"}},
                },
            },
        },
    }
    for i in range(3)
]


def _render(source: str, limits: TemplateLimits = LIMITS, **variables) -> str:
    return compile_template(source, SPECIAL).render(MESSAGES, limits, **variables)


def _refusal(source: str, limits: TemplateLimits = LIMITS) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        _render(source, limits)
    assert refused.value.param == "messages"
    return refused.value


def _over_budget(source: str, says: str, limits: TemplateLimits = LIMITS) -> None:
    refusal = _refusal(source, limits)
    assert refusal.code == "chat_template_budget", refusal.message
    assert "exceeded its render budget" in refusal.message
    assert says in refusal.message, refusal.message


def test_a_real_template_renders_exactly_as_the_unbudgeted_sandbox():
    plain = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    plain.filters["tojson"] = _tojson
    plain.globals["raise_exception"] = _raise_exception
    conversation = [
        {"role": "system", "content": "  Be brief.  "},
        *[
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn  {i} " * 20}
            for i in range(40)
        ],
    ]
    want = plain.from_string(REAL).render(
        messages=conversation, add_generation_prompt=True, tools=TOOLS, documents=None,
        **SPECIAL,
    )  # fmt: skip
    ours = ChatTemplate(REAL, SPECIAL).render(conversation, LIMITS, tools=TOOLS)
    assert ours == want
    assert "list[integer]" in ours and "USER|1" in ours


@pytest.mark.parametrize(
    ("source", "says"),
    [
        # The reproductions: nested loops over range(15000), and three of them.
        ("{% for i in range(15000) %}{% for j in range(15000) %}{% endfor %}{% endfor %}",
         "more than 200,000 steps"),
        ("{% for i in range(15000) %}{% for j in range(15000) %}{% for k in range(15000) %}"
         "{% endfor %}{% endfor %}{% endfor %}", "more than 200,000 steps"),
        ("{{ 'x' * 200000000 }}", "a value of 200,000,000 characters"),
        ("{{ [1, 2] * 100000000 }}", "a value of"),
        # Doubling in a loop (+, ~ and lists), and through macro arguments.
        ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
         "{% endfor %}{{ ns.s | length }}", "characters"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
         "{% endfor %}{{ ns.s | length }}", "characters"),
        ("{% set ns = namespace(l=[0]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
         "{% endfor %}{{ ns.l | length }}", "characters"),
        ("{% macro grow(s, n) %}{{ grow(s ~ s, n - 1) if n else s | length }}{% endmacro %}"
         "{{ grow('ab', 60) }}", "characters"),
        # Recursion through macros: unbounded, and exponential.
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "macros nested more than 64"),
        ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
         "{{ f(40) }}", "steps"),
        ("{% for x in [1] recursive %}{{ loop([1, 2]) }}{% endfor %}", "deep"),
        # Growth from a small argument: widths, replacements, joins, powers.
        ("{{ '%100000000s' % 'x' }}", "a format width of 100,000,000"),
        ("{{ '{:>100000000}'.format('x') }}", "a format width of 100,000,000"),
        ("{{ 'x'.center(100000000) }}", "a value of 100,000,000 characters"),
        ("{{ 'x' | center(100000000) }}", "a value of 100,000,000 characters"),
        ("{{ 'x' | indent(100000000, true) }}", "characters"),
        ("{{ 'xx' | replace('x', 'x' * 1000) | replace('x', 'x' * 1000) }}", "characters"),
        ("{{ ('x' * 900000).join(['a'] * 100) }}", "characters"),
        ("{{ (['x' * 900000] * 100) | join }}", "characters"),
        ("{{ (['a'] * 100) | join(d='x' * 900000) }}", "characters"),
        ("{{ ([{'a': 'x' * 900000}] * 100) | join(attribute='a') }}", "characters"),
        ("{{ 2 ** 100000000 }}", "bits"),
        ("{{ ([[1]] * 1000) | sum(start=[]) }}", "not numbers"),
    ],
)  # fmt: skip
def test_hostile_templates_are_stopped_by_their_budget(source, says):
    _over_budget(source, says)


def test_the_rendered_prompt_is_bounded():
    source = "{% for i in range(100) %}{{ 'x' * 20000 }}{% endfor %}"
    _over_budget(source, "an output of more than 1,000,000 characters")


def test_all_the_values_a_render_builds_are_bounded_together():
    source = "{% for i in range(40) %}{% set s = 'x' * 900000 %}{% endfor %}"
    _over_budget(source, "characters built in all")


def test_a_render_stops_at_its_time_limit():
    # Within its steps, past its time: the clock is read inside the render.
    slow = TemplateLimits(max_steps=10**9, timeout_s=0.01, max_output_chars=1_000_000)
    source = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    _over_budget(source, "longer than 0.01 s", slow)


def test_only_allowlisted_filters_globals_and_str_methods_exist():
    for source in ("{{ [1, 2] | batch(100000000) }}", "{{ 'x' | wordwrap(3) }}"):
        with pytest.raises(InvalidRequest) as refused:
            compile_template(source)
        assert refused.value.param == "serving.chat_template"
        assert "No filter named" in refused.value.message
    assert "'lipsum' is undefined" in _refusal("{{ lipsum(100000000) }}").message
    assert "may not call str.translate()" in _refusal("{{ 'x'.translate({}) }}").message


def test_a_template_that_does_not_compile_names_the_field_and_the_line():
    with pytest.raises(InvalidRequest) as refused:
        compile_template("{% for m in messages %}\n{{ m.content }}\n{% endfor %")
    assert refused.value.param == "serving.chat_template"
    assert "line 3" in refused.value.message
    with pytest.raises(InvalidRequest) as too_long:
        compile_template("x" * 65537)
    assert too_long.value.param == "serving.chat_template"
    assert "at most 65,536" in too_long.value.message


def test_a_template_failing_on_the_messages_is_a_400():
    refusal = _refusal("{{ messages[0].content + 1 }}")
    assert "TypeError" in refusal.message


def test_an_inline_render_past_its_cap_asks_for_a_thread():
    source = "{% for i in range(20000) %}{% endfor %}done"
    assert INLINE_MAX_STEPS < 20000 < LIMITS.max_steps
    with inline_renders(), pytest.raises(RenderNeedsThread):
        _render(source)
    assert _render(source) == "done"  # off the loop: the full budget
    with inline_renders():
        assert _render("{% for m in messages %}{{ m.role }}{% endfor %}") == "user"


def test_the_fake_engines_tokenizer_renders_a_deployments_template():
    tokenizer = ByteTokenizer(LIMITS)
    ids = tokenizer.render_chat(MESSAGES, None, "{% for m in messages %}[{{ m.role }}]{% endfor %}")
    assert tokenizer.decode(ids) == "[user]"
    with pytest.raises(InvalidRequest) as refused:
        tokenizer.render_chat(MESSAGES, None, "{{ 'x' * 200000000 }}")
    assert refused.value.code == "chat_template_budget"


def test_a_render_in_the_worker_pool_is_the_same_render_and_budget():
    pooled = TemplateLimits(max_steps=200_000, timeout_s=60.0, max_output_chars=1_000_000,
                            processes=1)  # fmt: skip
    template = compile_template(REAL, SPECIAL)
    conversation = [{"role": "user", "content": "Hi  there"}]
    here = template.render_here(conversation, LIMITS, tools=TOOLS)
    assert template.render(conversation, pooled, tools=TOOLS) == here
    with pytest.raises(InvalidRequest) as refused:
        compile_template("{{ 'x' * 200000000 }}").render(MESSAGES, pooled)
    assert refused.value.code == "chat_template_budget" and refused.value.param == "messages"
    with pytest.raises(InvalidRequest) as raised:
        compile_template("{{ raise_exception('no') }}").render(MESSAGES, pooled)
    assert "refused the messages: no" in raised.value.message

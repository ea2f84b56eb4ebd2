"""The Lua prelude (ebb/queue/lua/_prelude.lua): every script is loaded with it, once, and
none spells a helper of its own under a prelude name or repeats the prelude's work."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from ebb.queue.scripts import PRELUDE, lua_source

LUA = resources.files("ebb.queue").joinpath("lua")
SCRIPTS = sorted(p.name[: -len(".lua")] for p in LUA.iterdir() if p.name.endswith(".lua"))
SCRIPTS.remove(PRELUDE)
PRELUDE_TEXT = LUA.joinpath(f"{PRELUDE}.lua").read_text()
PRELUDE_NAMES = re.findall(r"^local function (\w+)\(", PRELUDE_TEXT, re.M)


def test_the_prelude_defines_the_shared_helpers():
    assert {"now_ms", "wake_runners", "wake_controller"} <= set(PRELUDE_NAMES)


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_is_loaded_after_the_prelude_once(name):
    source = lua_source(name)
    assert source.startswith(PRELUDE_TEXT)
    assert source.count(PRELUDE_TEXT) == 1
    assert source.endswith(LUA.joinpath(f"{name}.lua").read_text())


@pytest.mark.parametrize("name", SCRIPTS)
def test_no_script_redefines_a_prelude_helper_or_reads_the_clock_itself(name):
    own = LUA.joinpath(f"{name}.lua").read_text()
    for helper in PRELUDE_NAMES:
        assert not re.search(rf"\bfunction\s+{helper}\b|\blocal\s+{helper}\b", own), helper
    assert "redis.call('TIME')" not in own, "the server's clock in ms is now_ms()"

"""docs/CONFIGURATION.md is what the settings declare, and every setting is declared once."""

import re
from pathlib import Path

from ebb.config import SETTINGS_GROUPS, Settings, TestingSettings
from ebb.config.reference import render

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "CONFIGURATION.md"


def test_the_reference_is_generated_from_the_settings():
    assert REFERENCE.read_text() == render(), (
        "docs/CONFIGURATION.md differs from the settings in ebb/config/: run `make docs`"
    )


def test_every_setting_belongs_to_exactly_one_group_and_is_described():
    owners: dict[str, list[str]] = {}
    for group in SETTINGS_GROUPS:
        assert group.__doc__, f"{group.__name__} needs a docstring: its reference section"
        for name in group.__annotations__:
            owners.setdefault(name, []).append(group.__name__)
    assert set(owners) == set(Settings.model_fields), "a setting outside SETTINGS_GROUPS"
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    undescribed = [n for n, f in Settings.model_fields.items() if not f.description]
    assert undescribed == [], "every setting needs Field(description=...)"


def test_test_only_knobs_are_listed_apart_from_the_operators():
    text = render()
    operators, _, tests = text.partition("## For tests, not for operators")
    assert tests, "the reference has no section for the test-only knobs"
    for name in TestingSettings.model_fields:
        env = f"`EBB_{name.upper()}`"
        assert env in tests and f"| {env} |" not in operators


def test_every_setting_is_in_the_reference_with_its_default():
    text = render()
    for name in Settings.model_fields:
        assert f"| `EBB_{name.upper()}` |" in text
    assert "| `EBB_PORT` | integer | `8000` |" in text
    assert "| `EBB_MAX_BODY_BYTES` | bytes | `4194304` (4 MiB) |" in text
    assert "| `EBB_FORK_SERVER` | boolean | `1` |" in text


def test_the_docs_name_only_settings_that_exist():
    """A renamed or removed setting leaves no page telling operators to set it."""
    root = REFERENCE.parents[1]
    settings = {f"EBB_{name.upper()}" for name in Settings.model_fields}
    shell_variables = {"EBB_KEY"}  # the tour's variable holding the admin key
    unknown = {}
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for name in set(re.findall(r"EBB_[A-Z0-9_]+", page.read_text())):
            prefix = name.endswith("_") and any(s.startswith(name) for s in settings)
            if name not in settings | shell_variables and not prefix:
                unknown.setdefault(page.name, []).append(name)
    assert unknown == {}

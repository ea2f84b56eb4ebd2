"""Tuning that pays on some machines only, detected or asked for: a CPU stem's load reserve
(where the guest reports free pages to its host) and the engine thread's core pin (where
the process may use the two cores it was measured on)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ebb.config import Settings
from ebb.runners.core_pinning import MEASURED_CORES, pin_wanted
from ebb.runners.load_reserve import (
    AUTO_RESERVE_GIB,
    guest_reports_free_pages,
    reserve_for_stem,
    resolved_size_gib,
)

# Negotiated feature bits of a Firecracker guest's balloon, as its sysfs shows them (bit 0
# first): stats (1), deflate on OOM (2), free page reporting (5), VERSION_1 (32).
REPORTING = "01100101" + "0" * 24 + "1" + "0" * 95
WITHOUT_REPORTING = REPORTING[:5] + "0" + REPORTING[6:]


def fake_sys(root: Path, *features: str, driver: str = "virtio_balloon") -> Path:
    """A sysfs root with one virtio device per `features`, bound to `driver`."""
    bound = root / "bus/virtio/drivers" / driver
    bound.mkdir(parents=True)
    for n, bits in enumerate(features):
        device = root / f"devices/pci0000:00/virtio{n}"
        device.mkdir(parents=True)
        (device / "features").write_text(bits + "\n")
        (bound / f"virtio{n}").symlink_to(device)
    return root


def test_a_balloon_with_free_page_reporting_negotiated_is_detected(tmp_path):
    assert guest_reports_free_pages(fake_sys(tmp_path, REPORTING))


@pytest.mark.parametrize(
    "make",
    [
        lambda root: root,  # no virtio at all: bare metal, another hypervisor
        lambda root: fake_sys(root, WITHOUT_REPORTING),  # a balloon, no reporting
        lambda root: fake_sys(root, REPORTING, driver="virtio_net"),  # another device's bits
        lambda root: fake_sys(root, "0110"),  # a features file too short to say
    ],
    ids=["no-virtio", "balloon-without-reporting", "not-a-balloon", "short-features"],
)
def test_no_free_page_reporting_is_detected_without_a_reporting_balloon(tmp_path, make):
    assert not guest_reports_free_pages(make(tmp_path))


def test_auto_sizes_the_reserve_only_where_the_guest_reports_free_pages(tmp_path):
    reporting = fake_sys(tmp_path / "vm", REPORTING)
    metal = tmp_path / "metal"
    assert resolved_size_gib("auto", reporting) == AUTO_RESERVE_GIB > 0
    assert resolved_size_gib("auto", metal) == 0
    assert reserve_for_stem("auto", gpus=0, sys_root=metal) is None
    # A number is the operator's choice, wherever the stem runs.
    assert resolved_size_gib(0.5, metal) == 0.5
    assert resolved_size_gib(0, reporting) == 0


def test_the_reserve_setting_is_auto_by_default_and_takes_a_size_or_zero(monkeypatch):
    assert Settings().stem_load_reserve_gib == "auto"
    for given, resolved in [("auto", "auto"), ("0", 0.0), ("2.5", 2.5)]:
        monkeypatch.setenv("EBB_STEM_LOAD_RESERVE_GIB", given)
        assert Settings().stem_load_reserve_gib == resolved
    for wrong in ["-1", "2048", "on"]:
        monkeypatch.setenv("EBB_STEM_LOAD_RESERVE_GIB", wrong)
        with pytest.raises(ValidationError):
            Settings()


def test_auto_pins_only_where_the_process_may_use_the_cores_it_was_measured_on():
    assert MEASURED_CORES == 2
    assert pin_wanted("auto", usable_cores=2)
    assert not pin_wanted("auto", usable_cores=1)
    assert not pin_wanted("auto", usable_cores=16)
    assert pin_wanted(True, usable_cores=16), "on: wherever the engine computes alone"
    assert not pin_wanted(False, usable_cores=2)


def test_the_pin_setting_is_auto_by_default_and_takes_on_or_off(monkeypatch):
    assert Settings().engine_core_pin == "auto"
    for given, resolved in [("auto", "auto"), ("0", False), ("1", True), ("false", False)]:
        monkeypatch.setenv("EBB_ENGINE_CORE_PIN", given)
        assert Settings().engine_core_pin == resolved
    monkeypatch.setenv("EBB_ENGINE_CORE_PIN", "sometimes")
    with pytest.raises(ValidationError):
        Settings()

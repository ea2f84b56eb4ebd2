"""Test support shipped inside the package, so the runner processes a test starts can use it.

Nothing in production imports it: `ebb.engines` adds `ENGINE_ENTRIES` to a process's
registry only when `Settings.test_engines` is on (`EBB_TEST_ENGINES=1`; the test session
sets it for itself and every process it starts). No frontdoor module imports it: the
frontdoor reaches the fake model only through the registry, by path.
"""

from ebb.testing.fake_model import FAKE_ENTRY

ENGINE_ENTRIES = (FAKE_ENTRY,)

__all__ = ["ENGINE_ENTRIES"]

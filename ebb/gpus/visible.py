"""`CUDA_VISIBLE_DEVICES`: the one parser, and the one meaning of each of its values.

- unset: CUDA's default, every device the driver reports (`visible_devices` -> None);
- empty, `-1` or `NoDevFiles` (first entry): no device at all (-> []);
- `0,1` or `GPU-<uuid>,...` (also `MIG-...`): those devices, in that order. Entries are
  split on commas and stripped; empty entries are dropped.

`all` is not a CUDA value (it is `NVIDIA_VISIBLE_DEVICES`'s, for container runtimes); here,
like any name that is not an index, it stands for one device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
_HIDDEN = ("-1", "NoDevFiles")


def visible_devices(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The devices `CUDA_VISIBLE_DEVICES` names (indices or UUIDs, as written); None when it
    is unset (every device), [] when it hides them all (see the module docstring)."""
    env = os.environ if environ is None else environ
    raw = env.get(VISIBLE_DEVICES_ENV)
    if raw is None:
        return None
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names or names[0] in _HIDDEN:
        return []
    return names


def visible_indices(count: int, environ: Mapping[str, str] | None = None) -> list[int]:
    """The NVML indices, of a host with `count` GPUs, that this process may use. Devices
    named by UUID cannot be matched to indices without CUDA, so they stand for the first
    ones; indices the host does not have are left out."""
    names = visible_devices(environ)
    if names is None:
        return list(range(count))
    if all(n.isdigit() for n in names):
        return [int(n) for n in names if int(n) < count]
    return list(range(min(count, len(names))))

"""GPU placement on the Azure code trace: deployments packed per GPU vs one per GPU.

    .venv/bin/python -m bench.placement [--deployments 4] [--gpu-gib 80]

The code trace (bench/traces) is split round-robin into N deployments of different
models (their runners need 6, 10, 14, 18, ... GiB), and each is replayed through the
real controller on a simulated clock (`ebb.coldstart.simulation`, as `bench.autoscale`
does). When each deployment's runners come and go is then replayed onto a simulated
inventory of 80 GiB GPUs, as many as the one-per-GPU rule needs at its peak, in two ways:
  one per GPU   every runner takes a device of its own (no placement)
  packed        every new runner goes where `ebb.coldstart.placement.place` puts it
                (20 % headroom, 40 % beside another model, best fit), and keeps its
                device until it exits
GPU-seconds count a device while it holds at least one runner. Printed: GPU-seconds of
each, the ratio, the peak of devices in use, the runners each way could not place, and
the requests the simulation refused (the same trace and scaling: unchanged by packing).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field

from bench.autoscale import REPO, TRACES
from ebb.coldstart.placement import GIB, GpuNeed, Held, Placed, place
from ebb.coldstart.simulation import ScalingSettings, load_azure_trace, simulate
from ebb.queue.gpu_records import GpuDevice, GpuPlacement, HostInventory


@dataclass
class Packing:
    """Runners on devices over time, placed as the controller would place them."""

    inventory: list[HostInventory]
    live: dict[str, list[GpuPlacement]] = field(default_factory=dict)  # deployment -> LIFO
    refused: int = 0

    def held(self) -> list[Held]:
        return [Held(p) for placements in self.live.values() for p in placements]

    def resize(self, deployment: str, need: GpuNeed, count: int) -> None:
        mine = self.live.setdefault(deployment, [])
        while len(mine) > count:
            mine.pop()  # the newest runner drains first, as an idle one would
        while len(mine) < count:
            result = place(need, self.inventory, self.held(), deployment=deployment)
            if not isinstance(result, Placed):
                self.refused += 1
                return
            mine.append(result.placement)

    def devices_in_use(self) -> int:
        return len({(h.placement.host, i) for h in self.held() for i in h.placement.device_indexes})


def inventory(devices: int, gib: float) -> list[HostInventory]:
    total = int(gib * GIB)
    gpus = [
        GpuDevice(index=i, uuid=f"sim-{i}", name="sim", total_bytes=total, free_bytes=total)
        for i in range(devices)
    ]
    # Eight GPUs per host, as on the machines these traces come from.
    return [
        HostInventory(host=f"host-{h}", devices=gpus[h * 8 : (h + 1) * 8])
        for h in range((devices + 7) // 8)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--deployments", type=int, default=4)
    parser.add_argument("--gpu-gib", type=float, default=80.0)
    args = parser.parse_args()
    path, max_replicas = TRACES["code"]
    trace = load_azure_trace(path)
    settings = ScalingSettings(max_replicas=max_replicas, target_concurrency=8)
    needs = {
        f"d{i}": GpuNeed(
            weights_bytes=(6 + 4 * i) * GIB, kv_cache_bytes=0, reserve_bytes=0, model_key=f"m{i}"
        )
        for i in range(args.deployments)
    }
    results = {
        name: simulate(trace[i :: args.deployments], settings) for i, name in enumerate(needs)
    }
    ticks = max(len(r.serving_per_tick) for r in results.values())
    tick_s = next(iter(results.values())).tick_s

    def serving(name: str, t: int) -> int:
        series = results[name].serving_per_tick
        return series[t] if t < len(series) else 0

    one_per_gpu = [sum(serving(n, t) for n in needs) for t in range(ticks)]
    devices = max(one_per_gpu)
    packing = Packing(inventory(devices, args.gpu_gib))
    packed = []
    for t in range(ticks):
        for name, need in needs.items():
            packing.resize(name, need, serving(name, t))
        packed.append(packing.devices_in_use())
    one_s, packed_s = sum(one_per_gpu) * tick_s, sum(packed) * tick_s
    report = {
        "deployments": {n: need.total_bytes / GIB for n, need in needs.items()},
        "gpus": devices,
        "gpu_gib": args.gpu_gib,
        "one_per_gpu_gpu_seconds": round(one_s),
        "packed_gpu_seconds": round(packed_s),
        "packed_ratio": round(packed_s / one_s, 3),
        "peak_gpus_one_per_gpu": devices,
        "peak_gpus_packed": max(packed),
        "placements_refused_one_per_gpu": 0,
        "placements_refused_packed": packing.refused,
        "requests_refused": sum(r.refused for r in results.values()),
        "requests": len(trace),
    }
    print(
        f"code trace: {len(trace)} requests over {trace[-1].arrival_s:.0f} s, split over "
        f"{args.deployments} deployments needing {report['deployments']} GiB, on {devices} "
        f"GPUs of {args.gpu_gib:g} GiB"
    )
    print(f"  {'':<12}{'GPU-s':>9} {'ratio':>6} {'peak GPUs':>10} {'unplaced':>9}")
    print(f"  {'one per GPU':<12}{round(one_s):>9} {1.0:>6.3f} {devices:>10} {0:>9}")
    print(
        f"  {'packed':<12}{round(packed_s):>9} {report['packed_ratio']:>6.3f}"
        f" {max(packed):>10} {packing.refused:>9}"
    )
    print(
        f"  requests refused at the admission window: {report['requests_refused']} of "
        f"{len(trace)} (the same scaling either way)"
    )
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"placement-{time.strftime('%Y%m%d-%H%M%S')}.json"
    target.write_text(json.dumps(report, indent=2))
    print(f"results: {target}")


if __name__ == "__main__":
    main()

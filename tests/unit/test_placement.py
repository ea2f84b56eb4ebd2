"""Placement with headroom, a pure function on fake inventories: packing, the 20 % and
40 % margins, tensor parallelism, fragmentation and refusal with the numbers."""

from __future__ import annotations

from ebb.coldstart.placement import (
    GIB,
    GpuNeed,
    Held,
    NoGpus,
    Placed,
    Refused,
    place,
)
from ebb.queue.gpu_records import GpuDevice, GpuPlacement, HostInventory


def device(index: int, total_gib: float, free_gib: float | None = None) -> GpuDevice:
    free = total_gib if free_gib is None else free_gib
    return GpuDevice(
        index=index,
        uuid=f"GPU-{index}",
        name="Fake H100",
        total_bytes=int(total_gib * GIB),
        free_bytes=int(free * GIB),
    )


def host(*devices: GpuDevice, name: str = "h1") -> HostInventory:
    return HostInventory(host=name, devices=list(devices))


def need(gib: float, model: str = "m") -> GpuNeed:
    return GpuNeed(weights_bytes=int(gib * GIB), kv_cache_bytes=0, reserve_bytes=0, model_key=model)


def placed(result: object) -> GpuPlacement:
    assert isinstance(result, Placed), result
    return result.placement


def test_no_gpus_means_cpu() -> None:
    assert isinstance(place(need(1), [host()]), NoGpus)
    assert isinstance(place(need(1), []), NoGpus)


def test_margin_of_twenty_percent_on_an_empty_device() -> None:
    # 10 GiB × 1.2 = 12 GiB: a 12 GiB device is not enough (strictly more is needed).
    assert isinstance(place(need(10), [host(device(0, 12))]), Refused)
    p = placed(place(need(10), [host(device(0, 12.1))]))
    assert p.device_indexes == [0] and p.cuda_visible_devices == "0"
    assert p.reserved_bytes_per_device == 10 * GIB


def test_utilization_is_the_share_of_the_device_rounded_up() -> None:
    p = placed(place(need(10), [host(device(0, 80))]))
    assert p.gpu_memory_utilization == 0.13  # 10 / 80 = 0.125, never rounded down


def test_two_small_deployments_pack_onto_one_device() -> None:
    inventory = [host(device(0, 80), device(1, 80))]
    first = placed(place(need(10, "a"), inventory))
    second = placed(place(need(10, "b"), inventory, [Held(first)]))
    assert first.device_indexes == second.device_indexes == [0]


def test_best_fit_keeps_the_large_device_free() -> None:
    inventory = [host(device(0, 80), device(1, 24))]
    assert placed(place(need(10), inventory)).device_indexes == [1]
    assert placed(place(need(50), inventory)).device_indexes == [0]


def test_forty_percent_beside_a_different_model() -> None:
    inventory = [host(device(0, 40))]
    neighbour = placed(place(need(20, "a"), inventory))
    # 20 GiB left; 13 GiB needs 15.6 GiB beside itself but 18.2 GiB beside "a".
    assert placed(place(need(13, "a"), inventory, [Held(neighbour)])).device_indexes == [0]
    refused = place(need(15, "b"), inventory, [Held(neighbour)])
    assert isinstance(refused, Refused)
    assert (
        refused.reason
        == "needs 15.0 GiB + 40 % beside another model, largest free 20.0 GiB on GPU 0"
    )


def test_reserved_memory_counts_before_nvml_sees_it() -> None:
    # NVML still says the device is empty: the first runner is loading.
    inventory = [host(device(0, 20))]
    first = placed(place(need(10), inventory))
    assert isinstance(place(need(10), inventory, [Held(first)]), Refused)


def test_nvml_free_memory_counts_what_others_use() -> None:
    # Another process (not ebb's) holds 20 of 24 GiB.
    assert isinstance(place(need(4), [host(device(0, 24, free_gib=4.8))]), Refused)
    assert placed(place(need(4), [host(device(0, 24, free_gib=4.9))])).device_indexes == [0]


def test_a_sleeping_runner_frees_its_device_for_others() -> None:
    inventory = [host(device(0, 24))]
    sleeper = placed(place(need(15, "a"), inventory))
    assert isinstance(place(need(15, "b"), inventory, [Held(sleeper)]), Refused)
    assert placed(place(need(15, "b"), inventory, [Held(sleeper, asleep=True)]))


def test_a_model_larger_than_a_device_uses_tensor_parallelism_on_one_host() -> None:
    inventory = [host(device(0, 80), device(1, 80), device(2, 80), device(3, 80))]
    p = placed(place(need(120), inventory))
    assert p.tensor_parallel_size == 2 and p.gpu_count == 2
    assert p.reserved_bytes_per_device == 60 * GIB
    assert p.cuda_visible_devices == "0,1"


def test_tensor_parallelism_never_spans_hosts() -> None:
    inventory = [host(device(0, 80), name="a"), host(device(0, 80), name="b")]
    refused = place(need(140), inventory)
    assert isinstance(refused, Refused)
    assert "on one host" not in refused.reason  # one device per host: TP 1 only


def test_requested_tensor_parallel_size_is_kept() -> None:
    inventory = [host(*(device(i, 80) for i in range(4)))]
    p = placed(place(need(20), inventory, tensor_parallel_size=4))
    assert p.device_indexes == [0, 1, 2, 3]
    assert p.reserved_bytes_per_device == 5 * GIB


def test_fragmented_free_memory_is_refused_with_the_largest_free_device() -> None:
    # 3 × 10 GiB free in total, but no single device can take 14.2 GiB + 20 %.
    inventory = [host(device(0, 80, 10), device(1, 80, 11), device(2, 80, 9))]
    refused = place(need(14.2), inventory, tensor_parallel_size=1)
    assert isinstance(refused, Refused)
    assert refused.reason == "needs 14.2 GiB + 20 %, largest free 11.0 GiB on GPU 1"


def test_refusal_names_the_host_when_there_are_several() -> None:
    inventory = [host(device(0, 16), name="a"), host(device(0, 16, 8), name="b")]
    refused = place(need(20), inventory, tensor_parallel_size=1)
    assert isinstance(refused, Refused)
    assert refused.reason.endswith("largest free 16.0 GiB on GPU 0 of a")


def test_tp_refusal_says_how_many_devices() -> None:
    inventory = [host(device(0, 80, 30), device(1, 80, 30))]
    refused = place(need(100), inventory)
    assert isinstance(refused, Refused)
    assert refused.reason == "needs 2 × 50.0 GiB on one host + 20 %, largest free 30.0 GiB on GPU 0"


def test_need_splits_weights_but_not_the_reserve() -> None:
    n = GpuNeed(weights_bytes=8 * GIB, kv_cache_bytes=4 * GIB, reserve_bytes=GIB)
    assert n.total_bytes == 13 * GIB
    assert n.per_device_bytes(2) == 7 * GIB


def test_a_host_holding_the_weights_wins_over_a_tighter_fit_elsewhere() -> None:
    tight = host(device(0, 16), name="tight")
    roomy = host(device(0, 80), name="roomy")
    assert placed(place(need(10), [tight, roomy])).host == "tight"
    assert placed(place(need(10), [tight, roomy], holding={"roomy"})).host == "roomy"
    # Holding the weights never makes a device fit that does not.
    assert placed(place(need(20), [tight, roomy], holding={"tight"})).host == "roomy"

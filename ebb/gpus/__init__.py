"""GPUs, asked one way: below both the controller (`ebb.coldstart`) and runners (`ebb.runners`).

- `visible.py`: the one `CUDA_VISIBLE_DEVICES` parser, and what unset, empty and hiding
  values mean;
- `nvml.py`: the one NVML read, into the one record of a GPU (`GpuDevice`, in bytes; it
  crosses processes, so it lives with the other Redis records in `ebb.queue.gpu_records`);
- `count.py`: how many GPUs this process can use, and how many a runner holds (its
  placement's devices), which is also what billing meters.

NVML never initialises CUDA, so everything here is safe in a process that forks later.
"""

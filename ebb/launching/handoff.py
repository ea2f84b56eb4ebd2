"""What a launcher hands a runner process through its environment (besides its command line).

The devices it holds are not among them: a placed runner reads its placement from Redis
and narrows `CUDA_VISIBLE_DEVICES` itself (`ebb.gpus`); only how many a pod holds,
`ebb.gpus.count.HELD_GPUS_ENV`, which is what it is billed for.
"""

from __future__ import annotations

# When the launcher started the process (ms since the epoch): the runner's cold-start clock
# starts there, so the spawn itself is counted.
LAUNCHED_AT_ENV = "EBB_RUNNER_LAUNCHED_MS"

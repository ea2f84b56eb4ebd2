"""The scripts that write a deployment's record as a whole: store it with its uid, and
delete it with everything bound to its name (see the .lua headers)."""

from __future__ import annotations

import redis.asyncio as aioredis

from ebb.queue import keys
from ebb.queue.replies import reply_int, reply_list
from ebb.queue.scripts import register_async
from ebb.queue.versions import VERSION_SEPARATOR


class DeploymentScripts:
    """A deployment's record scripts on an asyncio client (the frontdoor)."""

    def __init__(self, client: aioredis.Redis):
        self._deployment_put = register_async(client, "deployment_put")
        self._deployment_delete = register_async(client, "deployment_delete")

    async def deployment_put(
        self, name: str, record: bytes, uid: str, *, create_only: bool
    ) -> bool:
        """Store a deployment's record with its uid; False: `create_only` and it exists."""
        return bool(
            reply_int(
                await self._deployment_put(
                    keys=[keys.DEPLOYMENTS, keys.DEPLOYMENT_UIDS],
                    args=[name, record, uid, "1" if create_only else "0"],
                )
            )
        )

    async def deployment_delete(
        self, name: str, *, failed_event: bytes, result_ttl_s: int, sleeper_exit: str
    ) -> tuple[bool, int]:
        """Delete a deployment and fail what is queued for it (see deployment_delete.lua):
        whether it existed, and how many queued requests failed."""
        # A key function given "" is its prefix: the script names each unit's keys.
        prefixes = [
            keys.queue(""),
            keys.job_queue(""),
            keys.sleepers(""),
            keys.claiming(""),
            keys.deployment_status(""),
            keys.coldstart(""),
            keys.prefix_owners(""),
        ]
        deleted, failed = reply_list(
            await self._deployment_delete(
                keys=[
                    keys.DEPLOYMENTS,
                    keys.DEPLOYMENT_UIDS,
                    keys.deployment_versions(name),
                    keys.traffic(name),
                    keys.JOBS_WATCH,
                    keys.JOBS_SIGNAL,
                ],
                args=[
                    name,
                    VERSION_SEPARATOR,
                    keys.REQUEST_PREFIX,
                    keys.EVENTS_PREFIX,
                    failed_event,
                    result_ttl_s,
                    keys.JOB_ATTEMPT_TTL_S,
                    keys.SIGNAL_LIST_MAX,
                    keys.runner_assignment(""),
                    sleeper_exit,
                    *prefixes,
                ],
            )
        )
        return bool(reply_int(deleted)), reply_int(failed)

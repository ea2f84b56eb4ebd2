"""The local weight cache: what it holds, what is in use, what was evicted (admin key)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter

from ebb.frontdoor.auth import AdminDep
from ebb.frontdoor.services import ServicesDep
from ebb.weights_cache import cache_report

router = APIRouter()


@router.get("/v1/weights")
async def weights_cache(caller: AdminDep, services: ServicesDep) -> dict[str, Any]:
    settings = services.settings
    report = await asyncio.to_thread(
        cache_report, settings.weights_dir, settings.weights_cache_bytes
    )
    return {"object": "weights_cache", **report.to_dict()}

"""Usage: the caller's own tokens (admins see every tenant's)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ebb.frontdoor.auth import CallerDep

router = APIRouter(prefix="/v1")


@router.get("/usage")
async def usage(request: Request, caller: CallerDep, start: float = 0.0) -> dict:
    records = await request.app.state.services.state.usage_records(since_s=start)
    rows: dict[str, dict] = {}
    total = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
    for r in records:
        if not caller.is_admin and r.tenant != caller.tenant:
            continue
        row = rows.setdefault(
            r.deployment,
            {"deployment": r.deployment, "requests": 0, "prompt_tokens": 0, "completion_tokens": 0},
        )
        for acc in (row, total):
            acc["requests"] += 1
            acc["prompt_tokens"] += r.prompt_tokens
            acc["completion_tokens"] += r.completion_tokens
    return {
        "object": "usage",
        "data": sorted(rows.values(), key=lambda r: r["deployment"]),
        "total": total,
    }

"""OpenAI's cursor-paged list (`GET /v1/batches`, `/v1/jobs`, a response's input items)."""

from __future__ import annotations

from typing import Any


def list_page(found: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The first `limit` of `found` (each with an "id"), as a list page. `found` holds up
    to one item more than the page, so that `has_more` is known without another read."""
    page = found[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(found) > limit,
    }

"""The deploy API's `scaling` block (`DeploymentSpec.scaling`), validated: an unknown
policy, a target missing for `slo`, a time that is not HH:MM, an unknown day or time zone
are a 400 naming the field."""

from __future__ import annotations

import functools
from typing import Literal
from zoneinfo import available_timezones

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ebb.queue.scaling_spec import (
    ScalingSpec,
    ScheduleEntry,
    SloTarget,
    UtilisationRule,
    parse_hhmm,
)

Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


@functools.cache
def _time_zones() -> frozenset[str]:
    # An allowlist: the zones this host's tz database names. ZoneInfo(name) would open a
    # file under the tz path for any name it does not reject, and the name is a tenant's.
    return frozenset(available_timezones()) | {"UTC"}


EVERY_DAY: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class SloBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttft_p90_s: float | None = Field(None, gt=0, le=600, description="p90 time to first token.")
    tpot_p90_s: float | None = Field(None, gt=0, le=60, description="p90 time per output token.")
    window_s: float = Field(60.0, ge=5, le=3600, description="Over this long, measured.")
    predict: bool = Field(False, description="Also scale on the online latency model's prediction.")


class UtilisationBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    up_pct: float = Field(70.0, gt=0, le=100)
    up_for_s: float = Field(300.0, ge=10, le=86400)
    down_pct: float = Field(25.0, ge=0, lt=100)
    down_for_s: float = Field(1800.0, ge=10, le=86400)

    @model_validator(mode="after")
    def _ordered(self) -> UtilisationBody:
        if self.down_pct >= self.up_pct:
            raise ValueError("down_pct must be below up_pct")
        return self


class ScheduleBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    days: list[Day] = Field(default_factory=lambda: list(EVERY_DAY), min_length=1)
    start: str = Field(alias="from", description="HH:MM, local time in tz.")
    end: str = Field(alias="to", description="HH:MM; at or before 'from': past midnight.")
    tz: str = Field("UTC", max_length=64, description="An IANA time zone, e.g. Europe/Paris.")
    min_replicas: int = Field(ge=0, le=64)

    @field_validator("start", "end")
    @classmethod
    def _time(cls, value: str) -> str:
        parse_hhmm(value)
        return value

    @field_validator("tz")
    @classmethod
    def _zone(cls, value: str) -> str:
        if value not in _time_zones():
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. Europe/Paris)")
        return value


class ScalingBody(BaseModel):
    """How the controller sizes the deployment (absent: unchanged; default: queue-only)."""

    model_config = ConfigDict(extra="forbid")

    policy: Literal["queue", "slo", "utilisation"] = "queue"
    slo: SloBody | None = None
    utilisation: UtilisationBody | None = None  # None: the design's defaults
    keep_alive: Literal["fixed", "learned", "hybrid"] = "hybrid"
    trend: bool = False
    schedule: list[ScheduleBody] = Field(default_factory=list, max_length=32)
    reversal_gap_s: float = Field(300.0, ge=0, le=86400)

    @model_validator(mode="after")
    def _target(self) -> ScalingBody:
        if self.policy == "slo" and (
            self.slo is None or (self.slo.ttft_p90_s is None and self.slo.tpot_p90_s is None)
        ):
            raise ValueError("policy 'slo' needs slo.ttft_p90_s or slo.tpot_p90_s")
        return self

    def spec(self) -> ScalingSpec:
        return ScalingSpec(
            policy=self.policy,
            slo=SloTarget(**self.slo.model_dump()) if self.slo else None,
            utilisation=UtilisationRule(**self.utilisation.model_dump())
            if self.utilisation
            else UtilisationRule(),
            keep_alive=self.keep_alive,
            trend=self.trend,
            schedule=tuple(
                ScheduleEntry(
                    days=tuple(e.days),
                    start=e.start,
                    end=e.end,
                    tz=e.tz,
                    min_replicas=e.min_replicas,
                )
                for e in self.schedule
            ),
            reversal_gap_s=self.reversal_gap_s,
        )

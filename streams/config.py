"""Stream configuration: topic names and knobs, from FIRSTFAULT_* variables (or flags)."""
from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, Field


def _env(env: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    return env.get(f"FIRSTFAULT_{name}", default)


class StreamConfig(BaseModel):
    bootstrap: str | None = Field(default=None, description="Kafka bootstrap servers; None: embedded broker")
    redis_url: str | None = None
    redis_prefix: str = Field(default="firstfault:", description="key prefix of the diagnoses store (shared with the service)")
    prefix: str = "firstfault."
    partitions: int = Field(default=4, ge=1)
    grace_s: float = Field(default=30.0, ge=0, description="event-time grace after the end event")
    grace_cap_s: float = Field(default=10.0, ge=0, description="processing-time cap on the grace wait")
    lateness_s: float = Field(default=3600.0, ge=0, description="late lines within this revise a diagnosis")
    hold_s: float = Field(default=300.0, ge=0, description="how long a line waits for its workload's start")
    hold_max: int = Field(default=200_000, ge=0, description="lines held at most while waiting")
    batch: int = Field(default=5000, ge=1, description="raw records per extractor batch")
    watermark_wait_s: float = Field(default=120.0, ge=0, description=(
        "how long a final diagnosis waits past the grace for the extractors to have read every raw "
        "partition up to the end event; then a provisional says what is missing and the final waits "
        "for the evidence, up to lateness_s; 0: do not wait"))
    watermark_margin_s: float = Field(default=1.0, ge=0, description=(
        "an extractor's progress counts once stamped this long after the end event: clock skew "
        "between hosts and the age of a fetch's high watermark"))
    standby_replicas: int = Field(default=0, ge=0, description=(
        "standby copies of each correlator table partition on other correlators: faster failover for "
        "that much more memory per worker; 0 (the default) for one correlator or the embedded broker"))
    rules: str | None = None
    app_id: str = "firstfault-correlator"
    extractor_group: str = "firstfault-extractor"

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"

    @property
    def topics(self) -> dict[str, str]:
        """Logical name -> topic; every topic firstfault reads or writes."""
        return {n: self.topic(n) for n in ("raw", "scheduler", "events", "diagnoses", "deadletter",
                                          "node-history", "diagnoses-replay", "progress", "rules",
                                          "diagnoses-shadow", "node-health")}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "StreamConfig":
        env = os.environ if env is None else env
        values: dict = {
            "bootstrap": _env(env, "KAFKA_BOOTSTRAP"), "redis_url": _env(env, "REDIS_URL"),
            "prefix": _env(env, "TOPIC_PREFIX", "firstfault."), "rules": _env(env, "RULES"),
            "redis_prefix": _env(env, "REDIS_PREFIX", "firstfault:"),
        }
        for key, name in (("partitions", "PARTITIONS"), ("grace_s", "GRACE_S"), ("grace_cap_s", "GRACE_CAP_S"),
                          ("lateness_s", "LATENESS_S"), ("hold_s", "HOLD_S"), ("hold_max", "HOLD_MAX"),
                          ("batch", "BATCH"), ("app_id", "APP_ID"), ("extractor_group", "EXTRACTOR_GROUP"),
                          ("watermark_wait_s", "WATERMARK_WAIT_S"), ("watermark_margin_s", "WATERMARK_MARGIN_S"),
                          ("standby_replicas", "STANDBY_REPLICAS")):
            if (v := _env(env, name)) is not None:
                values[key] = v
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate({k: v for k, v in values.items() if v is not None})

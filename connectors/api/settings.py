"""Service configuration: one pydantic model filled from ``FIRSTFAULT_*`` environment variables.

Every field ``x`` reads ``FIRSTFAULT_<X>``; tokens also read ``FIRSTFAULT_<X>_FILE``
(a file of tokens, comma- or newline-separated, e.g. a mounted secret).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from firstfault.connectors.sinks.redis_store import Retention
from firstfault.rules.bundle import parse_size

ENV_PREFIX = "FIRSTFAULT_"
MiB = 1024 * 1024


def env_name(field: str) -> str:
    """The environment variable behind a settings field: it is also the name errors give a limit."""
    return ENV_PREFIX + field.upper()


class ServiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    redis_url: str | None = None
    redis_prefix: str = "firstfault:"
    rules: str | None = Field(default=None, description="rules overlay directory, as `firstfault analyze --rules`")

    read_tokens: frozenset[str] = frozenset()
    write_tokens: frozenset[str] = frozenset()

    # Limits. The defaults fit a few-hundred-node job sent as JSON or a .tar.gz.
    max_body_bytes: int = Field(default=64 * MiB, ge=1)
    max_archive_bytes: int = Field(default=1024 * MiB, ge=1, description="uncompressed, all members (and any one)")
    max_files: int = Field(default=10_000, ge=1, description="files in the JSON form, members in an archive")
    max_lines: int = Field(default=5_000_000, ge=1, description="evidence lines over all files")
    request_timeout_s: float = Field(default=60.0, gt=0, description="engine time cap per request")
    engine_threads: int = Field(default=2, ge=1, le=64)
    engine_queue: int = Field(default=8, ge=0, description="requests that may wait for an engine thread")

    # Retention of the diagnoses store (also read by the stream's correlator: redis_store.Retention).
    store_max_diagnoses: int = Field(default=Retention.max_diagnoses, ge=1, description="attempts kept")
    store_max_bytes: int = Field(default=Retention.max_bytes, ge=1, description="documents and kept lines (512M, 4G)")
    store_ttl_days: float = Field(default=Retention.ttl_days, ge=0, description="days since the last write; 0: none")

    allowed_hosts: frozenset[str] = Field(default=frozenset(), description="Host header names answered (comma-"
                                          "separated; *.example.com, *); none: loopback names when bound to loopback")

    @field_validator("redis_url", "rules")
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        return v or None

    @field_validator("store_max_bytes", mode="before")
    @classmethod
    def _size(cls, v: object) -> object:
        return parse_size(v) if isinstance(v, str) else v

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _names(cls, v: object) -> object:
        if isinstance(v, str):
            return frozenset(h.strip().lower() for h in v.split(",") if h.strip())
        return v

    @property
    def retention(self) -> Retention:
        return Retention(max_diagnoses=self.store_max_diagnoses, max_bytes=self.store_max_bytes,
                         ttl_days=self.store_ttl_days)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.read_tokens or self.write_tokens)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> "ServiceSettings":
        """Settings from the environment; ``overrides`` (e.g. command-line flags) win.

        Raises ValueError naming the variable when a value is malformed.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name in cls.model_fields:
            if name.endswith("_tokens"):
                tokens = _tokens(env, env_name(name))
                if tokens:
                    values[name] = tokens
            elif (raw := env.get(env_name(name))) is not None and raw != "":
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = str(first["loc"][0]) if first["loc"] else "?"
            raise ValueError(f"{env_name(field)}: {first['msg']}") from None


def _tokens(env: Mapping[str, str], var: str) -> frozenset[str]:
    raw = env.get(var, "")
    if path := env.get(var + "_FILE"):
        try:
            raw += "," + Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{var}_FILE: cannot read {path}: {exc.strerror}") from None
    return frozenset(t.strip() for t in raw.replace("\n", ",").split(",") if t.strip())

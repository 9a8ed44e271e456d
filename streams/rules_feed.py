"""Rule catalogs as data on the stream: the compacted ``rules`` topic and the workers' side of it.

The topic holds three kinds of record (JSON values, keyed so compaction keeps what matters):

* ``version/<rules_version>``: a :class:`Bundle`, one published catalog: the overlay's YAML
  files (relative path -> text, laid over the built-in catalog as ``--rules DIR`` is), its
  ``rules_version`` (the catalog's content hash, the one every diagnosis carries), author,
  message and time;
* ``live``: a :class:`Pointer` to the version the workers run, with the versions that were
  live before it (newest first), so ``rollback`` works after compaction dropped old pointers;
* ``shadow``: a :class:`Pointer` to the candidate ``firstfault rules shadow`` runs, and since when.

A ``rules_version`` of ``None`` in a pointer means the catalog each worker was started with
(the built-in catalog, or its ``FIRSTFAULT_RULES`` overlay).

Tansu does not compact (stack.md §1), so readers read to the end and keep the last record per
key: with compaction or without, the answer is the same.

Workers follow the ``live`` pointer with :class:`RulesFollower`: a consumer of their own
(every partition, no group), polled without blocking between batches. A new version is
built and checked in a thread (materialized, loaded, linted, its rule tests run, its hash
compared), so the hot path only swaps a reference. A version that fails is refused: the
worker keeps the catalog it has, logs one line and counts it on ``/metrics``.
"""
from __future__ import annotations

import getpass
import logging
import os
import tempfile
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError

from .config import StreamConfig

if TYPE_CHECKING:
    from firstfault.rules.catalog import Catalog

log = logging.getLogger("firstfault.rules_feed")

LIVE, SHADOW = "live", "shadow"
VERSION_PREFIX = "version/"
HISTORY_MAX = 20              # live versions remembered for rollback
POLL_EVERY_S = 1.0            # how often a worker looks at the rules topic (a non-blocking fetch)


class Bundle(BaseModel):
    """One published catalog: an overlay's files and where it came from."""

    rules_version: str
    files: dict[str, str] = Field(description="overlay-relative path -> YAML text")
    author: str = ""
    message: str = ""
    published_at: str = ""


class Pointer(BaseModel):
    """``live`` or ``shadow``: which version, who moved it and why; ``history``: earlier live versions."""

    rules_version: str | None
    history: list[str | None] = Field(default_factory=list)
    author: str = ""
    message: str = ""
    at: str = ""
    started_ms: int | None = Field(default=None, description="shadow: when its run started (ms since epoch)")


class RulesRefused(Exception):
    """A catalog that must not go live; the message is one line saying why."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def default_author() -> str:
    try:
        return os.environ.get("FIRSTFAULT_AUTHOR") or getpass.getuser()
    except Exception:            # no user name (a container without /etc/passwd entry)
        return "unknown"


def version_key(version: str) -> str:
    return f"{VERSION_PREFIX}{version}"


# ---------------------------------------------------------------- the catalog side

def overlay_files(path: str | Path) -> dict[str, str]:
    """Every YAML file of an overlay directory, by its path relative to it."""
    from firstfault.rules.errors import CatalogError

    from firstfault.rules.catalog import check_rule_file

    root = Path(path)
    if not root.is_dir():
        raise CatalogError(str(root), None, "rules directory does not exist")
    out = {}
    for p in sorted(root.rglob("*.yaml")):
        rel = p.relative_to(root).as_posix()
        check_rule_file(p, rel)             # regular files only, size capped: a FIFO or /dev/zero is refused
        out[rel] = p.read_text(encoding="utf-8")
    return out


def gate(path: str | Path) -> list[str]:
    """What ``rules lint`` and ``rules test`` say is wrong with an overlay; [] when it may be published."""
    from firstfault.rules.catalog import lint_catalog, load_catalog
    from firstfault.rules.errors import CatalogError
    from firstfault.rules.ruletest import run_rule_tests

    problems = [f"rules lint: {e}" for e in lint_catalog(path)]
    if problems:
        return problems
    try:
        catalog = load_catalog(path)
    except CatalogError as exc:
        return [f"rules lint: {exc}"]
    return [f"rules test: FAIL {r.rule_id} ({r.file}): {f}" for r in run_rule_tests(catalog) for f in r.failures]


def bundle_of(path: str | Path, author: str = "", message: str = "") -> Bundle:
    from firstfault.rules.catalog import load_catalog

    return Bundle(rules_version=load_catalog(path).version, files=overlay_files(path),
                  author=author or default_author(), message=message, published_at=now_iso())


def materialize(bundle: Bundle, root: Path) -> Path:
    """The bundle's files under ``root/<hash>/`` (content-addressed: written once, never changed)."""
    safe = bundle.rules_version.replace(":", "-").replace("/", "-")
    target = root / safe
    if not target.is_dir():
        tmp = root / f".{safe}-{uuid.uuid4().hex[:8]}"
        for rel, text in bundle.files.items():
            dest = (tmp / rel).resolve()
            if tmp.resolve() not in dest.parents:
                raise RulesRefused(f"file {rel!r} points outside the catalog")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(target)
        except OSError:          # another thread made it meanwhile: same content
            pass
    return target


def build(bundle: Bundle, root: Path) -> "Catalog":
    """Load and check a published catalog as ``publish`` did; raises RulesRefused (one line) if it must not run."""
    from firstfault.rules.catalog import load_catalog
    from firstfault.rules.errors import CatalogError

    path = materialize(bundle, root)
    try:
        problems = gate(path)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise RulesRefused(problems[0] + more)
        catalog = load_catalog(path)
    except CatalogError as exc:
        raise RulesRefused(f"rules lint: {exc}") from None
    if catalog.version != bundle.rules_version:
        raise RulesRefused(f"it builds as {catalog.version} here, not {bundle.rules_version}: this worker's "
                           "built-in rules differ from the publisher's (run the same firstfault version)")
    return catalog


# ---------------------------------------------------------------- the topic side

def ensure_topic(cfg: StreamConfig) -> None:
    from . import kafka

    kafka.ensure_topics(cfg, [cfg.topic("rules")])


def publish_record(cfg: StreamConfig, key: str, value: BaseModel) -> None:
    """One record, delivered before this returns (one per batch: Tansu's end offsets stay exact)."""
    from confluent_kafka import KafkaException

    from . import kafka

    errors: list[Any] = []
    prod = kafka.producer(cfg)
    prod.produce(cfg.topic("rules"), key=key.encode(), value=value.model_dump_json().encode(),
                 on_delivery=lambda err, _msg: errors.append(err) if err is not None else None)
    if prod.flush(30) or errors:
        raise KafkaException(errors[0] if errors else "the rules record was not delivered within 30 s")


def read_state(cfg: StreamConfig, idle_s: float = 1.0) -> dict[str, bytes]:
    """The last value of every key of the rules topic (read to the end: the broker may not compact)."""
    from .follow import TopicReader

    state: dict[str, bytes] = {}
    for m in TopicReader(cfg, cfg.topic("rules"), idle_s=idle_s):       # it closes its consumer at the end
        if m.key() is not None and m.value() is not None:
            state[m.key().decode("utf-8", "replace")] = m.value()
    return state


def pointer(state: dict[str, bytes], key: str) -> Pointer | None:
    raw = state.get(key)
    if raw is None:
        return None
    try:
        return Pointer.model_validate_json(raw)
    except ValidationError:
        return None


def bundle(state: dict[str, bytes], version: str) -> Bundle | None:
    raw = state.get(version_key(version))
    if raw is None:
        return None
    try:
        return Bundle.model_validate_json(raw)
    except ValidationError:
        return None


def move_live(cfg: StreamConfig, state: dict[str, bytes], version: str | None, author: str, message: str) -> Pointer:
    """Point ``live`` at ``version``, remembering the version it leaves."""
    old = pointer(state, LIVE)
    # No pointer yet: the workers ran their configured catalog (None), which rollback returns to.
    history = ([old.rules_version] + old.history)[:HISTORY_MAX] if old is not None else [None]
    new = Pointer(rules_version=version, history=history, author=author, message=message, at=now_iso())
    publish_record(cfg, LIVE, new)
    return new


# ---------------------------------------------------------------- the workers' side

class RulesFollower:
    """A worker's view of one pointer (``live``): call :meth:`poll` between batches; a Catalog it
    returns is the one to use from now on. Never raises, never blocks for long."""

    def __init__(self, cfg: StreamConfig, worker: str, catalog: "Catalog", metrics: Any = None,
                 key: str = LIVE) -> None:
        self.cfg, self.worker, self.key = cfg, worker, key
        self.base = catalog                       # what the worker was started with: a pointer to None
        self.current = catalog
        self.metrics = metrics
        self.state: dict[str, bytes] = {}
        self._consumer: Any = None
        self._due = 0.0
        self._acted: object = _UNSET              # the pointer value last acted on
        self._building: tuple[str, Future] | None = None
        self._refused: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._dir = Path(tempfile.gettempdir()) / f"firstfault-rules-{os.getpid()}"
        if metrics is not None:
            metrics.loaded(worker, catalog.version)

    def poll(self, now: float | None = None) -> "Catalog | None":
        try:
            return self._poll(time.monotonic() if now is None else now)
        except Exception as exc:                  # the rules feed must never stop a worker
            log.warning("rules: following %s failed: %s", self.cfg.topic("rules"), exc)
            return None

    def _poll(self, now: float) -> "Catalog | None":
        done = self._finished()
        if done is not None:
            return done
        if now < self._due:
            return None
        self._due = now + POLL_EVERY_S
        if not self._read():
            return None
        ptr = pointer(self.state, self.key)
        if ptr is None or self._building is not None:
            return None
        target = ptr.rules_version
        if target == self._acted:
            return None
        if target is None or target == self.base.version:
            self._acted = target
            return self._swap(self.base, ptr) if self.current is not self.base else None
        if target == self.current.version or target in self._refused:
            self._acted = target
            return None
        found = bundle(self.state, target)
        if found is None:                         # its version record not read yet: look again next time
            return None
        self._acted = target
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="rules-build")
        self._building = (target, self._pool.submit(build, found, self._dir))
        return None

    def _finished(self) -> "Catalog | None":
        if self._building is None or not self._building[1].done():
            return None
        target, fut = self._building
        self._building = None
        try:
            catalog = fut.result()
        except Exception as exc:
            self._refused.add(target)
            why = str(exc) if isinstance(exc, RulesRefused) else f"{type(exc).__name__}: {exc}"
            log.warning("rules: refused %s, keeping %s: %s", target, self.current.version, why.splitlines()[0])
            if self.metrics is not None:
                self.metrics.refused(self.worker)
            return None
        return self._swap(catalog, pointer(self.state, self.key))

    def _swap(self, catalog: "Catalog", ptr: Pointer | None) -> "Catalog":
        was, self.current = self.current, catalog
        by = f" ({ptr.author}: {ptr.message})" if ptr is not None and (ptr.author or ptr.message) else ""
        log.info("rules: now %s, was %s%s", catalog.version, was.version, by)
        if self.metrics is not None:
            self.metrics.loaded(self.worker, catalog.version, was.version)
        return catalog

    def _read(self) -> bool:
        """Fetch what is new (non-blocking); False while the topic is not there yet."""
        if self._consumer is None:
            self._consumer = self._open()
            if self._consumer is None:
                return False
        while True:
            msgs = self._consumer.consume(num_messages=500, timeout=0.0)
            if not msgs:
                return True
            for m in msgs:
                if m.error() is None and m.key() is not None and m.value() is not None:
                    self.state[m.key().decode("utf-8", "replace")] = m.value()

    def _open(self) -> Any:
        from confluent_kafka import TopicPartition

        from . import kafka

        topic = self.cfg.topic("rules")
        c = kafka.consumer(self.cfg, group=f"{self.cfg.prefix}rules-{self.worker}-{uuid.uuid4().hex[:8]}")
        meta = c.list_topics(topic, timeout=2.0).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            c.close()
            return None
        c.assign([TopicPartition(topic, p, 0) for p in sorted(meta.partitions)])
        return c

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


_UNSET = object()

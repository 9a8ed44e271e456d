"""The few exceptions every entry point maps the same way.

``BundleError`` -> exit 2 on the CLI, 4xx on the service; ``AnalysisTimeout`` -> 504; ``RecordError`` -> the
dead-letter topic; ``CatalogError`` -> ``rules lint`` output, naming file and rule id.
"""
from __future__ import annotations


class FirstfaultError(Exception):
    """Base class: a clear, one-line reason in ``str(exc)``."""


class BundleError(FirstfaultError):
    """The evidence bundle cannot be used (no or invalid workload.json, bad archive)."""


class RecordError(FirstfaultError):
    """A streamed record cannot be decoded or validated."""


class AnalysisTimeout(FirstfaultError):
    """An analysis passed its deadline; the engine stopped between chunks (nothing kept)."""


class CatalogError(FirstfaultError):
    """The rule catalog is invalid; the message names the file and the rule id."""

    def __init__(self, file: str, rule_id: str | None, problem: str) -> None:
        self.file, self.rule_id, self.problem = file, rule_id, problem
        where = f"{file}: {rule_id}" if rule_id else file
        super().__init__(f"{where}: {problem}")

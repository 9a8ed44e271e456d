"""A catalog pattern evaluated with Python's ``re``, independently of the engine's RE2.

The catalog tests read the YAML themselves, so a semantic difference between the
two engines on a rule's examples shows up as a failure here or in ``rules test``.
``unless`` vetoes a line the regex matches (the catalog's stand-in for look-around).
"""
from __future__ import annotations

import re
from typing import Any, Mapping


class CatalogRx:
    def __init__(self, item: Mapping[str, Any]) -> None:
        flags = re.IGNORECASE if item.get("ignore_case") else 0
        self.regex = re.compile(item["regex"], flags)
        self.unless = re.compile(item["unless"], flags) if item.get("unless") else None
        self.groupindex = self.regex.groupindex

    def search(self, message: str) -> re.Match[str] | None:
        m = self.regex.search(message)
        if m is None or (self.unless is not None and self.unless.search(message)):
            return None
        return m

"""Decode the structured tail of NVLink5 Xids 144-150 (Blackwell / GB200).

A Xid 144-150 line ends in ``<token> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<intrInfo>
<errorStatus> <debug>...)``. Which recovery action applies depends on bit fields of
``intrInfo`` and on ``errorStatus``; the table lives in ``catalog/data/nvlink5.yaml``.

:func:`decode_nvlink5` is pure: the same Xid number and message text always give the
same :class:`Nvlink5Decode`.

Decoding steps
  1. Parse the tail (an optional ``pid=..., name=...,`` prefix is skipped).
  2. Pick the bit layout. V1 (drivers before R575) when ``intrInfo[4:0]`` is the value the
     catalog fixes for this Xid and ``intrInfo[9:5]`` is the V1 code of a unit the token can
     name; else V2 (R575+) when ``intrInfo[6:0]`` is the V2 code of such a unit; else the
     token alone names the unit.
  3. Pick the row: by errorStatus for most units (several set bits of a bitmask unit: the
     heaviest row among them), by ``intrInfo[25:20]`` for NETIR link-down, by unit alone for
     NETIR_INT. Promotable rows take their Action-2 value when the Action-2 bit is set.
  4. Classify with the ordered ``classification`` rules of the table; with no row, the
     line's own severity word decides.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .. import yaml_cache

DATA_DIR = Path(__file__).parent.parent / "catalog" / "data"
NVLINK5_XIDS = range(144, 151)

# "[pid=..., name=..., ]TOKEN[/TOKEN] Fatal|Nonfatal XC0 i0 Link 08 (0x... 0x... ...)"
_TAIL = re.compile(
    r"^\s*(?:pid=(?P<pid>[^,]*),\s*(?:name=(?P<pname>[^,]*),\s*)?)?"
    r"(?P<token>[A-Za-z][A-Za-z0-9_]*(?:/[A-Za-z][A-Za-z0-9_]*)?)\s+"
    r"(?P<severity>Fatal|Nonfatal|Non-fatal)\s+"
    r"XC(?P<xc>\d+)\s+i(?P<injected>\d+)\s+"
    r"Link\s+(?P<link>-?\d+)"
    r"(?:\s*\((?P<words>[^)]*)\)?)?",
    re.IGNORECASE,
)
_HEX = re.compile(r"0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class Nvlink5Decode:
    """What one Xid 144-150 line says, decoded against the catalog."""

    xid: int
    token: str                       # sub-component word as printed (e.g. NETIR_LINK_EVT)
    severity: str                    # the line's own word, normalized: Fatal | Nonfatal
    xc: int                          # cross-containment domain (XC<n>)
    injected: int                    # i<n>: non-zero means an injected error
    link: int                        # local link number, -1 when not link-specific
    intr_info: int | None
    error_status: int | None
    debug: tuple[int, ...]           # errorDebugData words
    version: str | None              # V1 | V2 | None (decided from the token alone, ambiguous)
    decided_by: str                  # bits | token | none
    unit: str | None                 # catalog unit key (e.g. NETIR_LINK_DOWN, RLW_RXPIPE)
    unit_code: int | None            # the unit field value in the chosen layout
    reason_code: int | None          # NETIR link-down reason, intrInfo[25:20]
    reason_name: str | None
    action2: bool | None             # Action-2 bit, for promotable rows only (None: layout unknown)
    known: bool                      # a catalog row was found
    combined_status: bool            # several errorStatus bits set; the heaviest row was taken
    immediate: str | None            # catalog immediate action (after Action-2 promotion)
    investigatory: str | None
    catalog_severity: str | None     # Non-fatal | Fatal | Link Fatal | ... as in the catalog
    hw_sw: str | None
    local_impact: tuple[str, ...]
    remote_impact: tuple[str, ...]
    far_end_is_source: bool
    role: str                        # root | noise
    domain: str | None
    sub_domain: str | None
    strength: str                    # strong | weak
    rule: str                        # classification rule id (or unknown_fatal / unknown_nonfatal)

    def fields(self) -> dict[str, Any]:
        """Flat, scalar fields for an event (names prefixed ``nvlink_``)."""
        out: dict[str, Any] = {
            "nvlink_token": self.token,
            "nvlink_severity": self.severity,
            "nvlink_xc": self.xc,
            "nvlink_injected": self.injected,
            "nvlink_link": self.link,
            "nvlink_intr_info": _hex(self.intr_info),
            "nvlink_error_status": _hex(self.error_status),
            "nvlink_layout": self.version,
            "nvlink_unit": self.unit,
            "nvlink_known": self.known,
            "nvlink_rule": self.rule,
        }
        if self.debug:
            out["nvlink_debug"] = " ".join(_hex(w) or "" for w in self.debug)
        if self.reason_code is not None:
            out["nvlink_reason_code"] = self.reason_code
            out["nvlink_reason_name"] = self.reason_name
        if self.action2 is not None:
            out["nvlink_action2"] = self.action2
        if self.combined_status:
            out["nvlink_combined_status"] = True
        if self.known:
            out["nvlink_catalog_severity"] = self.catalog_severity
            out["nvlink_hw_sw"] = self.hw_sw
            if self.local_impact:
                out["nvlink_local_impact"] = ",".join(self.local_impact)
            if self.remote_impact:
                out["nvlink_remote_impact"] = ",".join(self.remote_impact)
            if self.far_end_is_source:
                out["nvlink_far_end_is_source"] = True
        return out


def _hex(value: int | None) -> str | None:
    return None if value is None else f"0x{value:08x}"


def _bits(value: int, hi: int, lo: int) -> int:
    return (value >> lo) & ((1 << (hi - lo + 1)) - 1)


# ---------------------------------------------------------------- table


@dataclass(frozen=True)
class _Row:
    error_status: int | None
    reason: int | None
    reason_name: str | None
    immediate: str
    action2: str | None
    investigatory: str
    severity: str
    hw_sw: str
    local: tuple[str, ...]
    remote: tuple[str, ...]
    far_end_is_source: bool


@dataclass(frozen=True)
class _Unit:
    key: str
    xid: int
    v1_tokens: frozenset[str]
    v1_code: int
    v2_tokens: frozenset[str]
    v2_code: int
    row_key: str                      # error_status | link_down_reason | none
    status_kind: str | None           # bitmask | enum
    rows: tuple[_Row, ...]

    @property
    def tokens(self) -> frozenset[str]:
        return self.v1_tokens | self.v2_tokens


@dataclass(frozen=True)
class _Table:
    reason_field: tuple[int, int]
    v1_unit: tuple[int, int]
    v1_xid: tuple[int, int]
    v1_action2: int
    v2_unit: tuple[int, int]
    v2_action2: int
    v1_xid_field: dict[int, int]
    blocks: dict[int, str]
    v2_unit_names: dict[int, str]
    reason_names: dict[int, str]
    weight: dict[str, int]
    classification: tuple[dict[str, Any], ...]
    unknown: dict[str, dict[str, Any]]
    units: tuple[_Unit, ...]


def _field(raw: dict[str, Any]) -> tuple[int, int]:
    return int(raw["hi"]), int(raw["lo"])


@cache
def load_table(path: str | None = None) -> _Table:
    """Read ``nvlink5.yaml`` once (per path)."""
    import yaml         # at the first NVLink5 line, not at start-up

    doc = yaml_cache.load(Path(path or DATA_DIR / "nvlink5.yaml").read_bytes(),
                          lambda text: yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    lay = doc["layout"]
    units = []
    reason_names: dict[int, str] = {int(k): str(v) for k, v in (doc.get("reason_names_without_row") or {}).items()}
    for key, u in doc["units"].items():
        rows = []
        for r in u["rows"]:
            status = r.get("error_status")
            row = _Row(
                error_status=int(str(status), 16) if status is not None else None,
                reason=r.get("reason"),
                reason_name=r.get("reason_name"),
                immediate=str(r["immediate"]),
                action2=r.get("action2"),
                investigatory=str(r["investigatory"]),
                severity=str(r["severity"]),
                hw_sw=str(r["hw_sw"]),
                local=tuple(r.get("local") or ()),
                remote=tuple(r.get("remote") or ()),
                far_end_is_source=bool(r.get("far_end_is_source", False)),
            )
            if row.reason is not None and row.reason_name:
                reason_names[int(row.reason)] = row.reason_name
            rows.append(row)
        units.append(_Unit(
            key=key, xid=int(u["xid"]),
            v1_tokens=frozenset(t.upper() for t in u["v1"]["tokens"]), v1_code=int(u["v1"]["code"]),
            v2_tokens=frozenset(t.upper() for t in u["v2"]["tokens"]), v2_code=int(u["v2"]["code"]),
            row_key=str(u["row_key"]), status_kind=u.get("error_status_kind"), rows=tuple(rows),
        ))
    return _Table(
        reason_field=_field(lay["reason_field"]),
        v1_unit=_field(lay["v1"]["unit_field"]), v1_xid=_field(lay["v1"]["xid_field"]),
        v1_action2=int(lay["v1"]["action2_bit"]),
        v2_unit=_field(lay["v2"]["unit_field"]), v2_action2=int(lay["v2"]["action2_bit"]),
        v1_xid_field={int(k): int(v["v1_xid_field"]) for k, v in doc["xids"].items()},
        blocks={int(k): str(v["block"]) for k, v in doc["xids"].items()},
        v2_unit_names={int(k): str(v) for k, v in (doc.get("v2_unit_names") or {}).items()},
        reason_names=reason_names,
        weight={str(k): int(v) for k, v in doc["immediate_weight"].items()},
        classification=tuple(doc["classification"]),
        unknown={str(k): dict(v) for k, v in doc["unknown"].items()},
        units=tuple(units),
    )


# ---------------------------------------------------------------- decoding


def _parse_words(words: str | None) -> list[int]:
    return [int(w, 16) for w in _HEX.findall(words or "")]


def _choose_layout(table: _Table, xid: int, candidates: list[_Unit], intr: int | None,
                   token_parts: set[str]) -> tuple[str | None, str, list[_Unit]]:
    """(version, decided_by, units that fit) for one line."""
    if intr is not None:
        fixed = table.v1_xid_field.get(xid)
        if fixed is not None and _bits(intr, *table.v1_xid) == fixed:
            code = _bits(intr, *table.v1_unit)
            hits = [u for u in candidates if u.v1_code == code]
            if hits:
                return "V1", "bits", hits
        code = _bits(intr, *table.v2_unit)
        hits = [u for u in candidates if u.v2_code == code]
        if hits:
            return "V2", "bits", hits
    named = [u for u in candidates if token_parts & u.tokens]
    if named:
        in_v1 = any(token_parts & u.v1_tokens for u in named)
        in_v2 = any(token_parts & u.v2_tokens for u in named)
        version = "V1" if in_v1 and not in_v2 else "V2" if in_v2 and not in_v1 else None
        return version, "token", named
    return None, "none", []


def _pick_row(table: _Table, unit: _Unit, status: int | None, reason: int | None) -> tuple[_Row | None, bool]:
    """(row, combined) — ``combined`` when several bitmask bits were folded into one row."""
    if unit.row_key == "none":
        return (unit.rows[0] if unit.rows else None), False
    if unit.row_key == "link_down_reason":
        return next((r for r in unit.rows if r.reason == reason), None), False
    if status is None:
        return None, False
    exact = next((r for r in unit.rows if r.error_status == status), None)
    if exact is not None or unit.status_kind != "bitmask" or status == 0:
        return exact, False
    parts = []
    for bit in range(32):
        if status >> bit & 1:
            row = next((r for r in unit.rows if r.error_status == 1 << bit), None)
            if row is None:
                return None, False
            parts.append(row)
    if len(parts) < 2:
        return None, False
    heaviest = max(parts, key=lambda r: (table.weight.get(r.immediate, 0), r.severity == "Fatal"))
    return heaviest, True


def _rule_holds(when: dict[str, Any], immediate: str, investigatory: str, row_key: str) -> bool:
    for key, want in when.items():
        if key == "immediate":
            ok = immediate in want if isinstance(want, list) else immediate == want
        elif key == "investigatory":
            ok = investigatory in want if isinstance(want, list) else investigatory == want
        elif key == "investigatory_prefix":
            ok = investigatory.startswith(str(want))
        elif key == "row_key":
            ok = row_key == want
        else:
            raise ValueError(f"nvlink5.yaml: unknown classification condition {key!r}")
        if not ok:
            return False
    return True


def decode_nvlink5(xid: int, msg: str) -> Nvlink5Decode | None:
    """Decode the text after ``NN, `` of an NVLink5 Xid line; None when it is not that format."""
    if xid not in NVLINK5_XIDS or not msg:
        return None
    m = _TAIL.match(msg)
    if m is None:
        return None
    table = load_table()
    token = m["token"]
    severity = "Fatal" if m["severity"].lower() == "fatal" else "Nonfatal"
    words = _parse_words(m["words"])
    intr = words[0] if words else None
    status = words[1] if len(words) > 1 else None
    debug = tuple(words[2:])
    token_parts = {p.upper() for p in token.split("/")}

    of_xid = [u for u in table.units if u.xid == xid]
    named = [u for u in of_xid if token_parts & u.tokens]
    candidates = named or of_xid          # an unknown token: let the bits decide
    version, decided_by, fitting = _choose_layout(table, xid, candidates, intr, token_parts)

    reason = _bits(intr, *table.reason_field) if intr is not None else None
    unit: _Unit | None = None
    row: _Row | None = None
    combined = False
    for cand in fitting:                  # prefer a unit that has a row for this status
        got, folded = _pick_row(table, cand, status, reason)
        if got is not None:
            unit, row, combined = cand, got, folded
            break
    if unit is None and fitting:
        unit = fitting[0]

    unit_name = unit.key if unit else None
    unit_code = None
    if intr is not None and version == "V1":
        unit_code = _bits(intr, *table.v1_unit)
    elif intr is not None and version == "V2":
        unit_code = _bits(intr, *table.v2_unit)
    elif unit is None and intr is not None:
        # a V2 unit the catalog has no rows for (e.g. NETIR_THERMAL_EVENT): name it, no action
        code = _bits(intr, *table.v2_unit)
        name = table.v2_unit_names.get(code)
        if name and name.startswith(table.blocks.get(xid, "?")):
            unit_name, unit_code, version, decided_by = name, code, "V2", "bits"

    is_link_down = unit is not None and unit.row_key == "link_down_reason"
    reason_code = reason if is_link_down else None
    reason_name = table.reason_names.get(reason) if is_link_down and reason is not None else None

    action2: bool | None = None
    immediate = investigatory = None
    if row is not None:
        immediate, investigatory = row.immediate, row.investigatory
        if row.action2 is not None and intr is not None and version is not None:
            bit = table.v2_action2 if version == "V2" else table.v1_action2
            action2 = bool(intr >> bit & 1)
            if action2:
                immediate = row.action2

    tag: dict[str, Any]
    rule: str
    if row is not None:
        for item in table.classification:
            if _rule_holds(item["when"], immediate or "", investigatory or "", unit.row_key if unit else ""):
                tag, rule = dict(item["tag"]), str(item["id"])
                break
        else:
            tag, rule = dict(table.unknown[severity]), f"unknown_{severity.lower()}"
    else:
        tag, rule = dict(table.unknown[severity]), f"unknown_{severity.lower()}"

    return Nvlink5Decode(
        xid=xid, token=token, severity=severity, xc=int(m["xc"]), injected=int(m["injected"]),
        link=int(m["link"]), intr_info=intr, error_status=status, debug=debug,
        version=version, decided_by=decided_by, unit=unit_name, unit_code=unit_code,
        reason_code=reason_code, reason_name=reason_name, action2=action2,
        known=row is not None, combined_status=combined, immediate=immediate, investigatory=investigatory,
        catalog_severity=row.severity if row else None, hw_sw=row.hw_sw if row else None,
        local_impact=row.local if row else (), remote_impact=row.remote if row else (),
        far_end_is_source=row.far_end_is_source if row else False,
        role=str(tag["role"]), domain=tag.get("domain"), sub_domain=tag.get("sub_domain"),
        strength=str(tag.get("strength", "strong")), rule=rule,
    )

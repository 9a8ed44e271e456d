"""EARLY decoders for NVIDIA driver Xid lines and NVSwitch SXid lines.

``xid`` receives ``{"xid", "pci", "msg", "pid", "pname"}`` from the ``nvrm.xid`` extraction
pattern and returns a :class:`Tag` from the Xid table (``catalog/data/xid.yaml``), refined
by what the message says:

* 144-150: the NVLink5 tail is decoded (:mod:`.nvlink5`) and decides role and taxonomy;
* 74: the register words are sorted into bit classes; only "sympathetic" or "threshold"
  bits make the root weak;
* 45: ``caused by previous Xid N`` becomes ``caused_by_xid``;
* 154: the new recovery action is decoded from its hex value (``recovery_action_code``,
  ``recovery_action``, ``requests_reset``);
* a few others get the identifying detail the NVIDIA workflows ask for (Xid 13 GPC/TPC/SM,
  Xid 31 fault type, Xid 94/95 containment and reset flags, Xid 119 GSP function).

``sxid`` receives ``{"sxid", "severity", "link", "msg"}`` from NVSwitch kernel lines.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .. import yaml_cache

from . import Tag, decoder
from .nvlink5 import NVLINK5_XIDS, decode_nvlink5

DATA_DIR = Path(__file__).parent.parent / "catalog" / "data"

_UNKNOWN_PID = {"", "<unknown>", "'<unknown>'", "unknown"}
_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)", re.IGNORECASE)
_CHANNEL = re.compile(r"\b(?:Ch|Channel(?: ID)?)\s+(?:0x)?([0-9a-fA-F]{8})\b")
_RECOVERY = re.compile(
    r"recovery action changed from (0x[0-9a-fA-F]+|\d+)\s*(?:\(([^)]*)\))?\s*to\s*(0x[0-9a-fA-F]+|\d+)\s*(?:\(([^)]*)\))?",
    re.IGNORECASE)
_NVLINK74 = re.compile(r"link\s+(\d+)\s*\(([^)]*)\)", re.IGNORECASE)
_HEXWORD = re.compile(r"0x[0-9a-fA-F]+|\b\d+\b")
_GPC = re.compile(r"\(GPC (\d+), TPC (\d+), SM (\d+)\)")
_MMU_TYPE = re.compile(r"Fault is of type (\w+)")
_CONTAIN = re.compile(r"\b(Contained|Uncontained): (.+?)\. RST: (Yes|No), D-RST: (Yes|No)")
_GSP_FN = re.compile(r"Expected function (\d+) \((\w+)\)")


@dataclass(frozen=True)
class _XidTable:
    entries: Mapping[int, Mapping[str, Any]]
    unknown: Mapping[str, Any]
    reg_words: Mapping[int, Mapping[int, str]]      # word index -> bit -> class
    weak_classes: frozenset[str]
    recovery: Mapping[int, Mapping[str, Any]]
    sxid_units: Mapping[int, str]
    sxid_codes: Mapping[int, Mapping[str, Any]]


@cache
def load_xid_table(path: str | None = None) -> _XidTable:
    """Read ``xid.yaml`` once (per path)."""
    import yaml         # at the first Xid line, not at start-up

    doc = yaml_cache.load(Path(path or DATA_DIR / "xid.yaml").read_bytes(),
                          lambda text: yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    regs = doc.get("xid74_registers") or {}
    words: dict[int, dict[int, str]] = {}
    for word, classes in (regs.get("words") or {}).items():
        bits: dict[int, str] = {}
        for cls, positions in classes.items():
            for bit in positions:
                bits[int(bit)] = str(cls)
        words[int(word)] = bits
    sx = doc.get("sxid") or {}
    return _XidTable(
        entries={int(e["code"]): e for e in doc["xids"]},
        unknown=dict(doc["unknown"]),
        reg_words=words,
        weak_classes=frozenset(regs.get("weak_classes") or ()),
        recovery={int(k): v for k, v in (doc.get("recovery_actions") or {}).items()},
        sxid_units={int(k): str(v) for k, v in (sx.get("units") or {}).items()},
        sxid_codes={int(k): v for k, v in (sx.get("codes") or {}).items()},
    )


def _esc(text: Any) -> str:
    """Text placed inside an output template: braces must not look like placeholders."""
    return str(text).replace("{", "{{").replace("}", "}}")


def _int(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        return None


def _tag(base: Mapping[str, Any], fields: dict[str, Any], output: str,
         role: str | None = None, strength: str | None = None,
         domain: str | None = None, sub_domain: str | None = None) -> Tag:
    role = role or str(base["role"])
    if role == "decode":          # a decode entry whose message could not be decoded
        role = "root"
    if role == "root":
        return Tag(role="root", domain=domain or base.get("domain"), sub_domain=sub_domain or base.get("sub_domain"),
                   strength=strength or str(base.get("strength", "strong")), fields=fields, output=output)
    return Tag(role=role, fields=fields, output=output)


# ---------------------------------------------------------------- per-Xid detail


def _decode_74(msg: str, table: _XidTable) -> tuple[dict[str, Any], str]:
    """Register words of an Xid 74 -> fields and the root strength."""
    m = _NVLINK74.search(msg)
    if m is None:
        return {}, "strong"
    fields: dict[str, Any] = {"nvlink_link": int(m.group(1))}
    words = [int(w, 0) for w in _HEXWORD.findall(m.group(2))]
    found: list[str] = []
    for index, value in enumerate(words):
        fields[f"nvlink74_reg{index}"] = f"0x{value:x}"
        if value == 0:
            continue
        classes = table.reg_words.get(index)
        for bit in range(32):
            if value >> bit & 1:
                cls = classes.get(bit, "unlisted") if classes is not None else "unlisted"
                found.append(f"reg{index}.bit{bit}:{cls}")
    fields["nvlink74_bits"] = ",".join(found) if found else None
    kinds = {f.rsplit(":", 1)[1] for f in found}
    fields["nvlink74_classes"] = ",".join(sorted(kinds)) if kinds else None
    strength = "weak" if kinds and kinds <= table.weak_classes else "strong"
    return fields, strength


def _decode_154(msg: str, table: _XidTable) -> dict[str, Any]:
    m = _RECOVERY.search(msg)
    if m is None:
        return {"recovery_action_code": None, "recovery_action": None}
    new, old = _int(m.group(3)), _int(m.group(1))
    info = table.recovery.get(new) if new is not None else None
    return {
        "recovery_action_code": new,                                    # the hex value, as an int
        "recovery_action": info["name"] if info else "unknown",        # firstfault's name for it
        "recovery_action_hex": f"0x{new:x}" if new is not None else None,
        "recovery_action_text": (m.group(4) or "").strip() or None,    # the driver's own wording
        "recovery_action_from": old,
        "requests_reset": bool(info["requests_reset"]) if info else None,
    }


def _detail(xid: int, msg: str) -> dict[str, Any]:
    """Identifying detail NVIDIA's workflows ask for, where the message carries it."""
    out: dict[str, Any] = {}
    if xid == 13 and (m := _GPC.search(msg)):
        out.update(gpc=int(m.group(1)), tpc=int(m.group(2)), sm=int(m.group(3)))
    elif xid == 31 and (m := _MMU_TYPE.search(msg)):
        out["mmu_fault_type"] = m.group(1)
    elif xid in (94, 95) and (m := _CONTAIN.search(msg)):
        out.update(containment=m.group(1).lower(), contained_unit=m.group(2),
                   reset_required=m.group(3) == "Yes", drain_reset_required=m.group(4) == "Yes")
    elif xid in (119, 120) and (m := _GSP_FN.search(msg)):
        out.update(gsp_function=int(m.group(1)), gsp_function_name=m.group(2))
    if (m := _CHANNEL.search(msg)):
        out["channel"] = m.group(1).lower()
    return out


# ---------------------------------------------------------------- decoders


@decoder("xid")
def decode_xid(ev: Mapping[str, Any]) -> Tag | None:
    """An ``NVRM: Xid`` line -> role, taxonomy and decoded fields."""
    xid = _int(ev.get("xid"))
    if xid is None:
        return None
    msg = str(ev.get("msg") or "")
    table = load_xid_table()
    entry = table.entries.get(xid)
    known = entry is not None
    base = entry if known else table.unknown
    meaning = entry["meaning"] if known else "Xid not in the catalog"
    fields: dict[str, Any] = {
        "mnemonic": entry["mnemonic"] if known else None,
        "meaning": meaning,
        "immediate": entry.get("immediate") if known else None,
        "investigatory": entry.get("investigatory") if known else None,
        "known": known,
    }
    pid = ev.get("pid")
    if pid is not None and str(pid).strip() in _UNKNOWN_PID:
        fields["pid"] = None
    pname = ev.get("pname")
    if pname is not None and str(pname).strip() in _UNKNOWN_PID:
        fields["pname"] = None
    fields.update(_detail(xid, msg))
    where = "GPU[[ {gpu}]][[ of {host}]]"      # a line may name no GPU ("PCI:..." as a poster elided it)
    label = f"Xid {xid} ({_esc(meaning)})"

    if xid in NVLINK5_XIDS:
        dec = decode_nvlink5(xid, msg)
        if dec is None:
            # NVLink5 Xid without the structured tail: an NVLink fault we cannot grade
            fields["nvlink_known"] = False
            return _tag(base, fields, f"{label} on {where}: message not in the NVLink5 format",
                        role="root", domain="interconnect", sub_domain="nvlink_error", strength="weak")
        fields.update(dec.fields())
        fields["immediate"] = dec.immediate or fields["immediate"]
        fields["investigatory"] = dec.investigatory or fields["investigatory"]
        what = dec.unit or dec.token
        if dec.reason_name:
            what += f" reason {dec.reason_code} {dec.reason_name}"
        elif dec.reason_code is not None:
            what += f" reason {dec.reason_code}"
        action = f"{dec.immediate}/{dec.investigatory}" if dec.known else "not in the decode table"
        output = f"Xid {xid} NVLink5 {_esc(what)} on link {dec.link} of {where} ({dec.severity}; {action})"
        if dec.role == "root":
            return Tag(role="root", domain=dec.domain, sub_domain=dec.sub_domain, strength=dec.strength,
                       fields=fields, output=output)
        return Tag(role=dec.role, fields=fields, output=output)

    if xid == 74:
        extra, strength = _decode_74(msg, table)
        fields.update(extra)
        link = extra.get("nvlink_link")
        at = f" link {link}" if link is not None else ""
        return _tag(base, fields, f"{label} on{at} of {where}", strength=strength)

    if xid == 45:
        m = _CAUSED_BY.search(msg)
        fields["caused_by_xid"] = int(m.group(1)) if m else None
        cause = f", caused by Xid {fields['caused_by_xid']}" if m else ""
        return _tag(base, fields, f"Xid 45 (channel teardown{cause}) on {where}")

    if xid == 154:
        fields.update(_decode_154(msg, table))
        action = fields.get("recovery_action_code")
        if action is None:
            return _tag(base, fields, f"Xid 154 on {where}: recovery action changed (value not readable)")
        info = table.recovery.get(action)
        text = info["text"] if info else "an action unknown to the catalog"
        return _tag(base, fields, f"Xid 154 on {where}: recovery action now {_esc(text)} ({fields['recovery_action_hex']})")

    if not known:
        return _tag(base, fields, f"Xid {xid} (not in the catalog) on {where}")
    return _tag(base, fields, f"{label} on {where}")


@decoder("sxid")
def decode_sxid(ev: Mapping[str, Any]) -> Tag | None:
    """An NVSwitch ``SXid`` line -> fatal root, non-fatal noise, or context for detail lines."""
    sxid = _int(ev.get("sxid"))
    if sxid is None:
        return None
    table = load_xid_table()
    info = table.sxid_codes.get(sxid)
    unit = table.sxid_units.get(sxid // 1000)
    severity = (ev.get("severity") or "").strip().lower()
    link = _int(ev.get("link"))
    fields: dict[str, Any] = {
        "sxid_name": info["name"] if info else None,
        "sxid_class": info["class"] if info else None,
        "sxid_unit": unit,
        "known": info is not None,
    }
    name = f" ({_esc(info['name'])})" if info else ""
    at = f" link {link}" if link is not None else ""
    switch = ev.get("switch_pci") or ev.get("switch")
    where = (f"on NVSwitch {_esc(switch)}" if switch else "on an NVSwitch") + f"{at}[[ of {{host}}]]"
    if severity == "fatal":
        return Tag(role="root", domain="interconnect", sub_domain="nvswitch_fatal", strength="strong",
                   fields=fields, output=f"fatal SXid {sxid}{name} {where}")
    if severity in ("non-fatal", "nonfatal"):
        return Tag(role="noise", fields=fields, output=f"non-fatal SXid {sxid}{name} {where}")
    # detail lines ("Severity N Engine instance ..", "Data {..}") follow the headline line
    return Tag(role="context", fields=fields, output=f"SXid {sxid} detail {where}")

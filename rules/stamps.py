"""Timestamp shapes found in one bundle, parsed to UTC.

Pure functions. Stamps that carry no year (RFC 3164 syslog, glog ``E1102``) take
the year that puts them closest to the workload's start; stamps with no zone are
read in the workload's time zone. A stamp outside the years 1970 to 2999 (the
workload record's own bounds) is no stamp: near datetime's limits the engine's
horizon arithmetic would overflow, and no training job logged then.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone, tzinfo
from functools import lru_cache

EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(3000, 1, 1, tzinfo=timezone.utc)       # exclusive
# timedelta's own limit is 10^9 days; a kernel uptime past a century is garbage anyway.
_MAX_UPTIME_S = 100 * 366 * 86400.0

MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}

# journalctl (and any tool that formats with strftime's %b under the user's locale) writes the month
# in LC_TIME's own abbreviation: "kwi 15 07:56:59 testowy kernel: ..." on a Polish machine. These are
# glibc's `abmon` (localedata/locales/<locale>, bminor/glibc), January first (and _CJK_MONTHS below); rsyslog and syslog-ng
# write English months whatever the locale. Left out: ca_ES ("de gen.", two words) and et_EE (padded
# with spaces); hr_HR's "lip" and "srp" (June and July there, July in pl_PL and August in cs_CZ) are
# read as neither, and "lis" as November (cs_CZ, pl_PL; October in hr_HR).
_ABMON = {
    "de_DE": "Jan Feb Mär Apr Mai Jun Jul Aug Sep Okt Nov Dez",
    "fr_FR": "janv. févr. mars avril mai juin juil. août sept. oct. nov. déc.",
    "es_ES": "ene feb mar abr may jun jul ago sep oct nov dic",
    "it_IT": "gen feb mar apr mag giu lug ago set ott nov dic",
    "pt_BR": "jan fev mar abr mai jun jul ago set out nov dez",
    "nl_NL": "jan feb mrt apr mei jun jul aug sep okt nov dec",
    "sv_SE": "jan feb mar apr maj jun jul aug sep okt nov dec",
    "nb_NO": "jan. feb. mars april mai juni juli aug. sep. okt. nov. des.",
    "fi_FI": "tammi helmi maalis huhti touko kesä heinä elo syys loka marras joulu",
    "cs_CZ": "led úno bře dub kvě čen čec srp zář říj lis pro",
    "sk_SK": "jan feb mar apr máj jún júl aug sep okt nov dec",
    "pl_PL": "sty lut mar kwi maj cze lip sie wrz paź lis gru",
    "hu_HU": "jan febr márc ápr máj jún júl aug szept okt nov dec",
    "ro_RO": "ian feb mar apr mai iun iul aug sep oct nov dec",
    "tr_TR": "Oca Şub Mar Nis May Haz Tem Ağu Eyl Eki Kas Ara",
    "ru_RU": "янв фев мар апр мая июн июл авг сен окт ноя дек",
    "uk_UA": "січ лют бер кві тра чер лип сер вер жов лис гру",
    "hr_HR": "sij velj ožu tra svi lip srp kol ruj lis stu pro",
    "sl_SI": "jan feb mar apr maj jun jul avg sep okt nov dec",
    "lt_LT": "saus. vas. kov. bal. geg. birž. liep. rugp. rugs. spal. lapkr. gruod.",
    "lv_LV": "jan feb mar apr mai jūn jūl aug sep okt nov dec",
}
_AMBIGUOUS = {"lip", "srp"}
# zh_CN, zh_TW, ja_JP and ko_KR write the month's number and the word for month: "4月 20 19:55:29
# Reverier-Arch kernel: ..." (glibc's abmon "4<U6708>"; ja_JP and ko_KR pad it to two characters with a
# space, " 4月", " 4월", which rules/prefixes.py's shape allows).
_CJK_MONTHS = {f"{month}{word}": month for month in range(1, 13) for word in ("月", "월")}


def _local_months() -> dict[str, int]:
    out: dict[str, int] = {}
    for locale, names in sorted(_ABMON.items()):
        for month, name in enumerate(names.split(), start=1):
            key = name.lower()
            if key in _AMBIGUOUS or (locale == "hr_HR" and key == "lis"):
                continue
            out.setdefault(key, month)
    return out


# lower-cased abbreviation -> month (English's too, lower-cased: journalctl's "jan" under sv_SE)
LOCAL_MONTHS = {**_local_months(), **_CJK_MONTHS, **{m.lower(): i for m, i in MONTHS.items()}}


@lru_cache(maxsize=4096)
def _year_for(month: int, day: int, zone: tzinfo, anchor: datetime) -> int | None:
    """The year that puts (month, day) nearest ``anchor`` (noon of that day is close enough)."""
    best: tuple[timedelta, int] | None = None
    for year in (anchor.year - 1, anchor.year, anchor.year + 1):
        try:
            utc = datetime(year, month, day, 12, tzinfo=zone).astimezone(timezone.utc)
        except ValueError:          # Feb 29 in a non-leap year
            continue
        gap = abs(utc - anchor)
        if best is None or gap < best[0]:
            best = (gap, year)
    return None if best is None else best[1]


def with_year(month: int, day: int, hh: int, mm: int, ss: int, micro: int,
              zone: tzinfo, anchor: datetime) -> datetime | None:
    """Build a UTC datetime for a year-less stamp, choosing the year nearest ``anchor``."""
    year = _year_for(month, day, zone, anchor)
    if year is None:
        return None
    try:
        return plausible(datetime(year, month, day, hh, mm, ss, micro, tzinfo=zone).astimezone(timezone.utc))
    except (ValueError, OverflowError):
        return None


def plausible(value: datetime | None) -> datetime | None:
    """``value`` if it falls in the supported years, else None (an aware UTC datetime in, out)."""
    return value if value is not None and EARLIEST <= value < LATEST else None


def micro_of(frac: str | None) -> int:
    """'044871' or '510486595' or '123' -> microseconds."""
    if not frac:
        return 0
    return int((frac + "000000")[:6])


def parse_iso(text: str, zone: tzinfo) -> datetime | None:
    """ISO-8601 with optional fraction (``.`` or ``,``), optional ``T`` and optional zone."""
    t = text.strip().replace(",", ".").replace("_", "T")
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    if len(t) > 10 and t[10] == " ":
        t = t[:10] + "T" + t[11:]
    # Python's fromisoformat takes at most 6 fraction digits.
    head, dot, rest = t.partition(".")
    if dot:
        digits = ""
        i = 0
        while i < len(rest) and rest[i].isdigit():
            digits += rest[i]
            i += 1
        t = head + "." + (digits + "000000")[:6] + rest[i:]
    try:
        value = datetime.fromisoformat(t)
        if value.tzinfo is None:
            value = value.replace(tzinfo=zone)
        # 9999-12-31T23:00-05:00 is past datetime.max in UTC: OverflowError, not a stamp.
        return plausible(value.astimezone(timezone.utc))
    except (ValueError, OverflowError):
        return None


_RFC1123Z = re.compile(r"(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), )?(\d{1,2}) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
                       r"(\d{4}) (\d\d):(\d\d):(\d\d) ([+-])(\d\d)(\d\d)$")


def parse_rfc1123z(text: str) -> datetime | None:
    """Go's time.RFC1123Z, as kubectl describe prints every time ('Fri, 15 Sep 2023 09:56:17 +0200'),
    in UTC; None for anything else."""
    m = _RFC1123Z.match(text.strip())
    if m is None:
        return None
    day, mon, year, hh, mi, ss, sign, oh, om = m.groups()
    try:
        zone = timezone((-1 if sign == "-" else 1) * timedelta(hours=int(oh), minutes=int(om)))
        return plausible(datetime(int(year), MONTHS[mon], int(day), int(hh), int(mi), int(ss), tzinfo=zone)
                         .astimezone(timezone.utc))
    except (ValueError, OverflowError):
        return None


def from_uptime(boot: datetime | None, seconds: float) -> datetime | None:
    if boot is None or not 0 <= seconds <= _MAX_UPTIME_S:     # also refuses NaN
        return None
    try:
        return plausible(boot + timedelta(seconds=seconds))
    except OverflowError:
        return None


def iso_z(value: datetime | None) -> str | None:
    """The one stamp format in every output: UTC, microseconds, ``Z``."""
    if value is None:
        return None
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

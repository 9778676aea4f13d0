"""A log line's text: colour codes and redraws out, timestamps, sizes and loader figures read.

No I/O, no classes of lines: what ``exporter.core.classify`` needs to read a line before it
decides what the line means.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Final

from exporter.base.linear import present, screen_of
from exporter.base.model import LogClass, LogEvent
from exporter.engines import vocabulary

#: Longest text an event carries; a longer line is cut (engines print megabyte-long args).
MAX_LINE_CHARS: Final = 8192
#: Patterns look at the start of a line only: what they seek comes first, and a regex over
#: a kilobytes-long argument dump costs tens of milliseconds.
MATCH_CHARS: Final = 2048
#: A yearless stamp this far past the read time belongs to the previous year.
FUTURE_SLACK_SECONDS: Final = 2 * 86400

# Raw ESC sequences, and the same rendered as text by CloudWatch (tgi-06-other "#033[2m").
# The raw ones alone, one literal first: half the cost on a coloured line (most of them).
_ESCAPES = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-B])")
_ANSI = re.compile(rf"{_ESCAPES.pattern}|#033\[[0-9;]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# tqdm's "[elapsed<remaining, rate]": what follows it was glued on by a later write.
TQDM_STATS = re.compile(r"\[(?:\d+:)?\d+:\d+<(?:(?:\d+:)?\d+:\d+|\?)(?:,[^\]\[]*)?\]")


def clean(text: str) -> str:
    """Strip ANSI colour codes (raw and ``#033[`` text), control characters and the newline.

    The result is what every pattern is matched against.
    """
    # One regex pass where one does: a search costs more than the scans that spare it.
    if "#033[" in text:
        return _CONTROL.sub("", _ANSI.sub("", text.rstrip("\n")))
    if text.isprintable():
        return text  # nothing to strip (most lines)
    if "\x1b" in text:  # colour codes: once they are out, most such lines hold nothing else
        text = _ESCAPES.sub("", text.rstrip("\n"))
        return text if text.isprintable() else _CONTROL.sub("", text)
    if _CONTROL.search(text) is None and not text.endswith("\n"):
        return text  # a tab is kept
    return _CONTROL.sub("", text.rstrip("\n"))  # redraws' carriage returns, a bell


def is_redraw(text: str) -> bool:
    """A tqdm bar update that ends with its ``[elapsed<remaining]`` (nothing glued after)."""
    if not text.endswith("]"):
        return False
    m = TQDM_STATS.search(text)
    return m is not None and m.end() == len(text)


def split_updates(line: str) -> list[str]:
    r"""Split one physical line into the updates it holds.

    tqdm redraws with ``\r`` (journald shows many updates on one line), and a later log
    line is often glued straight after a bar's ``[elapsed<remaining]`` (sglang-04-ready).
    """
    if "\r" not in line and "<" not in line:  # one piece: no redraw, no bar's stats
        return [line.rstrip("\n")] if line and not line.isspace() else []
    pieces: list[str] = []
    for segment in line.rstrip("\n").split("\r"):
        while (m := TQDM_STATS.search(segment)) and segment[m.end() :].strip():
            pieces.append(segment[: m.end()])
            segment = segment[m.end() :]
        pieces.append(segment)
    return [p for p in pieces if p.strip()]


# --- timestamps ----------------------------------------------------------------------------
_TS_WINDOW: Final = 160
# sglang "[2026-08-01 23:37:38]", TGI "2023-08-17T15:28:43.904106Z", TF/flashinfer, wget.
_TS_ISO = re.compile(
    r"(?<!\d)(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T ](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
    r"(?:[.,](?P<f>\d{1,6})\d*)?(?P<tz>Z|[+-]\d\d:?\d\d)?"
)
# TensorRT-LLM "[12/20/2025-04:20:04]".
_TS_TRT = re.compile(
    r"(?<!\d)(?P<mo>\d\d)/(?P<d>\d\d)/(?P<y>\d{4})-(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
)
# vLLM "INFO 05-12 02:45:10" (no year).
_TS_VLLM = re.compile(
    r"\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+(?P<mo>\d\d)-(?P<d>\d\d) "
    r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
)
# glog (Triton, TensorFlow) "I0420 12:34:56.123456" (no year).
_TS_GLOG = re.compile(
    r"(?:^|\s)[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.(?P<f>\d{6})\b"
)
_TS_FORMATS: Final = (_TS_ISO, _TS_TRT, _TS_VLLM, _TS_GLOG)
#: Which formats can occur in a line, in one linear scan: ``re`` then runs only those. RE2
#: has no look-behind: the screen reads the formats without it, a little more widely.
TIMESTAMP_SCREEN: Final = tuple(f.pattern.removeprefix(r"(?<!\d)") for f in _TS_FORMATS)
_TS_SCREEN: Final = screen_of(TIMESTAMP_SCREEN)


def _tzinfo(tz: str | None) -> timezone | None:
    if not tz:
        return None
    if tz == "Z":
        return UTC
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


#: Years whose zone changes all fall on whole minutes of local time (older ones, such as
#: local mean time's, may not): a minute's start then tells every second of it.
_WHOLE_MINUTE_ZONES_FROM: Final = 1980


@functools.lru_cache(maxsize=1024)
def _minute_start(
    year: int, month: str, day: str, hour: str, minute: str, zone: str | None, tz: tzinfo
) -> int | None:
    """Unix seconds at the start of one local minute (its digits as printed); None for none.

    A log's lines share their minutes: the zone's offset is looked up once a minute, not once
    a line. ``zone`` is the stamp's own ("Z", "+02:00"), else ``tz`` applies.
    """
    try:
        stamp = datetime(year, int(month), int(day), int(hour), int(minute))
        return round(stamp.replace(tzinfo=_tzinfo(zone) or tz).timestamp())
    except ValueError:  # glog's "E0000 00:00:..." carries no date at all
        return None


def _seconds(g: dict[str, str | None], year: int, tz: tzinfo) -> float | None:
    """A timestamp's groups as Unix seconds (``datetime.timestamp``'s value), or None."""
    fraction = g.get("f")
    second, micro = int(g["s"] or 0), int(fraction.ljust(6, "0")) if fraction else 0
    if year < _WHOLE_MINUTE_ZONES_FROM:
        try:
            month, day, hour, minute = (int(g[k] or 0) for k in ("mo", "d", "h", "mi"))
            zone = _tzinfo(g.get("tz")) or tz
            return datetime(year, month, day, hour, minute, second, micro, zone).timestamp()
        except ValueError:
            return None
    start = _minute_start(
        year, g["mo"] or "", g["d"] or "", g["h"] or "", g["mi"] or "", g.get("tz"), tz
    )
    if start is None or second > 59:  # datetime takes no leap second
        return None
    return ((start + second) * 1_000_000 + micro) / 1_000_000  # as timestamp() divides


def parse_timestamp(
    text: str, *, default_year: int, tz: tzinfo = UTC, screened: Iterable[int] | None = None
) -> tuple[float, int | None] | None:
    """The earliest timestamp near the start of a cleaned line, as Unix seconds.

    Timestamps without a zone are in ``tz``, the zone engines print them in (the host's, as
    the shell passes it in). Formats without a year (vLLM, glog) take ``default_year``.

    Args:
        text: the cleaned line.
        default_year: the year of a stamp that prints none.
        tz: the zone of a stamp that prints none.
        screened: the indices of ``TIMESTAMP_SCREEN`` a screen found in the line (or in
            more of it), when the caller scanned it already; None to scan here.

    Returns:
        (seconds, year printed in the line or None), or None when the line has no timestamp.
    """
    head = text[:_TS_WINDOW]
    if screened is None and _TS_SCREEN is not None:
        screened = _TS_SCREEN.Match(head.encode("utf-8", "surrogatepass")) or ()
    formats: Iterable[re.Pattern[str]] = _TS_FORMATS
    if screened is not None:
        formats = [_TS_FORMATS[i] for i in sorted(screened)]
        if not formats:
            return None
    found = [m for m in (f.search(head) for f in formats) if m]
    if len(found) > 1:
        found.sort(key=lambda m: m.start())  # stable: the formats' order on a tie
    for m in found:
        parsed = _stamp_value(m.group(), m.re, default_year, tz)
        if parsed is not None:
            return parsed
    return None


@functools.lru_cache(maxsize=4096)
def _stamp_value(
    stamp: str, fmt: re.Pattern[str], default_year: int, tz: tzinfo
) -> tuple[float, int | None] | None:
    """(Unix seconds, year printed or None) of one stamp ``fmt`` found, or None for no date.

    Remembered by its text, format, default year and zone, a value's whole input: a log's
    lines share their seconds (a rank's lines, a bar's redraws).
    """
    m = fmt.match(stamp)  # the search's own match: the same groups
    if m is None:
        return None
    g = m.groupdict()
    year = int(g["y"]) if g.get("y") else None
    seconds = _seconds(g, year or default_year, tz)
    return None if seconds is None else (seconds, year)


def one_year_earlier(when: float, tz: tzinfo) -> float:
    """The same wall time a year before (a yearless December stamp read in January)."""
    stamp = datetime.fromtimestamp(when, tz)
    try:
        return stamp.replace(year=stamp.year - 1).timestamp()
    except ValueError:  # 29 February
        return (stamp - timedelta(days=365)).timestamp()


def count_value(value: str) -> int:
    """A progress bar's count: "12", "1.5K", "3M"."""
    scale = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(value[-1:].upper(), 1.0)
    number = value[:-1] if scale != 1.0 else value
    return int(float(number) * scale)


_LOADER_SCREEN: Final = screen_of(regex.pattern for regex, _ in vocabulary.LOADERS)
_UNIT_POWERS: Final = {"K": 1, "M": 2, "G": 3, "T": 4}
_SIZE: Final = re.compile(r"([\d.]+) ?([KMGT])(i?)", re.IGNORECASE)


def _names_loader(text: str) -> bool:
    """Whether ``text`` names a fast loader (one linear scan for all of them)."""
    if _LOADER_SCREEN is None:
        return any(regex.search(text) for regex, _ in vocabulary.LOADERS)
    return bool(present(_LOADER_SCREEN, text))


def with_loader(event: LogEvent, named: bool | None = None) -> LogEvent:
    """The event with the fast loader its line names, and the throughput it reports.

    ``named``: whether a screen of the event's whole text found a loader's name in it, when
    the caller scanned it already; None to scan here.
    """
    if event.cls in (LogClass.FATAL, LogClass.ERROR):
        return event
    if not (_names_loader(event.text) if named is None else named):
        return event
    name = next(n for regex, n in vocabulary.LOADERS if regex.search(event.text))
    return replace(event, loader=name, loader_bytes_per_second=_summary_rate(event.text))


def _summary_rate(text: str) -> float | None:
    """Bytes per second from "34.3 GiB ... 28.52s, 1.2 GiB/s" (the rate, else size/seconds)."""
    m = vocabulary.LOADER_SUMMARY.search(text)
    if m is None:
        return None
    if m.group("rate"):
        return _size_bytes(m.group("rate"))
    seconds = float(m.group("seconds"))
    return _size_bytes(m.group("size")) / seconds if seconds > 0 else None


def _size_bytes(size: str) -> float:
    """Bytes in "34.3 GiB": binary with an i, decimal without, as the line wrote it."""
    m = _SIZE.match(size)
    if m is None:  # LOADER_SUMMARY's groups always have this shape
        return 0.0
    base = 1024.0 if m.group(3) else 1000.0
    power: int = _UNIT_POWERS[m.group(2).upper()]
    return float(m.group(1)) * base**power

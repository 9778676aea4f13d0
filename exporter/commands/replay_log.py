"""The ``replay-log`` subcommand: run a saved engine log through the classifier and lifecycle.

Reads one file and prints; it owns no lifecycle logic (``exporter.core.lifecycle.step`` decides)
and never watches anything live.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Final, NamedTuple

from exporter.base.controls import escape_controls
from exporter.base.linear import cased
from exporter.base.localzone import local_utc_offset_seconds, local_zone
from exporter.base.model import FailureReason, LogClass, LogEvent, Observation, Phase, ProcessSample
from exporter.core.classify import LogClassifier, Screen, clean, screen_of
from exporter.core.lifecycle import Thresholds, initial_state, step
from exporter.core.logblock import BlockScreen
from exporter.engines import ENGINES
from exporter.engines.profile import LogProfile

#: Lines looked at to recognise the engine.
DETECT_LINES: Final = 5000
#: Progress keys that stand for the main model's weights, most telling first.
_WEIGHT_KEYS: Final = ("shards", "weights")
_TARGET: Final = "replay"
#: ``--engine generic``: every engine profile off, the shared vocabulary alone.
GENERIC: Final = "generic"
#: The profile used when the engine is not recognised: every profile's fatal and ready lines.
FALLBACK: Final = "openai"

EPILOG: Final = """The file is read as bytes and split on newlines only, so progress bars redrawn
with carriage returns count as updates of one line. Leading lines starting with "# " are
comments. Timestamps come from the lines (local time when they carry no zone); a line without
one takes the time of the line before it. Readiness comes from the engine's ready line, as no
probe runs. "at" in --json output is Unix seconds, or null for a line without a timestamp.

engine: auto (default) recognises it from the lines and, when nothing names it, uses the
shared vocabulary plus every profile's fatal and ready lines ("unknown"); generic switches
every engine profile off (the shared vocabulary alone); a name uses that engine's profile.

outcome: ready (the ready line was reached, even if the server stopped later), failed (a fatal
line ended the start; reason oom, nccl, crash, ...) or incomplete (neither: a hang, an
external kill, an excerpt).

exit codes:
  0  the file was replayed (whatever its outcome)
  2  usage error, or the file cannot be read
"""


@dataclass(frozen=True, slots=True)
class PhaseChange:
    """The lifecycle entered ``phase`` at line ``line`` (timestamp ``at`` if it had one)."""

    phase: Phase
    line: int
    at: float | None


@dataclass(frozen=True, slots=True)
class LogReplay:
    """What replaying one log concluded.

    Attributes:
        engine: the profile applied ("generic" for none, "openai" when unknown).
        engine_source: "given", "detected" (at ``engine_line``) or "unknown".
        engine_line: the line that named the engine, when detected.
        reason_detail: the decisive fatal line with its line number, when failed.
    """

    engine: str
    engine_source: str
    engine_line: int | None
    outcome: str
    reason: FailureReason | None
    reason_detail: str | None
    phases: tuple[PhaseChange, ...]
    progress: tuple[str, int, int] | None
    classes: dict[LogClass, int]


class _Line(NamedTuple):
    """A line that made events: its number, its events, its timestamp (a tuple: one a line)."""

    number: int
    events: tuple[LogEvent, ...]
    at: float | None


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add ``replay-log``'s arguments."""
    parser.add_argument(
        "--engine",
        default="auto",
        choices=[*ENGINES, "auto", GENERIC],
        help="engine whose log profile applies; auto recognises it from the lines (default); "
        "generic applies the shared vocabulary only",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("file", help="log file to replay")
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    """Replay ``args.file`` and print the timeline, outcome and reason."""
    try:
        lines = read_lines(Path(args.file))
    except OSError as exc:
        print(f"{args.file}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return 2
    result = replay(lines, None if args.engine == "auto" else args.engine)
    if args.json:
        print(json.dumps(to_json(result)))
    else:
        print(render_text(result))
    return 0


def read_lines(path: Path) -> list[tuple[int, str]]:
    r"""Numbered lines of a file split on ``\n`` only, leading ``# `` comments left out."""
    raw = path.read_bytes().split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    lines = [(n, b.decode("utf-8", errors="replace")) for n, b in enumerate(raw, 1)]
    while lines and lines[0][1].startswith("# "):
        lines.pop(0)
    return lines


def detect_engine(lines: Iterable[str]) -> str | None:
    """The engine whose tell-tale lines are most frequent, or None when none match."""
    found = detect_engine_at(enumerate(lines, 1))
    return found[0] if found else None


def detect_engine_at(lines: Iterable[tuple[int, str]]) -> tuple[str, int] | None:
    """The engine the early lines name and the number of the first line that named it.

    The most frequently named engine wins, unless another named engine embeds it (Ollama's
    log carries llama.cpp's loader lines, Triton's its backend's).
    """
    head = list(itertools.islice(lines, DETECT_LINES))
    match = _detect_screen()[1]
    named = _named_in_block(head)
    if named is not None and len(named) <= 1:
        # One engine, or none, can be named: the first line naming it is all there is to find.
        search = None if match is None else match.Match
        hit = next((n for n, line in head if named & set(_names_in(line, search))), None)
        return None if hit is None else (next(iter(named)), hit)
    scores: Counter[str] = Counter()
    first: dict[str, int] = {}
    for number, line in head:
        for name in _names_in(line, None if match is None else match.Match):
            scores[name] += 1
            first.setdefault(name, number)
    if not scores:
        return None
    best = scores.most_common(1)[0][0]
    host = next((n for n in scores if best in ENGINES[n].embeds), None)
    name = host or best
    return name, first[name]


def _named_in_block(lines: Sequence[tuple[int, str]]) -> set[str] | None:
    """The engines some of ``lines`` may name, from one scan of them all; None: unknown.

    A screen: a pattern that reads across a line end names an engine no line does (the
    caller then finds no line naming it), never the other way round.
    """
    names, screen = _detect_screen(block=True)
    if screen is None:
        return None
    text = "\n".join(clean(line) for _, line in lines)
    hits = screen.Match(text.encode("utf-8", "surrogatepass"))
    return {names[h] for h in hits or ()}


def _names_in(line: str, match: Callable[[bytes], list[int] | None] | None) -> Iterable[str]:
    """The engines whose tell-tale patterns ``line`` holds (cleaned), in the patterns' order.

    ``match``: the detect screen's search (``_detect_screen``); None when it did not compile.
    """
    text = clean(line)
    if match is None:
        names = dict.fromkeys(_detect_screen()[0])
        return [n for n in names if any(p.search(text) for p in ENGINES[n].log.detect)]
    hits = match(text.encode("utf-8", "surrogatepass"))
    if not hits:
        return ()
    found = _engines_of(tuple(sorted(hits)))
    # The screen reads each pattern with its own case: on ASCII text its hit is the verdict.
    if text.isascii():
        return found
    return [n for n in found if any(p.search(text) for p in ENGINES[n].log.detect)]


@functools.lru_cache(maxsize=256)
def _engines_of(hits: tuple[int, ...]) -> tuple[str, ...]:
    """The engines of the detect screen's sorted ``hits``, each once, in their order."""
    names = _detect_screen()[0]
    return tuple(dict.fromkeys(names[h] for h in hits))


def _detect_patterns() -> list[tuple[str, re.Pattern[str]]]:
    return [(n, p) for n, e in ENGINES.items() for p in e.log.detect]


@functools.cache
def _detect_screen(*, block: bool = False) -> tuple[tuple[str, ...], Screen | None]:
    """Every engine's tell-tale patterns in one RE2 set, and the engine of each.

    ``block``: for a text of many lines, ``^`` matching at each line's start.
    """
    pairs = [(n, cased(p)) for n, p in _detect_patterns()]
    flags = "(?m)" if block else ""
    return tuple(n for n, _ in pairs), screen_of(f"{flags}{p}" for _, p in pairs)


def _profile(name: str) -> LogProfile:
    return LogProfile() if name == GENERIC else ENGINES[name].log


def replay(
    lines: Sequence[tuple[int, str]], engine: str | None, *, reference: float = 0.0
) -> LogReplay:
    r"""Run numbered lines through the classifier and ``lifecycle.step`` as if they were live.

    Args:
        lines: (line number, raw text) pairs, ``\r`` kept.
        engine: engine name, "generic" for the shared vocabulary alone, or None to
            recognise it (falling back to every profile's fatal and ready lines).
        reference: the time yearless timestamps are read relative to (default: now).
    """
    source, line_no = "given", None
    if engine is None:
        found = detect_engine_at(lines)
        engine, source = (found[0], "detected") if found else (FALLBACK, "unknown")
        line_no = found[1] if found else None
    classified, plain = _classify_counted(
        lines, _profile(engine), reference or datetime.now().timestamp()
    )
    start = next((ln.at for ln in classified if ln.at is not None), 0.0)
    process = ProcessSample(
        pid=1, create_time=start, pids=(1,), rss_bytes=0, cpu_seconds=0.0, read_bytes=None
    )
    state, now = initial_state(_TARGET), start
    thresholds = Thresholds(utc_offset_seconds=local_utc_offset_seconds())
    phases: list[PhaseChange] = []
    held: list[LogEvent] = []
    for i, ln in enumerate(classified):
        now = max(now, ln.at or now)
        if i and i < len(classified) - 1 and not any(_decisive(e, state.phase) for e in ln.events):
            held += ln.events  # it moves no phase: it goes with the next step, as in a tick
            continue
        events, held = (*held, *ln.events), []
        obs = Observation(target=_TARGET, at=now, process=process, log_events=events)
        before, state = state.phase, step(state, obs, now, thresholds)
        if state.phase is not before:
            phases.append(PhaseChange(state.phase, ln.number, ln.at))
    outcome = _outcome(phases)
    failed = outcome == "failed"
    return LogReplay(
        engine=engine,
        engine_source=source,
        engine_line=line_no,
        outcome=outcome,
        reason=state.failure_reason if failed else None,
        reason_detail=state.reason_detail if failed else None,
        phases=tuple(phases),
        progress=_weights_progress(e for ln in classified for e in ln.events),
        classes=_count_classes((e for ln in classified for e in ln.events), plain),
    )


def _classify(
    lines: Sequence[tuple[int, str]], profile: LogProfile, reference: float
) -> list[_Line]:
    """The lines that are events (``_classify_counted``)."""
    return _classify_counted(lines, profile, reference)[0]


def _classify_counted(
    lines: Sequence[tuple[int, str]], profile: LogProfile, reference: float
) -> tuple[list[_Line], Counter[LogClass]]:
    """Classify every line; a line without a timestamp takes the previous line's.

    A line no pattern can match (``LogClassifier.plain``) is only counted: it moves no
    phase, and its timestamp is not read.
    """
    classifier = LogClassifier(profile, tz=local_zone())
    out: list[_Line] = []
    plain: Counter[LogClass] = Counter()
    last: float | None = None
    for number, text in _flagged(classifier, lines, plain, lambda: bool(out)):
        # The first line is the first step (the start begins there), whatever it says.
        if out and (cls := classifier.plain(text)) is not None:
            plain[cls] += 1
            continue
        # Before the first timestamp, ``reference`` only anchors yearless stamps (vLLM).
        # Its redraws that match nothing are counted, as a tick counts them (one record each).
        at = reference if last is None else last
        events = classifier.classify(text, at=at, line_no=number, counts=plain if out else None)
        last = classifier.last_timestamp or last
        if events:
            out.append(_Line(number, tuple(events), classifier.last_timestamp))
    if (ended := classifier.finish()) and lines:
        out.append(_Line(lines[-1][0], tuple(ended), None))
    first = next((ln.at for ln in out if ln.at is not None), 0.0)
    head = next((i for i, ln in enumerate(out) if ln.at is not None), len(out))
    for i in range(head):  # lines before the first timestamp happened at (or before) it
        out[i] = out[i]._replace(events=tuple(replace(e, at=first) for e in out[i].events))
    return out, plain


def _flagged(
    classifier: LogClassifier,
    lines: Sequence[tuple[int, str]],
    plain: Counter[LogClass],
    started: Callable[[], bool],
) -> Iterator[tuple[int, str]]:
    """The first line, then the lines the classifier's block screen flags; the rest counted.

    As the daemon reads a file: the lines after the first go through the screen as one
    block, so a replay of a serving log costs a scan, not a classifier call a line. Up to
    its first request access line, a log is a start-up's (most of its lines are flagged,
    and a search a line costs more than the line's own check): those lines go one by one
    once ``started`` (the caller has its first event), each checked by ``plain``.
    """
    screen, rest = classifier.block, lines[1:]
    consecutive = all(b[0] == a[0] + 1 for a, b in zip(lines, rest, strict=False))
    yield from lines[:1]
    if screen is None or not consecutive:
        yield from rest
        return
    data = "".join(f"{text}\n" for _, text in rest).encode("utf-8", "surrogatepass")
    # Up to its first request line, a log is a start-up's: read line by line.
    access = next(screen.access_runs(data, 0, len(data)), None)
    before = len(rest) if access is None else data.count(b"\n", 0, access[0])
    at = 0
    while at < before and not started():
        line_no, text = rest[at]
        at += 1
        if _flags(screen, text):
            yield line_no, text
        else:
            plain[LogClass.INFO] += 1  # no access line before it: a plain line is info
    yield from rest[at:before]
    if access is None:
        return
    data = data[access[0] :]

    def count(start: int, stop: int) -> None:
        info, benign = screen.plain_counts(data, start, stop)
        plain.update({LogClass.INFO: info, LogClass.BENIGN: benign})

    first = rest[before][0]
    tracing = lambda: classifier.in_traceback  # noqa: E731 (read at each line)
    for text, number, _ in screen.walk(data, first, tracing, count, redraws=False):
        yield (first if number is None else number), text


def _flags(screen: BlockScreen, text: str) -> bool:
    """Whether the block screen flags one line."""
    line = f"{text}\n".encode("utf-8", "surrogatepass")
    return screen.next_flagged(line, 0, len(line)) is not None


def _decisive(event: LogEvent, phase: Phase) -> bool:
    """An event that can move the phase: another phase's marker or bar, a fatal line.

    A bar redrawn in the phase it belongs to moves nothing: its lines go with the next step,
    as a tick's would (a bar logs a line an update: most of a start-up log's events).
    """
    if event.cls is LogClass.FATAL:
        return True
    if event.phase is not None:
        return event.phase is not phase
    return event.progress is not None


def _outcome(phases: Sequence[PhaseChange]) -> str:
    """Ready if it ever got there, unless it failed after the log alone announced it."""
    seen = {p.phase for p in phases}
    if phases and phases[-1].phase is Phase.FAILED and Phase.SERVING not in seen:
        return "failed"
    if seen & {Phase.READY, Phase.SERVING}:
        return "ready"
    return "failed" if Phase.FAILED in seen else "incomplete"


def _weights_progress(events: Iterable[LogEvent]) -> tuple[str, int, int] | None:
    """Furthest (done, total) of the main model's weights bar; ranks repeat the same bar."""
    best: dict[str, tuple[int, int]] = {}
    for e in events:
        if e.progress is None or e.progress_key not in _WEIGHT_KEYS:
            continue
        old = best.get(e.progress_key)
        if old is None or e.progress[1] != old[1] or e.progress[0] > old[0]:
            best[e.progress_key] = e.progress
    key = next((k for k in _WEIGHT_KEYS if k in best), None)
    return (key, *best[key]) if key else None


def _count_classes(events: Iterable[LogEvent], plain: Counter[LogClass]) -> dict[LogClass, int]:
    counts = Counter(e.cls for e in events) + plain
    return {cls: counts.get(cls, 0) for cls in LogClass}


def to_json(result: LogReplay) -> dict[str, object]:
    """The ``--json`` object: engine and source, outcome, reason and detail, phases, etc."""
    progress = None
    if result.progress is not None:
        progress = {"done": result.progress[1], "total": result.progress[2]}
    return {
        "engine": result.engine,
        "engine_source": result.engine_source,
        "engine_line": result.engine_line,
        "outcome": result.outcome,
        "reason": str(result.reason) if result.reason else None,
        "reason_detail": result.reason_detail,
        "phases": [{"phase": str(p.phase), "line": p.line, "at": p.at} for p in result.phases],
        "progress": progress,
        "classes": {str(cls): n for cls, n in result.classes.items()},
    }


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at).isoformat(sep=" ", timespec="seconds") if at else "-"


def _engine_source(result: LogReplay) -> str:
    if result.engine_source == "detected":
        return f"detected at line {result.engine_line}"
    if result.engine_source == "unknown":
        return "unknown: shared vocabulary and every profile's fatal and ready lines"
    if result.engine == GENERIC:
        return "given: shared vocabulary only"
    return "given"


def render_text(result: LogReplay) -> str:
    """The human-readable report: engine, phase timeline, progress, outcome, line classes."""
    out = [f"engine    {result.engine} ({_engine_source(result)})", ""]
    out += ["   line  time                 phase"]
    out += [f"{p.line:7}  {_when(p.at):19}  {p.phase}" for p in result.phases]
    if result.progress:
        key, done, total = result.progress
        out += ["", f"progress  {done}/{total} {key}"]
    out += [
        "",
        f"outcome   {result.outcome}",
        f"reason    {result.reason or '-'}",
        *([f"detail    {escape_controls(result.reason_detail)}"] if result.reason_detail else []),
        "lines     " + ", ".join(f"{cls} {n}" for cls, n in result.classes.items()),
    ]
    return "\n".join(out)

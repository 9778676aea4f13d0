"""Classify engine log lines: ANSI and secrets out, timestamps parsed, each line given a class.

No I/O: sources hand lines in, ``LogEvent``s come out. The patterns live in the engine
profiles (``exporter.engines``) and the cross-engine vocabulary under them
(``exporter.engines.vocabulary``); this module only applies them, in layers: the operator's
patterns, then the engine's profile, then the shared vocabulary.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import Final

from exporter.base.linear import present
from exporter.base.model import FailureReason, LogClass, LogEvent
from exporter.base.redact import redact
from exporter.core.failure import (
    EXCEPTION,
    FRAME,
    NOT_A_CRASH,
    TOP_FRAME,
    TRACEBACK_BODY,
    TRACEBACK_HEAD,
    OpenTraceback,
    infer_reason,
    reason_detail,
    stronger,
)
from exporter.core.layers import layers_of
from exporter.core.logblock import BlockScreen
from exporter.core.loglevel import INFO, WARNING, level_class, line_level
from exporter.core.logtext import (
    FUTURE_SLACK_SECONDS,
    MATCH_CHARS,
    MAX_LINE_CHARS,
    TQDM_STATS,
    clean,
    count_value,
    is_redraw,
    one_year_earlier,
    parse_timestamp,
    split_updates,
    with_loader,
)
from exporter.core.modelloads import ModelLoads
from exporter.core.screen import PatternSet, Screen, screen_of
from exporter.engines import vocabulary
from exporter.engines.profile import LogPattern, LogPatterns, LogProfile, Matcher

__all__ = [
    "MATCH_CHARS",
    "MAX_LINE_CHARS",
    "LogClassifier",
    "Screen",
    "clean",
    "line_level",
    "parse_timestamp",
    "reason_detail",
    "redact",
    "screen_of",
    "split_updates",
]

# --- classification ------------------------------------------------------------------------
#: Markers an engine prints once per launch: what came before belongs to an earlier run.
_LAUNCH_MARKERS: Final = frozenset({"server_args", "engine_init"})


class _UserPatterns:
    """The operator's patterns of one kind, compiled by the config with a linear-time engine.

    Never run through ``re``: a user pattern with nested quantifiers and one hostile line
    would backtrack for minutes holding the GIL (scrapes and ``/-/healthy`` stop with it).
    """

    def __init__(self, matchers: Iterable[Matcher]) -> None:
        self._matchers = tuple(matchers)

    def matches(self, text: str) -> bool:
        """Whether any of the patterns occurs in text."""
        return any(m.search(text) is not None for m in self._matchers)


#: The shared fatal families' words, screened in one linear scan (``re`` backtracks on them).
_FATAL_HINT: Final = screen_of([vocabulary.FATAL_HINT.pattern])


def _hinted(text: str) -> bool:
    """Whether ``text`` holds a word of a shared fatal family (``vocabulary.FATAL_HINT``)."""
    if _FATAL_HINT is None:
        return vocabulary.FATAL_HINT.search(text) is not None
    return bool(present(_FATAL_HINT, text))


def might_matter(line: str) -> bool:
    """Whether a line could be fatal, by a cheap screen: False means it cannot be.

    Used to look for failures first in a flood too large to classify line by line.
    """
    head = line[:MATCH_CHARS]
    level = line_level(head)
    if level is not None and level <= INFO:  # a flood is INFO chatter, never fatal
        return False
    return _hinted(head) or "Traceback" in head


class LogClassifier:
    """Turns raw engine log lines into classified, redacted ``LogEvent``s.

    Lines are checked in layers: the operator's patterns, then the engine's profile (its
    fatal lines, then its benign ones), then the shared vocabulary (stops and noise, then
    the fatal families, which only fire on lines not levelled below warning). A profile
    therefore overrides the vocabulary; a stronger shared reason (oom over crash) still
    upgrades a profile's fatal verdict on the same line.

    Stateful across lines of one log: it remembers the year printed last (vLLM omits it),
    which ranks finished loading weights (a later load is a draft model's) and whether a
    traceback is open (its exception line names the cause).
    """

    def __init__(
        self, profile: LogProfile, patterns: LogPatterns | None = None, *, tz: tzinfo = UTC
    ) -> None:
        user = patterns or LogPatterns()
        self._user_fatal = _UserPatterns(user.fatal)
        self._user_benign = _UserPatterns(user.benign)
        self._user_markers = _UserPatterns(user.markers)
        # Bound here, not read through ``lay``: ``plain`` and ``classify`` use them every line.
        lay = layers_of(profile)
        self._fatal, self._benign = lay.fatal, lay.benign
        self._wrappers, self._markers = lay.wrappers, lay.markers
        self._shared_quiet, self._shared_fatal = lay.shared_quiet, lay.shared_fatal
        self._benign_from, self._benign_layer = lay.benign_from, lay.benign_layer
        self._offsets, self._layer_of = lay.offsets, lay.layer_of
        self._level_extras, self._loader_hits = lay.level_extras, lay.loader_hits
        self._hint_at, self._chains_at = lay.hint_at, lay.chains_at
        self._stamps_at, self._redact_at = lay.stamps_at, lay.redact_at
        self._quiet_hits = lay.quiet_hits
        #: The layers that judge a line before the traceback and the markers do.
        judging = (self._fatal, self._benign, self._shared_quiet, self._wrappers)
        self._judging = frozenset(map(id, judging))
        #: The screen's sorted hits on ``_screened``, the text ``_event`` is deciding, and
        #: the layers they fall in.
        self._hits: list[int] | None = None
        self._hit_layers: set[int] = set()
        self._screened: str | None = None
        #: ``is_redraw`` of the piece last asked: the quiet check and the event both ask.
        self._redraw: tuple[str, bool] = ("", False)
        self._scan, self._match = lay.scan, lay.match
        #: ``plain``'s scan of the line it last looked at, for ``classify`` to go on from.
        self._plain_scan: tuple[str, list[int]] | None = None
        #: ``plain`` found the scanned piece's hits undecided (``_plain_hits`` None): the
        #: piece's own check would find the same.
        self._plain_undecided = False
        #: The same screen over a whole block of lines (``core.logblock``); None with
        #: operator patterns, which are searched line by line.
        self.block: BlockScreen | None = (
            None if user.fatal or user.benign or user.markers else lay.block
        )

        self._user_any = bool(user.fatal or user.benign or user.markers)
        self._tz = tz
        self._year: int | None = None
        self._loads = ModelLoads()
        self._traceback: OpenTraceback | None = None
        #: Timestamp parsed from the last line given to ``classify``; None if it had none.
        self.last_timestamp: float | None = None

    def plain(self, line: str) -> LogClass | None:
        """The class of a line no pattern can match, found without building anything.

        ``INFO`` for a line that matches nothing, ``BENIGN`` for a request access line that
        matches nothing else; None when the line needs ``classify`` (a pattern, a level of
        warning or worse, an open traceback, redraws or colour codes). ``classify`` would
        give the line this class and nothing more, so the caller counts it and moves on:
        no event, no timestamp or level parse, no redaction.
        """
        # Spelled out, not looped: this runs for every line a serving engine writes.
        match = self._scan or self._match
        if self._traceback is not None or match is None or self._user_any:
            return None
        if "\r" in line:  # redraws: ``split_updates`` makes several events of the line
            return None
        if "\x1b" in line or "#033[" in line:  # colour codes: matched without, as classify does
            line = clean(line[: 4 * MAX_LINE_CHARS])
        if "<" in line and TQDM_STATS.search(line):  # a bar with a line glued after it
            return None
        head = line[:MATCH_CHARS]
        hits = match(head.encode("utf-8", "surrogatepass"))
        scanned = hits if hits and self._scan is not None else None
        if scanned is not None:  # the piece screen: ``classify`` reuses its scan
            hits = [i for i in scanned if i < self._hint_at]  # the extras decide nothing here
        if not hits:
            self._plain_scan = None if scanned is None else (head, scanned)
            self._plain_undecided = False
            return None if head.isspace() or not head else LogClass.INFO
        verdict = self._plain_hits(head, hits)
        if scanned is not None:
            self._plain_scan, self._plain_undecided = (head, scanned), verdict is None
        return verdict

    def _plain_piece(self, head: str) -> LogClass | None:
        """``plain``'s class of a cleaned piece ``_scanned`` has just scanned, or None."""
        if self._traceback is not None or self._user_any or self._hits is None:
            return None
        if self._plain_undecided:  # ``plain`` asked the same of these hits just now
            return None
        hits = [i for i in self._hits if i < self._hint_at]  # the extras decide nothing
        return self._plain_hits(head, hits) if hits else LogClass.INFO

    def _counted(self, text: str, stamps: list[int] | None, at: float) -> LogClass | None:
        """The class of a piece that is only counted (``classify``'s ``counts``), or None.

        A piece ``plain`` would count, or one whose event would say nothing but its class:
        a warning no pattern knows, a frame of the open traceback (most of a crash's lines).
        Its timestamp is still read: later lines without one take it.
        """
        head = text[:MATCH_CHARS]
        if (cls := self._plain_piece(head)) is not None:
            return cls
        if head is not text or not self._quiet(head) or (cls := self._quiet_class(head)) is None:
            return None
        if stamps != []:
            self._timestamp(text, at, stamps)
        return cls

    def _quiet(self, head: str) -> bool:
        """Whether the scanned ``head`` holds nothing but a level, a time, a frame's shape.

        No pattern, loader, wait on peers or secret: the shared fatal families' words alone
        decide nothing (their layer has no hit either).
        """
        hits = self._hits
        if hits is None or self._user_any or self._is_redraw(head):
            return False
        quiet = self._quiet_hits
        return all(i in quiet for i in hits) and TRACEBACK_HEAD.search(head) is None

    def _is_redraw(self, head: str) -> bool:
        """``is_redraw(head)``, searched once a piece."""
        if self._redraw[0] is not head:
            self._redraw = (head, is_redraw(head))
        return self._redraw[1]

    def _quiet_class(self, head: str) -> LogClass | None:
        """The class ``_event`` gives a quiet ``head``, the traceback moved on as it would.

        None, and nothing moved, where it would make more of it: a frame that opens a
        traceback, a traceback's exception line, its last line before its budget runs out.
        """
        tb = self._traceback
        if tb is None:
            return None if FRAME.search(head) else level_class(head)
        body = TRACEBACK_BODY.search(head) is not None
        if tb.budget <= 1 or (not body and EXCEPTION.search(head)):
            return None
        tb.budget -= 1  # as ``_match_traceback`` counts the lines it awaits the end in
        if body:
            self._note_frame(tb, head)
            return LogClass.ERROR
        if tb.headless:
            self._traceback = None
        return level_class(head)

    def _plain_hits(self, head: str, hits: list[int]) -> LogClass | None:
        """``plain``'s class of a line with the screen's (non-empty) ``hits``, or None."""
        # Known noise (request traffic above all), or a level word that may be no level
        # ("err" in "overrides"), and nothing else: benign once ``re`` confirms one of the
        # noise hits, as the benign layer of ``classify`` would; info once the line's own
        # level says info and no traceback begins.
        start, layer, levels = self._benign_from, self._benign_layer, self._level_extras
        if any(not (start <= i < start + len(layer) or i in levels) for i in hits):
            return None
        for i in hits:
            if i not in levels and layer[i - start].regex.search(head):
                return LogClass.BENIGN
        if any(i in levels for i in hits):
            if TRACEBACK_HEAD.search(head) or level_class(head) is not LogClass.INFO:
                return None
            return LogClass.INFO
        return None

    @property
    def in_traceback(self) -> bool:
        """Whether a traceback is open: every line until it ends needs ``classify``."""
        return self._traceback is not None

    def level_class(self, line: str) -> LogClass:
        """The class a line's own level gives it (info, warning or error): a flood's count."""
        return level_class(clean(line[:MATCH_CHARS]))

    def reset(self) -> None:
        """Forget what belongs to one run of the engine (call it when the process changes)."""
        self._loads = ModelLoads()
        self._traceback = None

    def classify(
        self,
        line: str,
        *,
        at: float,
        line_no: int | None = None,
        line_time: bool = True,
        counts: Counter[LogClass] | None = None,
    ) -> list[LogEvent]:
        r"""Classify one raw line; each ``\r`` update or glued line in it is one event.

        Args:
            line: the raw line, ANSI codes and ``\r`` redraws included.
            at: when the line was read (or journald's timestamp); used when the line
                carries no timestamp, or always when ``line_time`` is False.
            line_no: 1-based line number in its source, if known.
            line_time: prefer the timestamp printed in the line (replay, backlog).
            counts: where the pieces ``plain`` would count (a redraw that matches nothing)
                are counted, by class, in place of becoming events; None: every piece is
                an event.
        """
        self.last_timestamp = None
        events: list[LogEvent] = []
        for piece in split_updates(line):
            text = clean(piece[: 4 * MAX_LINE_CHARS])  # ANSI codes take room; the rest is cut
            if not text or text.isspace():
                continue
            stamps = self._scanned(text[:MATCH_CHARS])
            if counts is not None and (cls := self._counted(text, stamps, at)) is not None:
                counts[cls] += 1
                continue
            when = self._timestamp(text, at, stamps) if line_time else None
            kept = redact(text[: 2 * MAX_LINE_CHARS], self._secret_shapes(text))[:MAX_LINE_CHARS]
            if kept is not text:  # a secret went (or the line was cut): scanned again
                self._scanned(kept[:MATCH_CHARS])
            event = self._event(kept, at if when is None else when, line_no)
            events.append(with_loader(event, self._names_loader(event.text)))
        return events

    def _scanned(self, head: str) -> list[int] | None:
        """Scan ``head`` once with the piece screen; the timestamp formats it holds, if known.

        What the layers, the fatal words and the loaders need of ``head`` is kept for
        ``_event`` (``_hits``, ``_hit_layers``).
        """
        self._screened, self._hits = head, None
        scan = self._scan or self._match
        if scan is None:
            return None
        known, self._plain_scan = self._plain_scan, None
        found = known[1] if known is not None and known[0] is head else None
        self._plain_undecided = found is not None and self._plain_undecided
        self._hits = hits = sorted(found or scan(head.encode("utf-8", "surrogatepass")) or ())
        layer_of, layers = self._layer_of, len(self._layer_of)
        self._hit_layers = {layer_of[i] for i in hits if i < layers}
        if self._scan is None:
            return None
        return [i - self._stamps_at for i in hits if self._stamps_at <= i < self._redact_at]

    def _scan_of(self, text: str) -> list[int] | None:
        """The piece screen's hits on ``text``, when its last scan was of it; else None."""
        if text is not self._screened or self._scan is None:
            return None
        return self._hits

    def _secret_shapes(self, text: str) -> set[int] | None:
        """``redact``'s shapes in ``text``, when the piece screen's last scan was of it all."""
        hits = self._scan_of(text)
        return None if hits is None else {i - self._redact_at for i in hits if i >= self._redact_at}

    def _names_loader(self, text: str) -> bool | None:
        """Whether ``text`` names a loader, when the piece screen's scan tells; else None."""
        hits = self._scan_of(text)
        return None if hits is None else not self._loader_hits.isdisjoint(hits)

    def _hinted(self, text: str) -> bool:
        """Whether ``text`` holds a shared fatal family's word, from the scan where it tells."""
        hits = self._scan_of(text)
        return _hinted(text) if hits is None else self._hint_at in hits

    def _timestamp(self, text: str, at: float, stamps: list[int] | None) -> float | None:
        if stamps == []:  # the scan found no timestamp format in the piece
            return None
        year = self._year or datetime.fromtimestamp(at, self._tz).year
        parsed = parse_timestamp(text, default_year=year, tz=self._tz, screened=stamps)
        if parsed is None:
            return None
        when, printed_year = parsed
        if printed_year is not None:
            self._year = printed_year
        elif self._year is None and when > at + FUTURE_SLACK_SECONDS:
            when = one_year_earlier(
                when, self._tz
            )  # a December stamp without year, read in January
        self.last_timestamp = when
        return when

    def finish(self) -> list[LogEvent]:
        """The input ended: a failure announced by a wrapper whose cause never came is a crash.

        Returns the wrapper line as a fatal event, or nothing.
        """
        tb, self._traceback = self._traceback, None
        return [self._abandoned(tb)] if tb is not None and tb.opener is not None else []

    @staticmethod
    def _abandoned(tb: OpenTraceback) -> LogEvent:
        assert tb.opener is not None
        reason = tb.hint or FailureReason.CRASH
        return replace(tb.opener, cls=LogClass.FATAL, marker=None, fatal_reason=reason)

    def _first(self, layer: PatternSet, text: str) -> tuple[LogPattern, re.Match[str]] | None:
        """``layer.first``, from the one scan of ``text`` the screen made (``_event``)."""
        if text is not self._screened or self._hits is None:
            return layer.first(text)
        if id(layer) not in self._hit_layers:
            return None
        return layer.first(text, self._hits, self._offsets[id(layer)])

    def _event(self, text: str, at: float, line_no: int | None) -> LogEvent:
        """The event of one cleaned, redacted piece, which ``_scanned`` has scanned."""
        head = text[:MATCH_CHARS]
        if head != self._screened:  # the scan was of another text: read this one
            self._scanned(head)
        head = self._screened if self._screened is not None else head  # the scanned object
        if self._is_redraw(head):  # most pieces of a log are bar redraws: only markers apply
            return self._match_marker(head, at, line_no) or LogEvent(
                LogClass.INFO, head, at, line_no=line_no
            )
        event = (
            self._match_layers(head, at, line_no)
            or self._match_traceback(head, at, line_no)
            or self._match_marker(head, at, line_no)
            or LogEvent(level_class(head), head, at, line_no=line_no)
        )
        return replace(event, text=text) if len(text) > len(head) else event

    def _match_layers(self, text: str, at: float, line_no: int | None) -> LogEvent | None:
        """The layers' verdict (fatal, benign, a wrapper, the shared families), in order.

        None at once where the scan of ``text`` hit none of those layers and no fatal word:
        most events are markers and bars, which none of them can match.
        """
        hits = None if self._user_any else self._scan_of(text)  # an operator's come first
        if (
            hits is not None
            and self._hint_at not in hits
            and self._judging.isdisjoint(self._hit_layers)
        ):
            return None
        return (
            self._match_fatal(text, at, line_no)
            or self._match_wrapper(text, at, line_no)
            or self._match_shared(text, at, line_no)
        )

    def _match_fatal(self, text: str, at: float, line_no: int | None) -> LogEvent | None:
        """Fatal or benign by the layers, in order; None when no layer knows the line."""
        if self._user_any and self._user_fatal.matches(text):
            return self._fatal_event(text, at, line_no, infer_reason(text))
        if self._user_any and self._user_benign.matches(text):
            return self._benign_event(text, at, line_no)
        if found := self._first(self._fatal, text):
            reason = found[0].fatal_reason or FailureReason.CRASH
            return self._fatal_event(text, at, line_no, stronger(reason, self._shared(text)))
        if self._first(self._benign, text) or self._first(self._shared_quiet, text):
            return self._benign_event(text, at, line_no)
        return None

    def _match_wrapper(self, text: str, at: float, line_no: int | None) -> LogEvent | None:
        """A line announcing the traceback that holds its cause.

        Checked before the shared families, so "EngineCore failed to start" waits for the
        oom below it.
        """
        if not self._first(self._wrappers, text):
            return None
        named = self._shared(text)
        if named is not None and named is not FailureReason.CRASH:
            # vllm-08-nccl: "Exception in worker ... NCCL error: ..." names its cause itself
            return self._fatal_event(text, at, line_no, named)
        event = LogEvent(LogClass.ERROR, text, at, marker="traceback", line_no=line_no)
        if self._traceback is None or self._traceback.opener is None:
            self._traceback = OpenTraceback(fatal=True, opener=event)
        return event

    def _match_shared(self, text: str, at: float, line_no: int | None) -> LogEvent | None:
        if shared := self._shared(text):
            return self._fatal_event(text, at, line_no, shared)
        return None

    def _shared(self, text: str) -> FailureReason | None:
        """The shared vocabulary's reason, unless the line's own level says it only reports."""
        if not self._hinted(text):
            return None
        level = line_level(text)  # cheaper than the families: asked first
        if level is not None and level < WARNING:
            return None
        found = self._first(self._shared_fatal, text)
        if found is None:
            return None
        return found[0].fatal_reason or FailureReason.CRASH

    def _fatal_event(
        self, text: str, at: float, line_no: int | None, reason: FailureReason
    ) -> LogEvent:
        if self._traceback is not None:
            reason = stronger(reason, self._traceback.hint)
        self._traceback = None  # the cause is known; the rest of the traceback is context
        return LogEvent(LogClass.FATAL, text, at, fatal_reason=reason, line_no=line_no)

    def _benign_event(self, text: str, at: float, line_no: int | None) -> LogEvent:
        if self._traceback and EXCEPTION.search(text):
            self._traceback = None  # e.g. KeyboardInterrupt closing an operator stop's traceback
        return LogEvent(LogClass.BENIGN, text, at, line_no=line_no)

    def _match_traceback(self, text: str, at: float, line_no: int | None) -> LogEvent | None:
        if TRACEBACK_HEAD.search(text):
            if self._traceback is None:
                self._traceback = OpenTraceback(fatal=False)
            return LogEvent(LogClass.ERROR, text, at, line_no=line_no)
        tb = self._traceback
        if tb is None:
            if not FRAME.search(text):
                return None
            tb = self._traceback = OpenTraceback(fatal=True, headless=True)
        tb.budget -= 1
        if tb.budget <= 0:
            self._traceback = None
            return self._abandoned(tb) if tb.opener is not None else None
        if TRACEBACK_BODY.search(text):
            self._note_frame(tb, text)
            return LogEvent(LogClass.ERROR, text, at, line_no=line_no)
        if m := EXCEPTION.search(text):
            self._traceback = None
            if tb.fatal and not NOT_A_CRASH.search(m.group("name")):
                reason = tb.hint or FailureReason.CRASH
                return LogEvent(LogClass.FATAL, text, at, fatal_reason=reason, line_no=line_no)
            return LogEvent(LogClass.ERROR, text, at, line_no=line_no)
        if tb.headless:
            self._traceback = None
        return None

    def _note_frame(self, tb: OpenTraceback, text: str) -> None:
        """Frames tell what the exception line may not: top level reached, a family named."""
        if TOP_FRAME.search(text):
            tb.fatal = True
        hits = self._scan_of(text)
        for i, (regex, reason) in enumerate(vocabulary.CHAIN_HINTS, self._chains_at):
            if (hits is None or i in hits) and regex.search(text):
                tb.hint = stronger(reason, tb.hint)

    def _match_marker(self, text: str, at: float, line_no: int | None) -> LogEvent | None:
        if self._user_any and self._user_markers.matches(text):
            return LogEvent(LogClass.MARKER, text, at, marker="user", line_no=line_no)
        found = self._first(self._markers, text)
        if found is None:
            return None
        p, m = found
        if p.cls is LogClass.PROGRESS:
            return self._progress_event(p, m, text, at, line_no)
        if p.marker in _LAUNCH_MARKERS:
            self.reset()
        self._loads.note(p.marker, text)
        return LogEvent(p.cls, text, at, phase=p.phase, marker=p.marker, line_no=line_no)

    def _progress_event(
        self, p: LogPattern, m: re.Match[str], text: str, at: float, line_no: int | None
    ) -> LogEvent:
        done, total = count_value(m.group("done")), count_value(m.group("total"))
        key = self._loads.key(p.marker or "progress", per_model=p.per_model)
        return LogEvent(
            LogClass.PROGRESS,
            text,
            at,
            phase=p.phase,
            marker=p.marker,
            progress=(min(done, total), total),
            progress_key=key,
            line_no=line_no,
        )

"""A profile's classifier layers and the one screen over them all, built once per profile.

No I/O. ``LogClassifier`` checks a line against layers of patterns (the profile's fatal
lines, wrappers, markers, the shared fatal families, then the benign noise); one RE2 set
holds them all, with the extra questions a piece is asked after them (level words, frames,
loaders, the shared fatal words, the causes frames name, timestamp and secret shapes), so
one scan answers every question. This module lays that set out and says which of its
indices mean what. A classifier is made per target and per engine process, and
``replay-log`` makes one per log: the layout is the same every time, so it is made once.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from exporter.base.linear import cased, widened
from exporter.base.redact import REDACT_SCREEN
from exporter.core.failure import REASON_ORDER
from exporter.core.logblock import BlockScreen, block_screen
from exporter.core.loglevel import LEVEL_SCREEN
from exporter.core.logtext import TIMESTAMP_SCREEN, TQDM_STATS
from exporter.core.screen import PatternSet, screen_of
from exporter.engines import access, vocabulary
from exporter.engines.profile import LogPattern, LogProfile

FRAME_SHAPE: Final = r'File "[^"]+", line \d+'
#: What sends a line past the screen besides the patterns: a level of warning or worse
#: (``loglevel.LEVEL_SCREEN``), a traceback or a bare frame of one, a loader, a wait on
#: peers, control characters ``clean`` would strip.
SCREEN_EXTRAS: Final = (
    *LEVEL_SCREEN,
    r"[\x00-\x08\x0b-\x1f\x7f]",
    FRAME_SHAPE,  # a bare frame opens a traceback (an excerpt cut inside one)
    *(regex.pattern for regex, _ in vocabulary.LOADERS),
    vocabulary.PEER_WAIT.pattern,  # the peers bound's evidence: kept as an event
)

#: An RE2 set's search: the indices of its patterns found in the bytes, or None.
Scan = Callable[[bytes], "list[int] | None"]


@dataclass(frozen=True, slots=True)
class Layers:
    """A profile's pattern layers and where each question sits in the piece screen.

    Attributes:
        fatal, benign, wrappers, markers: the profile's layers (with the shared wrappers
            and markers), fatal ones ordered by reason.
        shared_quiet, shared_fatal: the shared vocabulary's noise and fatal families.
        benign_from: the screen's first index of ``benign_layer`` (the profile's benign
            patterns, then the shared noise), the last layer.
        offsets: each layer's first index in the screen, by the layer's ``id``.
        layer_of: the layer (its ``id``) of each of the screen's first indices.
        level_extras, loader_hits: the screen's indices of the level words and loaders.
        hint_at, chains_at, stamps_at, redact_at: where the shared fatal words, the causes
            frames name, the timestamp formats and the secret shapes begin.
        quiet_hits: hits that leave a piece's event nothing to say but its class.
        scan: the piece screen's search; None when a pattern is not RE2's.
        match: the layers and extras alone (without the piece's questions), the same way.
        block: the screen over a whole block of lines (``core.logblock``), or None.
    """

    fatal: PatternSet
    benign: PatternSet
    wrappers: PatternSet
    markers: PatternSet
    shared_quiet: PatternSet
    shared_fatal: PatternSet
    benign_from: int
    benign_layer: tuple[LogPattern, ...]
    offsets: dict[int, int]
    layer_of: tuple[int, ...]
    level_extras: frozenset[int]
    loader_hits: frozenset[int]
    hint_at: int
    chains_at: int
    stamps_at: int
    redact_at: int
    quiet_hits: frozenset[int]
    scan: Scan | None
    match: Scan | None
    block: BlockScreen | None


def _sorted_fatal(patterns: Iterable[LogPattern]) -> PatternSet:
    return PatternSet(sorted(patterns, key=lambda p: REASON_ORDER.get(p.fatal_reason, 9)))


@functools.lru_cache(maxsize=64)
def layers_of(profile: LogProfile) -> Layers:
    """The layers of ``profile`` and their screens (one per profile, shared)."""
    quiet = (*access.ACCESS, *vocabulary.STOPS, *vocabulary.BENIGN)
    fatal, benign = _sorted_fatal(profile.fatal), PatternSet(profile.benign)
    wrappers = PatternSet((*profile.wrappers, *vocabulary.WRAPPERS))
    markers = PatternSet((*profile.markers, *vocabulary.MARKERS))
    shared_quiet, shared_fatal = PatternSet(quiet), _sorted_fatal(vocabulary.FATAL)
    # The benign layer last, so that its hits are one range of the screen's indices.
    sets = (fatal, wrappers, markers, shared_fatal)
    layers = (*sets, benign, shared_quiet)
    benign_layer = (*benign.patterns, *quiet)
    # Opened (``widened``): ``re`` confirms every layer's hit, and a set of bounded repeats
    # costs a line more than twice the scan.
    regexes = [widened(p.regex.pattern) for ps in sets for p in ps.patterns]
    benign_from = len(regexes)
    regexes += [widened(p.regex.pattern) for p in benign_layer]
    hint_at = len(regexes) + len(SCREEN_EXTRAS)
    stamps_at = hint_at + 1 + len(vocabulary.CHAIN_HINTS)
    redact_at = stamps_at + len(TIMESTAMP_SCREEN)
    level_extras = frozenset(range(len(regexes), len(regexes) + len(LEVEL_SCREEN)))
    loaders = len(regexes) + SCREEN_EXTRAS.index(vocabulary.LOADERS[0][0].pattern)
    frame = len(regexes) + SCREEN_EXTRAS.index(FRAME_SHAPE)
    starts = itertools.accumulate((len(ps.patterns) for ps in layers), initial=0)
    chains = [cased(regex) for regex, _ in vocabulary.CHAIN_HINTS]
    extras = (vocabulary.FATAL_HINT.pattern, *chains, *TIMESTAMP_SCREEN, *REDACT_SCREEN)
    screen, pieces = (
        screen_of([*regexes, *SCREEN_EXTRAS]),
        screen_of([*regexes, *SCREEN_EXTRAS, *extras]),
    )
    return Layers(
        fatal=fatal,
        benign=benign,
        wrappers=wrappers,
        markers=markers,
        shared_quiet=shared_quiet,
        shared_fatal=shared_fatal,
        benign_from=benign_from,
        benign_layer=benign_layer,
        offsets={id(ps): start for ps, start in zip(layers, starts, strict=False)},
        layer_of=tuple(id(ps) for ps in layers for _ in ps.patterns),
        level_extras=level_extras,
        loader_hits=frozenset(range(loaders, loaders + len(vocabulary.LOADERS))),
        hint_at=hint_at,
        chains_at=hint_at + 1,
        stamps_at=stamps_at,
        redact_at=redact_at,
        quiet_hits=level_extras | {frame, *range(hint_at, redact_at)},
        scan=None if pieces is None else pieces.Match,
        match=None if screen is None else screen.Match,
        block=None if screen is None else _block(regexes),
    )


def _block(regexes: list[str]) -> BlockScreen | None:
    """The block screen of the layers' (opened) regexes; the access lines' runs stay exact.

    A run of access lines is counted as request traffic without ``re``, so its shapes are
    matched as written, and left out of the lines the block screen flags.
    """
    requests = [p.regex.pattern for p in access.ACCESS]
    opened = {widened(r) for r in requests}
    flagged = [r for r in (*regexes, *SCREEN_EXTRAS, TQDM_STATS.pattern) if r not in opened]
    return block_screen(flagged, requests)

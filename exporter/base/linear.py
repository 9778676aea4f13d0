"""Linear-time screens: which of many regexes can occur in a text, in one RE2 scan.

No I/O. Python's ``re`` backtracks: an alternation of many words, case-insensitive, costs
tens of microseconds a line, and a hostile line far more. An RE2 set answers for all of
its regexes at once in time linear in the text; callers then run ``re`` only on the few
that can match (or trust the set outright where its reading is the same as ``re``'s).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Final, Protocol

import re2

#: RE2's memory for one set's DFA cache, a ceiling. A classifier's piece screen (its
#: patterns, the fatal words, the timestamp and secret shapes) reaches many DFA states; under
#: a tight budget RE2 drops its cache and rebuilds it every few lines: at 64 MiB a scan cost
#: 50 us where it costs 4, and at 256 MiB every other pass over the shared corpus still ran
#: 40 % slower. Replaying the whole corpus takes the same RSS under 64 MiB as under 1 GiB.
_MAX_MEM: Final = 1 << 30


class Screen(Protocol):
    """What this module uses of an ``re2.Set`` (the package ships no types)."""

    def Match(self, text: bytes) -> list[int] | None:
        """The indices of the patterns that occur in text, or None."""
        ...


def screen_of(regexes: Iterable[str]) -> Screen | None:
    """``_compiled_screen`` of the regexes: one set per distinct list, shared."""
    return _compiled_screen(tuple(regexes))


@functools.cache
def _compiled_screen(regexes: tuple[str, ...]) -> Screen | None:
    r"""One RE2 set of the regexes, case-insensitive, searched in time linear in the text.

    A screen: a pattern RE2 reads a little more widely (case, or ``\w``, ``\d`` and ``\b``,
    which are ASCII in RE2) costs a check, never a verdict. None when a regex is not RE2's.
    """
    options = re2.Options()
    options.case_sensitive = False
    options.max_mem = _MAX_MEM
    screen = re2.Set.SearchSet(options)
    try:
        for regex in regexes:
            screen.Add(regex)
        screen.Compile()
    except re2.error:
        return None
    # The C set itself, past the wrapper's type checks: bytes go in either way.
    return getattr(screen, "_set", screen)  # type: ignore[no-any-return]


def present(screen: Screen, text: str) -> list[int]:
    """The indices of the screen's regexes that occur in ``text`` (unsorted; may be empty)."""
    return screen.Match(text.encode("utf-8", "surrogatepass")) or []


#: A bounded repeat ``{m,n}`` (lazy or not); an escaped character and a character class are
#: matched whole first, so that a brace in either is left as it is.
_BOUNDED: Final = re.compile(r"\\.|\[\^?\]?(?:\\.|[^\]])*\]|\{(\d+),(\d+)\}")


def widened(regex: str) -> str:
    r"""``regex`` with every bounded repeat opened (``{0,n}`` to ``*``, ``{m,n}`` to ``{m,}``).

    For a screen whose every hit ``re`` confirms: it matches wherever ``regex`` does. In an
    RE2 set a bounded repeat is a counter the DFA spells out, a state for each position it
    may be at in each pattern at once: over varied lines the states no longer fit the CPU's
    caches, and a 130-byte line took 5.2 us to scan where the opened set takes 1.9.
    """
    return _BOUNDED.sub(_opened, regex)


def _opened(m: re.Match[str]) -> str:
    if m.group(1) is None:  # an escape or a class: text, not a repeat
        return m.group(0)
    low = int(m.group(1))
    return "*" if low == 0 else "+" if low == 1 else f"{{{low},}}"


def cased(regex: re.Pattern[str]) -> str:
    r"""``regex`` for a screen, read as ``re`` reads it: case-sensitive unless compiled ``re.I``.

    On ASCII text a screen's hit on such a pattern is ``re``'s own verdict (RE2's ``\w``,
    ``\d`` and ``\b`` are ASCII): the caller may trust it without a second search.
    """
    return regex.pattern if regex.flags & re.IGNORECASE else f"(?-i:{regex.pattern})"

"""The product's shape: no module under exporter/ grows past STYLE.md's 600 lines."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "exporter"
MAX_LINES = 600

#: Modules still over the limit while they are being cut (issue 28): the log source is being
#: split by another branch. Remove its line when that lands; nothing may join this set.
KNOWN_OVER = {"exporter/sources/logs.py"}


def line_counts() -> dict[str, int]:
    return {
        p.relative_to(PACKAGE.parent).as_posix(): len(p.read_text().splitlines())
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_product_module_is_over_600_lines():
    counts = line_counts()
    over = {f"{name} ({n} lines)" for name, n in counts.items() if n > MAX_LINES}
    new = sorted(o for o in over if o.split(" ")[0] not in KNOWN_OVER)
    assert not new, f"over {MAX_LINES} lines, cut along their seams: {', '.join(new)}"


def test_every_known_exception_is_still_over_the_limit():
    # Once a listed module is cut, its exception must go, so it cannot grow back unseen.
    counts = line_counts()
    stale = sorted(name for name in KNOWN_OVER if counts.get(name, 0) <= MAX_LINES)
    assert not stale, f"{stale} are at most {MAX_LINES} lines now: drop them from KNOWN_OVER"

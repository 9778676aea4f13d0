"""The product's shape: no module under exporter/ grows past STYLE.md's 600 lines."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "exporter"
MAX_LINES = 600


def test_no_product_module_is_over_600_lines():
    over = [
        f"{p.relative_to(PACKAGE.parent).as_posix()} ({n} lines)"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not over, f"over {MAX_LINES} lines, cut along their seams: {', '.join(over)}"

r"""Control characters made visible, for text from others on its way to a log or a terminal.

No I/O. A pod name, a container label or an engine's log line may hold a newline (which forges
a log line of our own), an ESC sequence (which a terminal obeys: colours, cursor moves, a
changed title) or a bidirectional override (which reorders what a reader sees). Each such
character is written as its escape (``\n``, ``\x1b``, ``\u202e``) instead, so the text still
reads and nothing in it acts.
"""

from __future__ import annotations

from typing import Final

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0 and C1 controls, DEL; bidirectional marks, embeddings, overrides and isolates; the line
# and paragraph separators some viewers break lines at.
_CONTROLS: Final = [
    *range(0x20),
    *range(0x7F, 0xA0),
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    0x2028,
    0x2029,
]
_TABLE: Final = {
    code: _NAMED.get(chr(code), f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for code in _CONTROLS
}


def escape_controls(text: str) -> str:
    """``text`` with every control character written as its escape (see the module docstring).

    Backslashes are left as they are: the output is for people to read, not to be decoded.
    """
    return text.translate(_TABLE)

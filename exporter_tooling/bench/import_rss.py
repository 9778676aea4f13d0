"""Run by path in a fresh interpreter: what each group of the daemon's imports adds to RSS.

``import_rss.py list MODULE...`` imports the modules and prints every module then loaded, in the
order they were first imported. ``import_rss.py measure`` reads such a list on stdin, imports it
again group by group and prints the RSS before the first group and what each group added, in
bytes. The groups: each library by top-level package, in the order the daemon first imports
them, with the standard-library modules it is the first to need (``ssl`` and ``http`` come with
the first library that imports them); then the rest of the standard library; then ours.

Run by path, not as part of the package, so nothing of the bench is loaded before the baseline.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

OURS = "exporter"


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _groups(names: list[str]) -> list[tuple[str, list[str]]]:
    """Modules by group in first-import order: each library, the standard library, ours."""
    stdlib: list[str] = []
    ours: list[str] = []
    libraries: dict[str, list[str]] = {}
    for name in names:
        top = name.partition(".")[0]
        if top.startswith("__"):  # __main__, __mp_main__: no package to import
            continue
        if top == OURS:
            ours.append(name)
        elif top in sys.stdlib_module_names or top in sys.builtin_module_names:
            stdlib.append(name)
        else:
            libraries.setdefault(top.lstrip("_"), []).append(name)
    return [*libraries.items(), ("the rest of the standard library", stdlib), ("ours", ours)]


def _import_all(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # a module importable only in the daemon's order: left out
            continue


def main(argv: list[str]) -> None:
    """``list MODULE...`` or ``measure`` (see the module's docstring)."""
    if argv[:1] == ["list"]:
        _import_all(argv[1:])
        print(json.dumps(list(sys.modules)))
        return
    names = json.loads(sys.stdin.read())
    out: list[tuple[str, int]] = [("interpreter", _rss())]
    for label, group in _groups([n for n in names if n not in sys.modules]):
        before = _rss()
        _import_all(group)
        out.append((label, _rss() - before))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])

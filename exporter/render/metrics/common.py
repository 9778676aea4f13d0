"""What every family module shares: the last-tick note of derived gauges and gauge builders."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client.core import GaugeMetricFamily

#: Appended to the HELP of gauges derived from the last tick's sample.
TICK_NOTE: Final = " (as of the last sampling tick)"


def gauge(name: str, doc: str, labels: Iterable[str] = ("target",)) -> GaugeMetricFamily:
    """A gauge family, labelled by target unless told otherwise."""
    return GaugeMetricFamily(name, doc, labels=list(labels))


def add_if(family: GaugeMetricFamily, target: str, value: float | None) -> None:
    """One sample for ``target``, unless the value is unknown (absent, never 0)."""
    if value is not None:
        family.add_metric([target], float(value))

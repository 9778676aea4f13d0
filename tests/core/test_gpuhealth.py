"""Xid labels: the source hands raw codes over, the core folds them into bounded labels."""

from __future__ import annotations

from exporter.core.gpuhealth import xid_label_counts
from exporter.sources.gpu.records import XID_OVERFLOW


def test_well_known_codes_keep_their_label_and_the_rest_are_other():
    counts = ((13, 1), (48, 2), (79, 3), (999, 4), (1234, 1))
    assert xid_label_counts(counts) == (("13", 1), ("48", 2), ("79", 3), ("other", 5))


def test_codes_past_the_sources_bound_count_as_other():
    assert xid_label_counts(((XID_OVERFLOW, 7), (79, 1))) == (("79", 1), ("other", 7))

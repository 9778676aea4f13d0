"""The imperative shell: sample every source under deadlines, step the core, publish a Snapshot.

``loop`` holds the ``Daemon`` (one tick, the loop, reload), ``targets`` the target set
(static and discovered targets, grace, shadowing), ``watched`` the per-target sources'
registry, ``clock`` the anchored clock and the overrun log.
"""

from exporter.daemon.clock import AnchoredClock, anchored_clock
from exporter.daemon.loop import Daemon, target_states

__all__ = ["AnchoredClock", "Daemon", "anchored_clock", "target_states"]

"""The pure core: typed readings in, lifecycle state and snapshots out.

Nothing under this package does I/O or reads a clock: time is passed in. The shell
(``exporter.daemon``) feeds it once a tick through ``tick.advance_tick`` and publishes what it
returns.
"""

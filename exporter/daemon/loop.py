"""The loop: follow the target set, sample every source under one deadline, one core step.

One tick: the target set's change is applied, every source is sampled (``SourceRunner``),
the readings are built by source name, ``core.tick.advance_tick`` advances every target at
once, and what it returned is written: history, edge log lines, the sources' next input.
The loop runs at a fixed interval (timer-driven on purpose: stall timers and rates need
history whether or not anyone scrapes); it never dies of a source. Scrapes read ``latest``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from exporter import __version__
from exporter.base.errors import ConfigErrors
from exporter.base.localzone import local_utc_offset_seconds, local_zone
from exporter.base.model import (
    STARTUP_PHASES,
    STEADY_PHASES,
    GpuReading,
    HostReadings,
    Observation,
    Phase,
    SourceStatus,
)
from exporter.config import Settings, Target
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import (
    TargetState,
    Thresholds,
    initial_state,
    learned_stall_seconds,
    resume,
    saved_start,
)
from exporter.core.observe import TargetWorld, host_readings
from exporter.core.snapshot import Snapshot, TargetInfo
from exporter.core.tick import (
    RECENT_STARTS_SHOWN,
    ClockShift,
    TargetOutcome,
    TargetPlan,
    TickResult,
    advance_tick,
)
from exporter.daemon.clock import AnchoredClock, OverrunLog, anchored_clock
from exporter.daemon.shared import Holder, SharedRound, SharedSources
from exporter.daemon.targets import TargetChange, TargetSet
from exporter.daemon.watched import Watched, make_sources
from exporter.history import History
from exporter.sdnotify import Notifier
from exporter.sources import (
    Source,
    SourceCall,
    SourceHealth,
    SourceResult,
    SourceRunner,
    TargetSeen,
)
from exporter.sources.disk import DiskSource
from exporter.sources.gpu.vendors import merge_readings, vendor_sources
from exporter.sources.pressure import MemoryPressureSource
from exporter.sources.probe import Prober

log = logging.getLogger("exporter.daemon")


class Daemon:
    """Owns the sources and the per-target worlds; ``tick()`` does one round, ``run()`` loops."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: AnchoredClock | None = None,
        history: History | None = None,
        notifier: Notifier | None = None,
        gpu_env: Mapping[str, str] | None = None,
        on_step: Callable[[Observation, float, Thresholds], None] | None = None,
    ) -> None:
        self.settings = settings
        self._clock = clock or anchored_clock()
        self.history = history or History.open(settings.state_directory)
        self.notifier = notifier or Notifier()
        self.latest: Snapshot | None = None
        self._on_step = on_step
        self._health = SourceHealth()
        self._errors: dict[str, int] = {}
        #: One supervised child per GPU vendor present (NVML, amd-smi), NVIDIA's first.
        self._gpus: list[Source[GpuReading]] = list(vendor_sources(settings, gpu_env))
        self._vendor_readings = [GpuReading(gpus=()) for _ in self._gpus]
        #: Host sources other than NVML; each fills the ``HostReadings`` field of its name.
        self._host_sources: list[Source[object]] = [
            DiskSource([t.model_path for t in settings.targets if t.model_path]),
            MemoryPressureSource(),
        ]
        self._gpu_reading = GpuReading(gpus=())
        self._shared = SharedSources()
        self._watched = [self._watch(t) for t in settings.targets]
        self._targets = TargetSet(settings)
        self._completions = ThreadPoolExecutor(max_workers=2, thread_name_prefix="completion")
        self._runner = SourceRunner(max(2, min(16, len(self._watched) + 1)))
        self._ticks = 0
        self._history_errors = 0
        #: Source calls still running at ``close()`` (they hold threads Python cannot stop).
        self.stuck_sources = 0
        self._overruns = OverrunLog()
        #: How much of the clock's steps the kept timestamps have been moved by.
        self._followed_step = 0.0

    def _watch(self, target: Target) -> Watched:
        saved = self.history.saved_start(target.name)
        state = resume(saved) if saved is not None else initial_state(target.name)
        # the core never reads the machine's zone itself: it is handed in
        classifier = LogClassifier(target.profile.log, target.log_patterns, tz=local_zone())
        sources = make_sources(target, self.settings.state_directory)
        try:
            completer = Prober(target) if target.completion else None
        except Exception:
            for source in sources:
                source.close()
            raise
        world = TargetWorld(state, classifier)
        sources = self._shared.adopt(sources)
        return Watched(target, sources, world, self._plan(target), completer=completer)

    def _plan(self, target: Target) -> TargetPlan:
        """What the core needs of the target from its config and its history."""
        exp = self.history.expectations(target.history_name)
        stall = {
            p: learned_stall_seconds(exp.longest_quiet.get(p), target.stall.for_phase(p), p)
            for p in STARTUP_PHASES
        }
        where = target.pod
        return TargetPlan(
            info=TargetInfo(
                target.name,
                target.engine,
                target.deployment,
                target.model,
                *((where.namespace, where.pod, where.container) if where else ()),
            ),
            thresholds=Thresholds(
                stall_seconds=stall,
                expected_peak_gpu_bytes=exp.peak_gpu_bytes,
                expected_phase_seconds=exp.phase_seconds,
                utc_offset_seconds=local_utc_offset_seconds(),
            ),
            gpus=target.gpus,
            typical_start_seconds=exp.typical_duration_seconds,
            p95_start_seconds=exp.p95_duration_seconds,
            recent_starts=tuple(self.history.starts(target.history_name, RECENT_STARTS_SHOWN)),
        )

    # --- one tick ---------------------------------------------------------------------------

    def tick(self) -> Snapshot:
        """Sample every source once, advance every target in one core step, publish."""
        started = time.perf_counter()
        if (change := self._targets.follow()) is not None:
            self._follow(change)
        completions = [w.collect_completion() for w in self._watched]
        host_results, gpu_results, target_results, statuses = self._sample()
        now = self._clock()
        host = host_readings(
            {s.name: r.value for s, r in zip(self._host_sources, host_results, strict=True)}
        )
        gpu = self._gpu_readings(gpu_results)
        readings = [
            w.readings(results, done)
            for w, results, done in zip(self._watched, target_results, completions, strict=True)
        ]
        worlds, plans = [w.world for w in self._watched], [w.plan for w in self._watched]
        result = advance_tick(
            worlds, readings, plans, host, gpu, now, clock=self._follow_clock_step()
        )
        for w, outcome in zip(self._watched, result.targets, strict=True):
            self._take(w, outcome, now)
        statuses += [self._history_status(), *self._targets.statuses()]
        for st in statuses:
            self._health.record(st)
            if not st.up and not st.absent:
                self._errors[st.source] = self._errors.get(st.source, 0) + 1
        took = time.perf_counter() - started
        self._overruns.tick(took, self.settings.interval_seconds, time.monotonic())
        self.latest = self._snapshot(now, result, host, gpu, statuses, took)
        self._ticks += 1
        return self.latest

    def _sample(
        self,
    ) -> tuple[
        list[SourceResult[object]],
        list[SourceResult[object]],
        list[list[SourceResult[object]]],
        list[SourceStatus],
    ]:
        """Run every source once under the tick's deadline: host, GPU and per-target results.

        Process trees first (a few ms of /proc reads), everything else after: an engine's
        last log lines are then read after it was seen gone, so its fatal line and its exit
        arrive in the same tick and the reason is the line's, not a bare "exited".
        """
        deadline = time.monotonic() + self.settings.interval_seconds
        # targets sharing a source (one tree, one URL, one file) cost one call of it
        first = SharedRound.of([Holder.of(w, w.sources[:1]) for w in self._watched])
        rest = SharedRound.of([Holder.of(w, w.sources[1:]) for w in self._watched])
        host = [SourceCall(s) for s in [*self._host_sources, *self._gpus]]
        firsts = self._runner.run(first.calls, deadline)
        done = self._runner.run(host + rest.calls, deadline)
        hosts, others = done[: len(host)], done[len(host) :]
        by_target = [
            heads + tails
            for heads, tails in zip(first.spread(firsts), rest.spread(others), strict=True)
        ]
        statuses = [r.status for results in by_target for r in results[:1]]
        statuses += [r.status for r in hosts]
        statuses += [r.status for results in by_target for r in results[1:]]
        n_host = len(self._host_sources)
        return hosts[:n_host], hosts[n_host:], by_target, statuses

    def _take(self, w: Watched, outcome: TargetOutcome, now: float) -> None:
        """Write what the core made of one target: history, edge logs, its sources' input."""
        w.world = outcome.world
        if self._on_step is not None:
            self._on_step(outcome.observation, now, outcome.thresholds)
        _log_edges(w.target.name, outcome)
        finished = w.seen.starts_finished
        if outcome.finished is not None:
            key = w.target.history_name  # a workload's replicas learn from each other
            self.history.record(key, w.target.engine, w.target.model, outcome.finished)
            w.plan, finished = self._plan(w.target), finished + 1
        if outcome.save is not None:
            self.history.save_progress(outcome.save)
        w.seen = TargetSeen(w.world.state.phase in STEADY_PHASES, finished)
        w.schedule_completion(self._completions, now)

    def _snapshot(
        self,
        now: float,
        result: TickResult,
        host: HostReadings,
        gpu: GpuReading,
        statuses: Sequence[SourceStatus],
        took: float,
    ) -> Snapshot:
        return Snapshot(
            taken_at=now,
            targets=tuple(t.snapshot for t in result.targets),
            gpus=gpu.gpus,
            migs=gpu.migs,
            gpu_stale=gpu.stale,
            foreign_gpu_memory_bytes=tuple(sorted(result.attribution.foreign.items())),
            unattributed_gpu_processes=result.attribution.unattributed_pids,
            host=host,
            sources=tuple(statuses),
            source_errors=tuple(sorted(self._errors.items())),
            tick_duration_seconds=took,
            tick_overruns=self._overruns.total,
            discovery_dropped=self._targets.dropped(),
            version=__version__,
            all_gpu_health=self.settings.gpu_health_metrics == "all",
        )

    def _follow_clock_step(self) -> ClockShift:
        """The wall-clock step the clock just re-anchored on, for the core to move kept times."""
        step = self._clock.stepped_seconds - self._followed_step
        if step:
            self._followed_step += step
            for w in self._watched:
                w.next_completion_at += step
        return ClockShift(step, self._followed_step)

    def _gpu_readings(self, results: Sequence[SourceResult[object]]) -> GpuReading:
        """This tick's GPU reading: each vendor's, or its last one marked stale when it failed."""
        if not self._gpus:
            return self._gpu_reading
        for i, result in enumerate(results):
            if isinstance(result.value, GpuReading):
                self._vendor_readings[i] = result.value
            elif self._vendor_readings[i].gpus:
                self._vendor_readings[i] = replace(self._vendor_readings[i], stale=True)
        self._gpu_reading = merge_readings(self._vendor_readings)
        return self._gpu_reading

    def _history_status(self) -> SourceStatus:
        """The history store as a source: down while in memory, lost or failing writes.

        ``History.check`` keeps a problem until it is fixed (and a lost store for ten minutes
        after), so ``InferenceExporterSourceDown`` (5 minutes) can fire; a failed write that
        a later one fixed still shows for the tick it happened in.
        """
        problem = self.history.check()
        failed = self.history.errors > self._history_errors
        self._history_errors = self.history.errors
        error = problem or ("write_failed" if failed else None)
        return SourceStatus("history", error is None, 0.0, error)

    # --- the loop ---------------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event,
        *,
        on_first_tick: Callable[[], None] | None = None,
        reload: threading.Event | None = None,
        load: Callable[[], Settings] | None = None,
    ) -> None:
        """Tick at the configured interval until ``stop`` is set.

        When ``reload`` is set (SIGHUP), ``load()`` is called between ticks; a config that
        fails to load is logged and the running one kept.
        """
        next_at = time.monotonic()
        while not stop.is_set():
            if reload is not None and load is not None and reload.is_set():
                reload.clear()
                self.reload(load)
            try:
                snap = self.tick()
            except Exception:  # the loop must outlive any bug in one tick
                log.exception("tick failed")
            else:
                if self._ticks == 1:
                    if on_first_tick is not None:
                        on_first_tick()
                    self.notifier.notify("READY=1", _status_line(snap))
                else:
                    self.notifier.notify("WATCHDOG=1", _status_line(snap))
            next_at += self.settings.interval_seconds
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow tick): skip, don't burst
                next_at = time.monotonic()
                delay = 0
            self._wait(stop, delay)

    def _wait(self, stop: threading.Event, delay: float) -> None:
        """Sleep until the next tick; with a watchdog, ping it from here at half its period.

        Pings come only from this loop between finished ticks, so a wedged tick still stops
        them and systemd restarts the daemon, even when the interval exceeds the watchdog.
        """
        period = self.notifier.watchdog_seconds
        if period is None:
            stop.wait(delay)
            return
        end = time.monotonic() + delay
        while not stop.wait(max(0.0, min(period / 2, end - time.monotonic()))):
            if time.monotonic() >= end:
                return
            self.notifier.notify("WATCHDOG=1")

    def reload(self, load: Callable[[], Settings]) -> bool:
        """Apply a new config; targets that keep their name keep their lifecycle state."""
        try:
            settings = load()
        except ConfigErrors as exc:
            log.error(
                "config reload failed, keeping the running config problems=%d first=%r",
                len(exc.errors),
                str(exc.errors[0]) if exc.errors else "",
            )
            return False
        try:  # ConfigError, or anything else: the loop outlives a reload
            pending = self._targets.prepare(settings)
        except Exception as exc:  # credentials unreadable: never end the loop
            log.error("config reload failed, keeping the running config first=%r", str(exc))
            return False
        try:
            self._apply(pending.change)
        except Exception as exc:  # e.g. a world-readable api_key_file; never end the loop
            self._targets.abort(pending)
            log.error("config reload failed, keeping the running config first=%r", str(exc))
            return False
        self._targets.commit(pending)
        self.settings = settings
        log.info(
            "config reloaded targets=%s interval_s=%g",
            ",".join(sorted(w.target.name for w in self._watched)) or "-",
            settings.interval_seconds,
        )
        return True

    def _follow(self, change: TargetChange) -> None:
        """Apply a change of the discovered targets; one odd pod must not end the loop."""
        try:
            self._apply(change)
        except Exception as exc:  # retried next tick
            self._targets.rejected(exc)
        else:
            self._targets.applied(change)

    def _apply(self, change: TargetChange) -> None:
        """Watch exactly ``change.targets``: unchanged ones go on, changed ones keep their state.

        Raises:
            Exception: a target's sources could not be built; nothing was changed.
        """
        old = {w.target.name: w for w in self._watched}
        fresh: list[Watched] = []
        try:
            for target in change.targets:
                if target.name in change.added or target.name in change.changed:
                    fresh.append(self._watch(target))
        except Exception:
            for w in fresh:
                self._close_sources(w.close_sources())
            raise
        made = iter(fresh)
        watched = []
        for target in change.targets:
            kept = old.get(target.name)
            if target.name in change.added or target.name in change.changed:
                w = next(made)
                if kept is not None:  # a changed target keeps its lifecycle state
                    w.world = TargetWorld(kept.world.state, w.world.classifier)
                    self._close_sources(kept.close_sources())
                watched.append(w)
            elif kept is not None:
                watched.append(kept)
        for name in change.removed:
            self._close_sources(old[name].close_sources())
        self._watched = watched

    def _close_sources(self, sources: Sequence[Source[object]]) -> None:
        """Close each source no other target still holds (``SharedSources.release``)."""
        for source in sources:
            if not self._shared.release(source):
                continue
            self._runner.forget(source)
            try:
                source.close()
            except Exception:  # closing is best effort; one bad close must not stop the rest
                log.debug("closing a source failed source=%s", source.name, exc_info=True)

    def close(self) -> None:
        """Stop helpers and release resources."""
        self.notifier.notify("STOPPING=1")
        self._targets.close()
        self._runner.close()
        self._completions.shutdown(wait=True, cancel_futures=True)
        for w in self._watched:
            self._close_sources(w.close_sources())
            if (saved := saved_start(w.world.state)) is not None:
                self.history.save_progress(saved)
        self._close_sources([*self._host_sources, *self._gpus])
        self.history.close()
        self.stuck_sources = self._runner.stuck
        self.notifier.close()


def _log_edges(name: str, outcome: TargetOutcome) -> None:
    """The phase-change and stall lines of one target's tick."""
    s = outcome.snapshot.state
    if (edge := outcome.phase_edge) is not None:
        level = logging.WARNING if edge.after in (Phase.FAILED, Phase.DEGRADED) else logging.INFO
        log.log(
            level,
            "phase changed target=%s from=%s to=%s after_s=%.0f reason=%r",
            name,
            edge.before,
            edge.after,
            edge.after_seconds,
            edge.reason,
        )
    if outcome.stalled_now:
        log.warning("stalled target=%s phase=%s reason=%r", name, s.phase, s.stall_reason)


def _status_line(snap: Snapshot) -> str:
    parts = [
        f"{t.info.name}={t.state.phase}" + ("(stalled)" if t.state.stalled else "")
        for t in snap.targets
    ]
    return "STATUS=" + (" ".join(parts) if parts else "no targets")


def target_states(snap: Snapshot) -> Mapping[str, TargetState]:
    """Target name -> state of a snapshot (for callers that look targets up by name)."""
    return {t.info.name: t.state for t in snap.targets}

"""The imperative shell: sample every source under deadlines, step the core, publish a Snapshot.

One loop at a fixed interval (timer-driven on purpose: stall timers and rates need history
whether or not anyone scrapes). Sources run through ``run_source`` so a failing one becomes
data; the loop itself never dies of a source. Scrapes read ``Daemon.latest`` only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from exporter import __version__
from exporter.base.errors import ConfigErrors
from exporter.base.model import (
    STARTUP_PHASES,
    STEADY_PHASES,
    GpuReading,
    LogReading,
    Observation,
    Phase,
    ProbeResult,
    ProcessSample,
    SourceStatus,
)
from exporter.base.records import ColdStart
from exporter.config import Settings, Target
from exporter.core.advice import Verdicts, follow_bounds
from exporter.core.bounds import Bounds
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import (
    TargetState,
    Thresholds,
    initial_state,
    learned_stall_seconds,
    resume,
    saved_start,
    shifted,
)
from exporter.core.observe import (
    TargetReadings,
    TargetWorld,
    advance,
    attribute_gpu_memory,
    forget_departed,
    host_readings,
    note_instance,
    observe,
)
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.core.trail import Trails, follow
from exporter.history import History
from exporter.sdnotify import Notifier
from exporter.sources import Source, SourceCall, SourceHealth, SourceResult, SourceRunner
from exporter.sources.disk import DiskSource
from exporter.sources.gpu.vendors import merge_readings, vendor_sources
from exporter.sources.logs import FileLogSource, LogSource, make_log_source
from exporter.sources.pressure import MemoryPressureSource
from exporter.sources.probe import Prober
from exporter.sources.process import ProcessSource

if TYPE_CHECKING:
    from exporter.discovery.watch import Discovery

log = logging.getLogger(__name__)
T_ = TypeVar("T_")
#: Finished cold starts shown per target (the page draws the previous one under this one).
RECENT_STARTS_SHOWN: Final = 2
_WEIGHT_SUFFIXES: Final = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".engine")


@dataclass
class _Watched:
    """Per-target sources and core-side memory, owned by the loop thread."""

    target: Target
    process: ProcessSource
    prober: Prober
    logs: LogSource | None
    world: TargetWorld
    thresholds: Thresholds
    typical_start_seconds: float | None
    p95_start_seconds: float | None
    recent_starts: tuple[ColdStart, ...]
    next_completion_at: float = 0.0
    completion: Future[ProbeResult] | None = None
    last_phase: Phase | None = None
    last_stalled: bool = False
    trails: Trails = field(default_factory=Trails)
    bounds: Bounds = field(default_factory=Bounds)
    verdicts: Verdicts = field(default_factory=Verdicts)

    def sources(self) -> list[Source[object]]:
        """The target's tick sources, the process tree first (the loop samples it first)."""
        found: list[Source[object]] = [self.process, self.prober]
        if self.logs is not None:
            found.append(self.logs)
        return found


def weights_size(model_path: str | None) -> int | None:
    """Bytes of model weights at a file or directory path; None when unknown."""
    if not model_path:
        return None
    path = Path(model_path)
    try:
        if path.is_file():
            return path.stat().st_size
        files = [p for p in path.rglob("*") if p.suffix in _WEIGHT_SUFFIXES and p.is_file()]
        return sum(p.stat().st_size for p in files) or None
    except OSError:
        return None


#: Wall minus monotonic moving by more than this between two reads is a clock step, not jitter.
CLOCK_STEP_SECONDS: Final = 1.0
#: Tick overruns are logged at most this often (with the count since the last line).
OVERRUN_LOG_SECONDS: Final = 60.0


class AnchoredClock:
    """Epoch seconds that advance with the monotonic clock, re-anchored when the wall clock steps.

    Between steps the time is ``anchor + monotonic``, so NTP slewing or a read that races a
    step never stretches or reverses the loop's timers. When wall minus monotonic moves by
    more than ``step_seconds`` (an NTP step after boot, a manual ``date -s``), the anchor moves
    to the new wall clock at once, so exported timestamps (``last_tick_timestamp_seconds``,
    ``/status``) are right again instead of off for the life of the process. The daemon then
    moves every kept timestamp by the same step (``stepped_seconds``), so no duration jumps.
    """

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        *,
        step_seconds: float = CLOCK_STEP_SECONDS,
    ) -> None:
        self._wall, self._mono, self._step_seconds = wall, mono, step_seconds
        self._offset = self._first_offset = wall() - mono()
        #: How many steps were seen, and the last one's size in seconds (+ forward).
        self.steps = 0
        self.last_step_seconds = 0.0

    def __call__(self) -> float:
        """Epoch seconds now (re-anchoring first when the wall clock stepped)."""
        mono = self._mono()
        offset = self._wall() - mono
        if abs(offset - self._offset) > self._step_seconds:
            self.steps += 1
            self.last_step_seconds = offset - self._offset
            self._offset = offset
            log.warning(
                "wall clock stepped, timestamps re-anchored step_s=%.3f steps=%d",
                self.last_step_seconds,
                self.steps,
            )
        return self._offset + mono

    @property
    def stepped_seconds(self) -> float:
        """How far the wall clock stepped in all since this clock was made (+ forward)."""
        return self._offset - self._first_offset


def anchored_clock(
    wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic
) -> AnchoredClock:
    """The daemon's clock: see ``AnchoredClock``."""
    return AnchoredClock(wall, mono)


class _OverrunLog:
    """Counts ticks that took longer than the interval; one warning a minute at most."""

    def __init__(self, every: float = OVERRUN_LOG_SECONDS) -> None:
        self.total = 0
        self._every = every
        self._unlogged = 0
        self._logged_at: float | None = None

    def tick(self, took: float, interval: float, now_mono: float) -> None:
        """Note one tick of ``took`` seconds against ``interval``."""
        if took <= interval:
            return
        self.total += 1
        self._unlogged += 1
        if self._logged_at is not None and now_mono - self._logged_at < self._every:
            return
        log.warning(
            "tick overran the interval took_s=%.3f interval_s=%g overruns=%d total=%d "
            "(slow sources or too many targets: see inference_exporter_source_duration_seconds)",
            took,
            interval,
            self._unlogged,
            self.total,
        )
        self._logged_at, self._unlogged = now_mono, 0


class Daemon:
    """Owns the sources and the per-target states; ``tick()`` does one round, ``run()`` loops."""

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
        self._watched = [self._watch(t) for t in settings.targets]
        #: Discovered targets by name, with when (monotonic) their pod or container was last
        #: seen and which discovery (``kubernetes``, ``docker``) found it.
        self._discovered: dict[str, tuple[Target, float, str]] = {}
        self._shadowed: set[str] = set()
        self._discovery_error: str | None = None
        self._discoveries = _start_discoveries(settings, settings, {})
        self._completions = ThreadPoolExecutor(max_workers=2, thread_name_prefix="completion")
        self._runner = SourceRunner(max(2, min(16, len(self._watched) + 1)))
        self._ticks = 0
        self._history_errors = 0
        #: Source calls still running at ``close()`` (they hold threads Python cannot stop).
        self.stuck_sources = 0
        self._overruns = _OverrunLog()
        #: How much of the clock's steps the kept timestamps have been moved by.
        self._followed_step = 0.0

    def _watch(self, target: Target) -> _Watched:
        saved = self.history.saved_start(target.name)
        state = resume(saved) if saved is not None else initial_state(target.name)
        classifier = LogClassifier(target.profile.log, target.log_patterns)
        expected = self.history.expectations(target.history_name)
        return _Watched(
            target=target,
            process=ProcessSource(target),
            prober=Prober(target),
            logs=make_log_source(target, self.settings.state_directory),
            world=TargetWorld(state, classifier),
            thresholds=self._thresholds(target),
            typical_start_seconds=expected.typical_duration_seconds,
            p95_start_seconds=expected.p95_duration_seconds,
            recent_starts=tuple(self.history.starts(target.history_name, RECENT_STARTS_SHOWN)),
        )

    def _thresholds(self, target: Target) -> Thresholds:
        exp = self.history.expectations(target.history_name)
        stall = {
            p: learned_stall_seconds(exp.longest_quiet.get(p), target.stall.for_phase(p), p)
            for p in STARTUP_PHASES
        }
        return Thresholds(
            stall_seconds=stall,
            weights_bytes=weights_size(target.model_path),
            expected_peak_gpu_bytes=exp.peak_gpu_bytes,
            expected_phase_seconds=exp.phase_seconds,
        )

    # --- one tick ---------------------------------------------------------------------------

    def tick(self) -> Snapshot:
        """Sample every source once, observe and step every target, publish the snapshot."""
        started = time.perf_counter()
        self._follow_discovery()
        completions = [self._collect_completion(w) for w in self._watched]
        deadline = time.monotonic() + self.settings.interval_seconds
        # Process trees first (a few ms of /proc reads), everything else after: an engine's
        # last log lines are then read after it was seen gone, so its fatal line and its exit
        # arrive in the same tick and the reason is the line's, not a bare "exited".
        first = [SourceCall(w.process, w.target.name) for w in self._watched]
        rest = [SourceCall(s) for s in self._tick_host_sources()] + [
            SourceCall(s, w.target.name) for w in self._watched for s in w.sources()[1:]
        ]
        calls = first + rest
        results = self._runner.run(first, deadline) + self._runner.run(rest, deadline)
        by_source = {id(c.source): r for c, r in zip(calls, results, strict=True)}
        statuses = [r.status for r in results]
        now = self._clock()
        self._follow_clock_step()
        host = host_readings({s.name: by_source[id(s)].value for s in self._host_sources})
        gpu = self._gpu_readings(by_source)
        readings = [
            _target_readings(w, by_source, done, self._followed_step)
            for w, done in zip(self._watched, completions, strict=True)
        ]
        for w, r in zip(self._watched, readings, strict=True):
            note_instance(w.world, r)
        attribution = attribute_gpu_memory(
            gpu,
            {  # an exited (zombie) main's tree is over: what it left behind is orphaned
                w.target.name: r.process.pids
                for w, r in zip(self._watched, readings, strict=True)
                if r.process is not None and not r.process.zombie
            },
            {w.target.name: w.world.previous_pids for w in self._watched if w.world.previous_pids},
        )
        targets = []
        for w, r in zip(self._watched, readings, strict=True):
            seen = observe(
                w.target.name, w.world, r, host, gpu, attribution, gpus=w.target.gpus, now=now
            )
            forget_departed(w.world, w.target.name, attribution)
            target = self._advance(w, seen.observation, now, seen.gpu_memory_bytes)
            orphaned = tuple(sorted(attribution.orphaned.get(w.target.name, {}).items()))
            target = replace(
                target, orphaned_gpu_memory_bytes=orphaned, mig_memory_bytes=seen.mig_memory_bytes
            )
            targets.append(_with_log_backlog(target, w, r.logs, now))
            self._schedule_completion(w, now)
        statuses.append(self._history_status())
        for kind, discovery in self._discoveries.items():
            health = discovery.health()
            statuses.append(SourceStatus(kind, health.up, 0.0, health.error))
        for st in statuses:
            self._health.record(st)
            if not st.up and not st.absent:
                self._errors[st.source] = self._errors.get(st.source, 0) + 1
        took = time.perf_counter() - started
        self._overruns.tick(took, self.settings.interval_seconds, time.monotonic())
        snap = Snapshot(
            taken_at=now,
            targets=tuple(targets),
            gpus=gpu.gpus,
            migs=gpu.migs,
            gpu_stale=gpu.stale,
            foreign_gpu_memory_bytes=tuple(sorted(attribution.foreign.items())),
            unattributed_gpu_processes=attribution.unattributed_pids,
            host=host,
            sources=tuple(statuses),
            source_errors=tuple(sorted(self._errors.items())),
            tick_duration_seconds=took,
            tick_overruns=self._overruns.total,
            version=__version__,
            all_gpu_health=self.settings.gpu_health_metrics == "all",
        )
        self.latest = snap  # one reference swap: scrapes see the old or the new, never half
        self._ticks += 1
        return snap

    def _follow_clock_step(self) -> None:
        """Move every kept timestamp by a wall-clock step the clock just re-anchored on."""
        step = self._clock.stepped_seconds - self._followed_step
        if not step:
            return
        self._followed_step += step
        for w in self._watched:
            w.world.state = shifted(w.world.state, step)
            w.next_completion_at += step

    def _tick_host_sources(self) -> list[Source[object]]:
        return [*self._host_sources, *self._gpus]

    def _gpu_readings(self, by_source: Mapping[int, SourceResult[object]]) -> GpuReading:
        """This tick's GPU reading: each vendor's, or its last one marked stale when it failed."""
        if not self._gpus:
            return self._gpu_reading
        for i, source in enumerate(self._gpus):
            reading = by_source[id(source)].value
            if isinstance(reading, GpuReading):
                self._vendor_readings[i] = reading
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

    def _schedule_completion(self, w: _Watched, now: float) -> None:
        """Start a completion probe when one is due; it runs beside the loop, never in a tick."""
        if (
            w.target.completion
            and w.world.state.ready
            and now >= w.next_completion_at
            and w.completion is None
        ):
            w.completion = self._completions.submit(w.prober.probe_completion)
            w.next_completion_at = now + w.target.completion.interval_seconds

    @staticmethod
    def _collect_completion(w: _Watched) -> ProbeResult | None:
        """The finished completion probe's result, once."""
        if w.completion is None or not w.completion.done():
            return None
        result, w.completion = w.completion.result(), None
        return result

    def _advance(
        self, w: _Watched, obs: Observation, now: float, per_gpu: tuple[tuple[int, int], ...]
    ) -> TargetSnapshot:
        if self._on_step is not None:
            self._on_step(obs, now, w.thresholds)
        w.world = advance(w.world, obs, now, w.thresholds)
        state = w.world.state
        w.trails = follow(w.trails, obs, state, per_gpu)
        w.bounds, w.verdicts = follow_bounds(
            w.bounds, w.verdicts, obs, state, self._gpu_reading.gpus, per_gpu
        )
        self._log_edges(w)
        if state.finished_start is not None:
            key = w.target.history_name  # a workload's replicas learn from each other
            self.history.record(key, w.target.engine, w.target.model, state.finished_start)
            w.thresholds = self._thresholds(w.target)
            expected = self.history.expectations(key)
            w.typical_start_seconds = expected.typical_duration_seconds
            w.p95_start_seconds = expected.p95_duration_seconds
            w.recent_starts = tuple(self.history.starts(key, RECENT_STARTS_SHOWN))
        if state.phase is not w.last_phase or state.phase in STARTUP_PHASES:
            self._save_progress(w)
        w.last_phase, w.last_stalled = state.phase, state.stalled
        w.process.steady = state.phase in STEADY_PHASES
        where = w.target.pod
        info = TargetInfo(
            w.target.name,
            w.target.engine,
            w.target.deployment,
            w.target.model,
            *((where.namespace, where.pod, where.container) if where else ()),
        )
        return TargetSnapshot(
            info=info,
            state=state,
            process=obs.process,
            gpu_memory_bytes=per_gpu,
            typical_start_seconds=w.typical_start_seconds,
            p95_start_seconds=w.p95_start_seconds,
            recent_starts=w.recent_starts,
            trails=w.trails,
            verdicts=w.verdicts,
            stall_threshold_seconds=w.thresholds.stall_seconds.get(state.phase),
        )

    def _save_progress(self, w: _Watched) -> None:
        if (saved := saved_start(w.world.state)) is not None:
            self.history.save_progress(saved)

    def _log_edges(self, w: _Watched) -> None:
        s = w.world.state
        if w.last_phase is not None and s.phase is not w.last_phase:
            elapsed = now_minus(s.phase_since, s.create_time)
            level = logging.WARNING if s.phase in (Phase.FAILED, Phase.DEGRADED) else logging.INFO
            log.log(
                level,
                "phase changed target=%s from=%s to=%s after_s=%.0f reason=%r",
                w.target.name,
                w.last_phase,
                s.phase,
                elapsed,
                s.reason,
            )
        if s.stalled and not w.last_stalled:
            log.warning(
                "stalled target=%s phase=%s reason=%r", w.target.name, s.phase, s.stall_reason
            )

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
        except Exception as exc:  # ConfigError, or anything else: the loop outlives a reload
            log.error("config reload failed, keeping the running config first=%r", str(exc))
            return False
        try:
            discoveries = _start_discoveries(settings, self.settings, self._discoveries)
        except Exception as exc:  # credentials unreadable: never end the loop
            log.error("config reload failed, keeping the running config first=%r", str(exc))
            return False
        fresh = [d for k, d in discoveries.items() if d is not self._discoveries.get(k)]
        try:
            self._set_targets([*settings.targets, *self._discovered_targets(settings, discoveries)])
        except Exception as exc:  # e.g. a world-readable api_key_file; never end the loop
            for discovery in fresh:
                discovery.close()
            log.error("config reload failed, keeping the running config first=%r", str(exc))
            return False
        for kind, old in self._discoveries.items():
            # The old watcher's targets stay for their grace, as for any gone pod; a
            # discovery turned off takes its targets along at once.
            if discoveries.get(kind) is not old:
                old.close()
        self._discovered = {n: f for n, f in self._discovered.items() if f[2] in discoveries}
        self._discoveries = discoveries
        self.settings = settings
        log.info(
            "config reloaded targets=%s interval_s=%g",
            ",".join(sorted(w.target.name for w in self._watched)) or "-",
            settings.interval_seconds,
        )
        return True

    def _set_targets(self, targets: list[Target]) -> None:
        """Watch exactly ``targets``: unchanged ones go on, changed ones keep their state.

        Raises:
            Exception: a target's sources could not be built; nothing was changed.
        """
        old = {w.target.name: w for w in self._watched}
        watched = [self._rewatch(t, old.get(t.name)) for t in targets]
        for w in old.values():
            if w not in watched:
                self._close_sources(w.sources())
        self._watched = watched

    def _follow_discovery(self) -> None:
        """Merge the discovered targets into the watched ones, when they changed."""
        if not self._discoveries:
            return
        kept = {w.target.name for w in self._watched}
        now = time.monotonic()
        for kind, discovery in self._discoveries.items():
            for found in discovery.snapshot():
                self._discovered[found.target.name] = (found.target, now, kind)
        for name, (_target, seen, kind) in list(self._discovered.items()):
            if now - seen > _grace_seconds(self.settings, kind):
                del self._discovered[name]
                log.info("discovered target dropped target=%s after_s=%.0f", name, now - seen)
        targets = [
            *self.settings.targets,
            *self._discovered_targets(self.settings, self._discoveries),
        ]
        if targets == [w.target for w in self._watched]:
            return
        try:
            self._set_targets(targets)
        except Exception as exc:  # one odd pod must not end the loop; retried next tick
            if str(exc) != self._discovery_error:  # once per problem, not once per tick
                log.error("discovered targets not applied first=%r", str(exc))
            self._discovery_error = str(exc)
            return
        self._discovery_error = None
        for name in sorted({w.target.name for w in self._watched} - kept):
            log.info("discovered target added target=%s", name)

    def _discovered_targets(
        self, settings: Settings, discoveries: Mapping[str, Discovery]
    ) -> list[Target]:
        """Targets of the running ``discoveries``, less those a static target's name takes."""
        static = {t.name for t in settings.targets}
        found = {n: f for n, f in self._discovered.items() if f[2] in discoveries}
        shadowed = {name for name in found if name in static}
        for name in sorted(shadowed - self._shadowed):
            log.warning("discovered target shadowed by a static one target=%s", name)
        self._shadowed = shadowed
        return [t for name, (t, _seen, _kind) in sorted(found.items()) if name not in static]

    def _rewatch(self, target: Target, old: _Watched | None) -> _Watched:
        if old is not None and old.target == target:
            return old
        fresh = self._watch(target)
        if old is not None:
            fresh.world = TargetWorld(old.world.state, fresh.world.classifier)
        return fresh

    def _close_sources(self, sources: list[Source[object]]) -> None:
        for source in sources:
            self._runner.forget(source)
            try:
                source.close()
            except Exception:  # closing is best effort; one bad close must not stop the rest
                log.debug("closing a source failed source=%s", source.name, exc_info=True)

    def close(self) -> None:
        """Stop helpers and release resources."""
        self.notifier.notify("STOPPING=1")
        for discovery in self._discoveries.values():
            discovery.close()
        self._runner.close()
        self._completions.shutdown(wait=True, cancel_futures=True)
        for w in self._watched:
            self._close_sources(w.sources())
            self._save_progress(w)
        self._close_sources(self._tick_host_sources())
        self.history.close()
        self.stuck_sources = self._runner.stuck
        self.notifier.close()


def _discovery_settings(settings: Settings) -> dict[str, object]:
    """Each discovery's section by kind (the kind is also its source's name)."""
    return {"kubernetes": settings.kubernetes, "docker": settings.docker}


def _grace_seconds(settings: Settings, kind: str) -> float:
    """How long a gone pod's or container's targets keep their final state."""
    section = settings.kubernetes if kind == "kubernetes" else settings.docker
    return section.grace_seconds if section is not None else 0.0


def _start_discoveries(
    settings: Settings, running: Settings, started: Mapping[str, Discovery]
) -> dict[str, Discovery]:
    """The discovery clients ``settings`` asks for, started or kept.

    Those of ``started`` whose section is as in ``running`` go on; the others start now.

    Raises:
        ConfigError: the Kubernetes credentials cannot be loaded (``check-config`` says so
            first); the clients started here are closed again.
    """
    wanted, before = _discovery_settings(settings), _discovery_settings(running)
    discoveries: dict[str, Discovery] = {}
    try:
        for kind, section in wanted.items():
            if section is None:
                continue
            old = started.get(kind)
            keep = old is not None and section == before[kind]
            discoveries[kind] = (
                old if old is not None and keep else _start_discovery(settings, kind)
            )
    except Exception:
        for kind, discovery in discoveries.items():
            if discovery is not started.get(kind):
                discovery.close()
        raise
    return discoveries


def _start_discovery(settings: Settings, kind: str) -> Discovery:
    """The started client of the ``[discovery.<kind>]`` section, which ``settings`` has."""
    # Imported here: a host without discovery never loads the watchers (nor PyYAML).
    from exporter.discovery.docker import ContainerWatcher
    from exporter.discovery.kubernetes import PodWatcher, load_credentials

    watcher: PodWatcher | ContainerWatcher
    if kind == "kubernetes" and settings.kubernetes is not None:
        credentials = load_credentials(settings.kubernetes, settings.source_path)
        watcher = PodWatcher(settings.kubernetes, credentials)
        log.info("kubernetes discovery started node=%s", settings.kubernetes.node_name)
    elif kind == "docker" and settings.docker is not None:
        watcher = ContainerWatcher(settings.docker)
        log.info("docker discovery started")
    else:
        raise ValueError(f"no [discovery.{kind}] section")
    watcher.start()
    return watcher


def _as(value: object, kind: type[T_]) -> T_ | None:
    """A source's value when it is of the expected type; None when the source failed."""
    return value if isinstance(value, kind) else None


def _with_log_backlog(
    target: TargetSnapshot, w: _Watched, logs: LogReading, now: float
) -> TargetSnapshot:
    """The log source's backlog on the target's snapshot (a file source knows its size)."""
    if not isinstance(w.logs, FileLogSource):
        return target
    lag = 0.0 if logs.behind_since is None else max(0.0, now - logs.behind_since)
    return replace(target, log_backlog_bytes=logs.backlog_bytes, log_lag_seconds=lag)


def _target_readings(
    w: _Watched,
    by_source: Mapping[int, SourceResult[object]],
    completion: ProbeResult | None,
    clock_step: float,
) -> TargetReadings:
    """One target's results of this tick as its typed readings.

    Process start times count from the boot time read when the exporter started; moved by
    the wall-clock steps since, they are on the daemon's clock like every other timestamp.
    """
    process = by_source[id(w.process)]
    logs = _as(by_source[id(w.logs)].value, LogReading) if w.logs is not None else None
    sample = _as(process.value, ProcessSample)
    if sample is not None and clock_step:
        sample = replace(sample, create_time=sample.create_time + clock_step)
    return TargetReadings(
        process=sample,
        process_error=None if process.status.up else process.status.error,
        logs=logs or LogReading(),
        health=_as(by_source[id(w.prober)].value, ProbeResult),
        completion=completion,
    )


def now_minus(since: float | None, start: float | None) -> float:
    """Seconds between a cold start's beginning and a phase change, 0 when unknown."""
    if since is None or start is None:
        return 0.0
    return max(0.0, since - start)


def _status_line(snap: Snapshot) -> str:
    parts = [
        f"{t.info.name}={t.state.phase}" + ("(stalled)" if t.state.stalled else "")
        for t in snap.targets
    ]
    return "STATUS=" + (" ".join(parts) if parts else "no targets")


def target_states(snap: Snapshot) -> Mapping[str, TargetState]:
    """Target name -> state of a snapshot (for callers that look targets up by name)."""
    return {t.info.name: t.state for t in snap.targets}

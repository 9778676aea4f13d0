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
from typing import Final, TypeVar

from exporter import __version__
from exporter.config import Settings, Target
from exporter.core.classify import LogClassifier
from exporter.core.lifecycle import (
    ColdStart,
    TargetState,
    Thresholds,
    initial_state,
    learned_stall_seconds,
    step,
)
from exporter.core.model import (
    STARTUP_PHASES,
    GpuReading,
    LogEvent,
    Observation,
    Phase,
    ProbeResult,
    SourceStatus,
)
from exporter.core.snapshot import Snapshot, TargetInfo, TargetSnapshot
from exporter.errors import ConfigError, ConfigErrors
from exporter.history import History
from exporter.sdnotify import Notifier
from exporter.sources import SourceHealth, SourceResult, run_source
from exporter.sources.disk import DiskSource
from exporter.sources.gpu import GpuSource, attribute_gpu_memory, visible_gpu_pids
from exporter.sources.logs import LogSource, make_log_source
from exporter.sources.probe import Prober
from exporter.sources.process import ProcessSource

log = logging.getLogger(__name__)
T_ = TypeVar("T_")
#: Log lines classified per target per tick; a backlog drains over the next ticks.
LOG_LINES_PER_TICK: Final = 1000
#: Finished cold starts shown per target (the page draws the previous one under this one).
RECENT_STARTS_SHOWN: Final = 2
_WEIGHT_SUFFIXES: Final = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".engine")


@dataclass
class _Watched:
    """Per-target sources and state, owned by the loop thread."""

    target: Target
    process: ProcessSource
    prober: Prober
    logs: LogSource | None
    classifier: LogClassifier
    thresholds: Thresholds
    typical_start_seconds: float | None
    recent_starts: tuple[ColdStart, ...]
    state: TargetState
    next_completion_at: float = 0.0
    completion: Future[ProbeResult] | None = None
    last_phase: Phase | None = None
    last_stalled: bool = False


@dataclass
class _SampledTarget:
    obs: Observation
    statuses: list[SourceStatus] = field(default_factory=list)


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


def anchored_clock(
    wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic
) -> Callable[[], float]:
    """Epoch seconds that advance with the monotonic clock.

    Read the wall clock once and add monotonic time from then on, so an NTP step or a manual
    clock change does not stretch or reverse stall timers and durations.
    """
    wall0, mono0 = wall(), mono()
    return lambda: wall0 + (mono() - mono0)


class Daemon:
    """Owns the sources and the per-target states; ``tick()`` does one round, ``run()`` loops."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] | None = None,
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
        self._disk = DiskSource([t.model_path for t in settings.targets if t.model_path])
        self._gpu = (
            GpuSource(library_dir=settings.nvml_library_dir, child_env=gpu_env)
            if settings.nvml
            else None
        )
        self._gpu_reading = GpuReading(gpus=())
        self._watched = [self._watch(t) for t in settings.targets]
        self._completions = ThreadPoolExecutor(max_workers=2, thread_name_prefix="completion")
        self._pool = ThreadPoolExecutor(
            max_workers=max(2, min(16, len(self._watched) + 1)), thread_name_prefix="sample"
        )
        self._ticks = 0
        self._history_errors = 0

    def _watch(self, target: Target) -> _Watched:
        classifier = LogClassifier(target.profile.log, target.log_patterns)
        logs = make_log_source(target, classifier, self.settings.state_directory)
        state = self.history.restore(target.name) or initial_state(target.name)
        return _Watched(
            target=target,
            process=ProcessSource(target),
            prober=Prober(target),
            logs=logs,
            classifier=classifier,
            thresholds=self._thresholds(target),
            typical_start_seconds=self.history.expectations(target.name).typical_duration_seconds,
            recent_starts=tuple(self.history.starts(target.name, RECENT_STARTS_SHOWN)),
            state=state,
        )

    def _thresholds(self, target: Target) -> Thresholds:
        exp = self.history.expectations(target.name)
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
        """Sample everything once, step every target, publish and return the snapshot."""
        started = time.perf_counter()
        if self._gpu is not None:
            self._gpu.prefetch()  # NVML works in its child while we sample the rest
        futures = [self._pool.submit(self._sample_target, w) for w in self._watched]
        statuses: list[SourceStatus] = []
        disk = self._record(run_source("disk", self._disk.sample), statuses)
        gpu_pids_by_target: dict[str, tuple[int, ...]] = {}
        sampled = [f.result() for f in futures]
        for w, s in zip(self._watched, sampled, strict=True):
            statuses.extend(s.statuses)
            if s.obs.process is not None:
                gpu_pids_by_target[w.target.name] = s.obs.process.pids
        gpu = self._sample_gpus(statuses)
        attribution = attribute_gpu_memory(
            gpu, gpu_pids_by_target, visible_pids=visible_gpu_pids(gpu)
        )
        now = self._clock()
        targets = []
        for w, s in zip(self._watched, sampled, strict=True):
            per_gpu = attribution.per_target.get(w.target.name, {})
            if w.target.gpus is not None:
                per_gpu = {i: b for i, b in per_gpu.items() if i in w.target.gpus}
            obs = replace(
                s.obs,
                at=now,
                disk_read_bytes=disk.read_bytes if disk else None,
                gpu_memory_bytes=sum(per_gpu.values()) if gpu.gpus else None,
            )
            targets.append(self._advance(w, obs, now, tuple(sorted(per_gpu.items()))))
        statuses.append(self._history_status())
        for st in statuses:
            self._health.record(st)
            if not st.up:
                self._errors[st.source] = self._errors.get(st.source, 0) + 1
        snap = Snapshot(
            taken_at=now,
            targets=tuple(targets),
            gpus=gpu.gpus,
            gpu_stale=gpu.stale,
            foreign_gpu_memory_bytes=tuple(sorted(attribution.foreign.items())),
            unattributed_gpu_processes=attribution.unattributed_pids,
            disk=disk,
            sources=tuple(statuses),
            source_errors=tuple(sorted(self._errors.items())),
            tick_duration_seconds=time.perf_counter() - started,
            version=__version__,
        )
        self.latest = snap  # one reference swap: scrapes see the old or the new, never half
        self._ticks += 1
        return snap

    def _record(self, result: SourceResult[T_], statuses: list[SourceStatus]) -> T_ | None:
        statuses.append(result.status)
        return result.value

    def _history_status(self) -> SourceStatus:
        """The history store as a source: down when in memory or when writes fail."""
        failed = self.history.in_memory or self.history.errors > self._history_errors
        self._history_errors = self.history.errors
        error = "in_memory" if self.history.in_memory else ("write_failed" if failed else None)
        return SourceStatus("history", not failed, 0.0, error)

    def _sample_gpus(self, statuses: list[SourceStatus]) -> GpuReading:
        if self._gpu is None:
            return GpuReading(gpus=())
        result = run_source("nvml", self._gpu.sample)
        statuses.append(result.status)
        if result.value is not None:
            self._gpu_reading = result.value
        elif self._gpu_reading.gpus:
            self._gpu_reading = replace(self._gpu_reading, stale=True)
        return self._gpu_reading

    def _sample_target(self, w: _Watched) -> _SampledTarget:
        """Process, logs and probes of one target (runs in the pool, one thread per target)."""
        name, statuses = w.target.name, []
        proc = run_source("process", w.process.sample, target=name)
        statuses.append(proc.status)
        events: tuple[LogEvent, ...] = ()
        if (log_source := w.logs) is not None:
            logs = run_source("logs", lambda: log_source.read(LOG_LINES_PER_TICK), target=name)
            statuses.append(logs.status)
            events = logs.value or ()
        health = run_source("probe", w.prober.probe_health, target=name)
        statuses.append(health.status)
        completion = self._collect_completion(w)
        now = self._clock()
        if (
            w.target.completion
            and w.state.ready
            and now >= w.next_completion_at
            and w.completion is None
        ):
            # A real completion can take seconds: it runs beside the loop, never in a tick.
            w.completion = self._completions.submit(w.prober.probe_completion)
            w.next_completion_at = now + w.target.completion.interval_seconds
        obs = Observation(
            target=name,
            at=now,
            process=proc.value,
            process_error=None if proc.status.up else proc.status.error,
            health=health.value,
            completion=completion,
            log_events=events,
        )
        return _SampledTarget(obs, statuses)

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
        before = (w.state.pid, w.state.create_time)
        w.state = step(w.state, obs, now, w.thresholds)
        if before != (w.state.pid, w.state.create_time) and before[0] is not None:
            w.classifier.reset()  # a new process: its log starts a new story
        self._log_edges(w)
        if w.state.finished_start is not None:
            self.history.record(
                w.target.name, w.target.engine, w.target.model, w.state.finished_start
            )
            w.thresholds = self._thresholds(w.target)
            w.typical_start_seconds = self.history.expectations(
                w.target.name
            ).typical_duration_seconds
            w.recent_starts = tuple(self.history.starts(w.target.name, RECENT_STARTS_SHOWN))
        if w.state.phase is not w.last_phase or w.state.phase in STARTUP_PHASES:
            self.history.save_progress(w.state)
        w.last_phase, w.last_stalled = w.state.phase, w.state.stalled
        info = TargetInfo(w.target.name, w.target.engine, w.target.deployment, w.target.model)
        return TargetSnapshot(
            info=info,
            state=w.state,
            process=obs.process,
            gpu_memory_bytes=per_gpu,
            typical_start_seconds=w.typical_start_seconds,
            recent_starts=w.recent_starts,
        )

    def _log_edges(self, w: _Watched) -> None:
        s = w.state
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
        except ConfigError as exc:
            log.error("config reload failed, keeping the running config first=%r", str(exc))
            return False
        old = {w.target.name: w for w in self._watched}
        try:
            watched = [self._rewatch(t, old.get(t.name)) for t in settings.targets]
        except ConfigError as exc:  # e.g. a world-readable api_key_file
            log.error("config reload failed, keeping the running config first=%r", str(exc))
            return False
        kept = {w.target.name for w in watched}
        for name, w in old.items():
            if name not in kept or w not in watched:
                w.prober.close()
        self._watched, self.settings = watched, settings
        log.info(
            "config reloaded targets=%s interval_s=%g",
            ",".join(sorted(kept)) or "-",
            settings.interval_seconds,
        )
        return True

    def _rewatch(self, target: Target, old: _Watched | None) -> _Watched:
        if old is not None and old.target == target:
            return old
        fresh = self._watch(target)
        if old is not None:
            fresh.state = old.state
        return fresh

    def close(self) -> None:
        """Stop helpers and release resources."""
        self.notifier.notify("STOPPING=1")
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._completions.shutdown(wait=True, cancel_futures=True)
        for w in self._watched:
            w.prober.close()
            self.history.save_progress(w.state)
        if self._gpu is not None:
            self._gpu.close()
        self.history.close()
        self.notifier.close()


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

"""Simulated GPUs: what they hold, rendered in the text format the fake libnvidia-ml.so.1 reads.

Owns the state-file format and its atomic rewrite; knows nothing of phases or HTTP.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from exporter_tooling.fakenvml.state import gpu_line, proc_line, write_atomically, xid_line
from exporter_tooling.simulate.plan import GPU_NAME, MIB

log = logging.getLogger(__name__)

GIB: Final = 1 << 30
#: An H100 80GB HBM3 as nvidia-smi shows it: 81559 MiB total.
GPU_TOTAL_BYTES: Final = 81559 * MIB
#: One byte of simulated weight file stands for 100 bytes on every GPU, so the demo's 640 MiB
#: fill a GPU the way a 0.5-1 T parameter model fills each of its eight (DESIGN.md: ~76 GB).
GPU_BYTES_PER_FILE_BYTE: Final = 100
WEIGHTS_CAP_BYTES: Final = int(GPU_TOTAL_BYTES * 0.8)
KV_CACHE_BYTES: Final = 12 * GIB
#: vLLM's "Graph capturing finished in 33 secs, took 0.70 GiB" (shared/fixtures/logs/vllm-06).
CUDA_GRAPH_BYTES: Final = int(0.7 * GIB)
PUBLISH_SECONDS: Final = 0.2
_UUID_NAMESPACE: Final = uuid.UUID("6f1d2b1e-5a0c-4e55-9a52-3c1b8f0e7d10")


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """What every simulated GPU holds at one instant (TP ranks hold the same).

    Attributes:
        weights_fraction: share of the weights read so far, 0-1.
        kv_cache: the KV cache pool is allocated.
        graphs: CUDA graphs are captured (or being captured).
        util: GPU utilisation, percent.
        mem_util: memory-bandwidth utilisation, percent.
        xid: an Xid code GPU 0 reported (delivered once by the fake's event API).
    """

    weights_fraction: float = 0.0
    kv_cache: bool = False
    graphs: bool = False
    util: int = 0
    mem_util: int = 0
    xid: int | None = None


def weights_on_gpu(weights_bytes: int) -> int:
    """Bytes of weights each GPU holds once the load is complete."""
    return min(weights_bytes * GPU_BYTES_PER_FILE_BYTE, WEIGHTS_CAP_BYTES)


def used_bytes(load: GpuLoad, weights_bytes: int) -> int:
    """Memory used on each GPU: weights in proportion to the bytes read, then KV cache, graphs."""
    used = int(weights_on_gpu(weights_bytes) * min(max(load.weights_fraction, 0.0), 1.0))
    used += KV_CACHE_BYTES if load.kv_cache else 0
    used += CUDA_GRAPH_BYTES if load.graphs else 0
    return used


def gpu_uuid(index: int) -> str:
    """A stable, NVML-shaped UUID for simulated GPU ``index``."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'gpu-{index}')}"


def render_gpu_state(
    gpus: int, owners: Sequence[int], load: GpuLoad, weights_bytes: int, name: str = GPU_NAME
) -> str:
    """The state file's text: one ``gpu`` line per GPU, one ``proc`` line per GPU holding memory.

    Args:
        gpus: number of simulated GPUs.
        owners: the worker pid owning each GPU, by index; GPUs without an owner show no process.
        load: what each GPU holds.
        weights_bytes: size of the weight files.
        name: the GPUs' model name (no spaces).
    """
    used = used_bytes(load, weights_bytes)
    lines = [
        gpu_line(i, gpu_uuid(i), name, GPU_TOTAL_BYTES, used, load.util, load.mem_util)
        for i in range(gpus)
    ]
    if used > 0:
        lines += [proc_line(i, pid, used) for i, pid in enumerate(owners[:gpus])]
    if load.xid is not None:
        lines.append(xid_line(0, load.xid))
    return "\n".join(lines) + "\n"


def write_gpu_state(path: Path, text: str) -> None:
    """Replace the state file with ``text`` so the fake library never reads half of it."""
    write_atomically(path, text.encode("ascii"))


class GpuStatePublisher:
    """Rewrites the state file every ``PUBLISH_SECONDS`` from a callback, in a daemon thread.

    Args:
        path: the state file.
        gpus: number of simulated GPUs.
        weights_bytes: size of the weight files.
        current: returns the GPU load and the owner pid of each GPU, called on every rewrite.
        name: the GPUs' model name.
    """

    def __init__(
        self,
        path: Path,
        gpus: int,
        weights_bytes: int,
        current: Callable[[], tuple[GpuLoad, Sequence[int]]],
        name: str = GPU_NAME,
    ) -> None:
        self._path = path
        self._name = name
        self._gpus = gpus
        self._weights = weights_bytes
        self._current = current
        self._written = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-state", daemon=True)

    def start(self) -> None:
        """Write the first state (raises OSError when the file cannot be written), then loop."""
        self._publish()
        self._thread.start()

    def close(self) -> None:
        """Stop rewriting and leave the GPUs empty, as they are once the engine exits."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        idle = render_gpu_state(self._gpus, [], GpuLoad(), self._weights, self._name)
        write_gpu_state(self._path, idle)

    def _publish(self) -> None:
        load, owners = self._current()
        text = render_gpu_state(self._gpus, owners, load, self._weights, self._name)
        if text != self._written:  # an unchanged state costs no write: a hang stays idle
            write_gpu_state(self._path, text)
            self._written = text

    def _loop(self) -> None:
        failing = False
        while not self._stop.wait(PUBLISH_SECONDS):
            try:
                self._publish()
            except OSError as exc:
                if not failing:
                    log.warning("gpu_state_write_failed path=%s error=%s", self._path, exc)
                failing = True
            else:
                failing = False

"""Host disk source: cumulative bytes read from whole disks, from ``/proc/diskstats``.

I/O only. Partitions and stacked devices (dm-*, md*, loop) are never summed with the disks
under them; the parsing and summing are pure functions so tests can feed any kernel's text.
"""

from __future__ import annotations

import enum
import logging
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from exporter.base.errors import SourceError
from exporter.base.model import DiskSample

log = logging.getLogger(__name__)

DISKSTATS: Final = "/proc/diskstats"
MOUNTINFO: Final = "/proc/self/mountinfo"
SYS_ROOT: Final = "/sys"
#: /proc/diskstats counts sectors of 512 bytes whatever the device's block size.
SECTOR_BYTES: Final = 512
# Kernel 4.18 added 4 discard fields (18), 5.5 two flush fields (20); older have 14.
_MIN_FIELDS: Final = 14
_SECTORS_READ: Final = 5
_MAX_STACK_DEPTH: Final = 8
# Used only when sysfs does not know a device (a container without /sys/block).
_PARTITION_NAME: Final = re.compile(
    r"^(?:(?:nvme\d+n\d+|mmcblk\d+|nbd\d+|loop\d+|md\d+)p\d+|(?:[hsv]|xv)d[a-z]+\d+)$"
)
_STACKED_NAME: Final = re.compile(r"^(?:dm-\d+|md\d+|loop\d+|bcache\d+|drbd\d+)$")
_MEMORY_NAME: Final = re.compile(r"^(?:z?ram\d+|brd\d+)$")


class DeviceKind(enum.StrEnum):
    """What a block device is, as far as summing reads goes; only ``disk`` is summed."""

    DISK = "disk"
    PARTITION = "partition"
    STACKED = "stacked"
    MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class DiskStat:
    """One line of /proc/diskstats, reduced to what the exporter uses."""

    major: int
    minor: int
    name: str
    sectors_read: int

    @property
    def read_bytes(self) -> int:
        """Bytes read since boot."""
        return self.sectors_read * SECTOR_BYTES


def parse_diskstats(text: str) -> list[DiskStat]:
    """Parse /proc/diskstats text (14, 18 or 20 fields a line); malformed lines are skipped.

    Pure: no I/O, so any kernel's layout can be fed by tests.
    """
    stats: list[DiskStat] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < _MIN_FIELDS or not _all_digits(fields, skip=2):
            log.debug("diskstats line skipped line=%d fields=%d", line_no, len(fields))
            continue
        stats.append(
            DiskStat(int(fields[0]), int(fields[1]), fields[2], int(fields[_SECTORS_READ]))
        )
    return stats


def _all_digits(fields: list[str], *, skip: int) -> bool:
    # one C call a line, not one per field: split() never yields an empty field
    return "".join(fields[:skip] + fields[skip + 1 :]).isdigit()


def classify_by_name(name: str) -> DeviceKind:
    """Guess a device's kind from its kernel name (the fallback when sysfs has no entry)."""
    if _MEMORY_NAME.match(name):
        return DeviceKind.MEMORY
    if _PARTITION_NAME.match(name):
        return DeviceKind.PARTITION
    if _STACKED_NAME.match(name):
        return DeviceKind.STACKED
    return DeviceKind.DISK


def sum_whole_disks(
    stats: Sequence[DiskStat],
    kinds: Mapping[str, DeviceKind],
    only: Collection[str] | None = None,
) -> DiskSample:
    """Sum the read bytes of whole disks, optionally only those named in ``only``.

    Pure. A partition's reads also count in its disk, and a dm/md/loop device's reads in the
    disks under it, so summing anything but whole disks would count the same bytes twice.
    Devices missing from ``kinds`` are classified by name.
    """
    chosen = [
        s
        for s in stats
        if (kinds[s.name] if s.name in kinds else classify_by_name(s.name)) is DeviceKind.DISK
        and (only is None or s.name in only)
    ]
    return DiskSample(
        read_bytes=sum(s.read_bytes for s in chosen),
        devices=tuple(sorted(s.name for s in chosen)),
    )


class DiskSource:
    """Samples host disk reads: of the disks holding ``paths``, or of every whole disk.

    Args:
        paths: files or directories (e.g. the model path); each is resolved once to the
            whole disk(s) under it, through partitions, dm/md and loop devices. A path not
            on a block device (tmpfs, NFS, overlay) falls back to every whole disk.
        sys_root: where sysfs is mounted; tests point it at a built tree.
    """

    name: Final = "disk"

    def __init__(self, paths: Sequence[str] = (), *, sys_root: str = SYS_ROOT) -> None:
        self._paths = (paths,) if isinstance(paths, str) else tuple(paths)
        self._sys = sys_root
        self._kinds: dict[str, DeviceKind] = {}
        self._only: frozenset[str] | None = None
        self._resolved = not self._paths

    def sample(self, deadline: float | None = None) -> DiskSample:
        """Cumulative bytes read from the chosen whole disks since boot (one file read).

        Raises:
            SourceError: /proc/diskstats is missing ("not_visible", e.g. ``ProcSubset=pid``)
                or unreadable ("permission_denied").
        """
        stats = parse_diskstats(_read_diskstats())
        for stat in stats:
            if stat.name not in self._kinds:
                self._kinds[stat.name] = classify_device(stat.name, sys_root=self._sys)
        if not self._resolved:
            self._only = self._resolve()
            self._resolved = True
        return sum_whole_disks(stats, self._kinds, self._only)

    def close(self) -> None:
        """Nothing to release: each sample opens and closes /proc/diskstats."""

    def _resolve(self) -> frozenset[str] | None:
        disks: set[str] = set()
        for path in self._paths:
            found = disks_for_path(path, sys_root=self._sys)
            if not found:
                log.warning("disk source path not on a block device path=%s using=all", path)
                return None
            disks |= found
        log.info("disk source devices=%s paths=%d", ",".join(sorted(disks)), len(self._paths))
        return frozenset(disks)


def _read_diskstats() -> str:
    try:
        with open(DISKSTATS, encoding="ascii", errors="replace") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise SourceError("not_visible", f"{DISKSTATS} missing") from exc
    except PermissionError as exc:
        raise SourceError("permission_denied", f"{DISKSTATS} unreadable") from exc


def classify_device(name: str, *, sys_root: str = SYS_ROOT) -> DeviceKind:
    """Classify a block device from sysfs (``partition`` file, ``slaves``, loop backing)."""
    device = os.path.join(sys_root, "class", "block", name)
    if not os.path.isdir(device):
        return classify_by_name(name)
    if os.path.exists(os.path.join(device, "partition")):
        return DeviceKind.PARTITION
    if _listdir(os.path.join(device, "slaves")) or os.path.isdir(os.path.join(device, "loop")):
        return DeviceKind.STACKED
    return classify_by_name(name)  # unattached loop devices and zram have no sysfs marker


def disks_for_path(path: str, *, sys_root: str = SYS_ROOT, depth: int = 0) -> set[str]:
    """The whole disks holding ``path`` (its nearest existing ancestor); empty when none."""
    dev = _device_of(path)
    if dev is None or depth > _MAX_STACK_DEPTH:
        return set()
    link = os.path.join(sys_root, "dev", "block", f"{os.major(dev)}:{os.minor(dev)}")
    if not os.path.exists(link):
        return set()
    return _whole_disks(os.path.realpath(link), sys_root, depth)


def _whole_disks(device: str, sys_root: str, depth: int) -> set[str]:
    """Whole disks under the sysfs device directory ``device``, through any stacking."""
    if os.path.exists(os.path.join(device, "partition")):
        return {os.path.basename(os.path.dirname(device))}
    slaves = _listdir(os.path.join(device, "slaves"))
    if slaves and depth < _MAX_STACK_DEPTH:
        disks: set[str] = set()
        for slave in slaves:
            member = os.path.realpath(os.path.join(sys_root, "class", "block", slave))
            disks |= _whole_disks(member, sys_root, depth + 1)
        return disks
    backing = _read_text(os.path.join(device, "loop", "backing_file"))
    if backing:
        return disks_for_path(backing, sys_root=sys_root, depth=depth + 1)
    return {os.path.basename(device)}


def _device_of(path: str) -> int | None:
    """st_dev of ``path`` or its nearest existing ancestor, through mountinfo for btrfs."""
    probe = os.path.abspath(path)
    while True:
        try:
            dev = os.stat(probe).st_dev
            break
        except FileNotFoundError:
            if probe == os.path.dirname(probe):
                return None
            probe = os.path.dirname(probe)
        except OSError:
            return None
    if os.major(dev) != 0:
        return dev
    # btrfs and similar report an anonymous device; mountinfo names the real source.
    source = mount_source(probe, _read_text(MOUNTINFO))
    try:
        return os.stat(source).st_rdev if source and source.startswith("/dev/") else None
    except OSError:
        return None


def mount_source(path: str, mountinfo: str) -> str | None:
    """The mount source (e.g. ``/dev/nvme0n1p2``) of the mount holding ``path``. Pure."""
    best, source = "", None
    for line in mountinfo.splitlines():
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 2:
            continue
        point = fields[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, source = point, rest[1]
    return source


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""

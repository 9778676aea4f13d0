"""The disk source: /proc/diskstats layouts, stacked devices counted once (RELIABILITY 49)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.sources import disk, run_source
from exporter.sources.disk import (
    DeviceKind,
    DiskSource,
    classify_by_name,
    classify_device,
    disks_for_path,
    mount_source,
    parse_diskstats,
    sum_whole_disks,
)
from tests.sources.conftest import DATA_BYTES, read_direct

# Same device, same counters, as three kernels print it: 14 fields (< 4.18), 18 (discards,
# 4.18+), 20 (flushes, 5.5+). Sectors read is the sixth field.
LINE_14 = " 259       0 nvme0n1 5000 10 800000 900 40 0 320 50 0 700 950"
LINE_18 = LINE_14 + " 3 0 24 1"
LINE_20 = LINE_18 + " 7 2"

# An NVMe disk with two partitions, a second disk, md0 mirroring a partition of each,
# dm-0 (LVM) on md0, a SATA disk, a loop device and zram: every byte read from a stacked
# device or a partition was also counted on a whole disk below it.
STACKED = """\
 259       0 nvme0n1 100 0 1000 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 259       1 nvme0n1p1 10 0 100 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 259       2 nvme0n1p2 90 0 900 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 259       3 nvme1n1 200 0 2000 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 259       4 nvme1n1p1 200 0 2000 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
   9       0 md0 290 0 2900 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 253       0 dm-0 290 0 2900 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
   8       0 sda 40 0 40000 0 0 0 0 0 0 0 0 0 0 0
   8       1 sda1 40 0 40000 0 0 0 0 0 0 0 0 0 0 0
   7       0 loop0 5 0 50 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 252       0 zram0 9 0 90 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
"""
STACKED_KINDS = {
    "nvme0n1": DeviceKind.DISK,
    "nvme0n1p1": DeviceKind.PARTITION,
    "nvme0n1p2": DeviceKind.PARTITION,
    "nvme1n1": DeviceKind.DISK,
    "nvme1n1p1": DeviceKind.PARTITION,
    "md0": DeviceKind.STACKED,
    "dm-0": DeviceKind.STACKED,
    "sda": DeviceKind.DISK,
    "sda1": DeviceKind.PARTITION,
    "loop0": DeviceKind.STACKED,
    "zram0": DeviceKind.MEMORY,
}


@pytest.mark.parametrize("line", [LINE_14, LINE_18, LINE_20], ids=["14", "18", "20"])
def test_every_kernel_layout_reads_the_same_sectors(line):
    (stat,) = parse_diskstats(line + "\n")
    assert (stat.major, stat.minor, stat.name) == (259, 0, "nvme0n1")
    assert stat.read_bytes == 800000 * 512


def test_stacked_devices_and_partitions_are_not_counted_twice():
    sample = sum_whole_disks(parse_diskstats(STACKED), STACKED_KINDS)
    assert sample.devices == ("nvme0n1", "nvme1n1", "sda")
    assert sample.read_bytes == (1000 + 2000 + 40000) * 512


def test_the_same_topology_is_recognised_from_names_alone():
    # What a container without /sys/block sees: the kinds come from the kernel names.
    assert sum_whole_disks(parse_diskstats(STACKED), {}) == sum_whole_disks(
        parse_diskstats(STACKED), STACKED_KINDS
    )


def test_only_the_disks_holding_the_model_are_summed():
    sample = sum_whole_disks(parse_diskstats(STACKED), STACKED_KINDS, only={"nvme1n1", "sda1"})
    assert sample.devices == ("nvme1n1",)
    assert sample.read_bytes == 2000 * 512


def test_malformed_lines_are_skipped_and_the_rest_is_read():
    text = "garbage\n 8 0 sda 1 2 3\n 8 16 sdb x 0 8 0 0 0 0 0 0 0 0\n\n" + LINE_20 + "\n"
    assert [s.name for s in parse_diskstats(text)] == ["nvme0n1"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sda", DeviceKind.DISK),
        ("vdb", DeviceKind.DISK),
        ("xvda", DeviceKind.DISK),
        ("nvme10n2", DeviceKind.DISK),
        ("mmcblk0", DeviceKind.DISK),
        ("sda3", DeviceKind.PARTITION),
        ("xvda1", DeviceKind.PARTITION),
        ("nvme0n1p12", DeviceKind.PARTITION),
        ("mmcblk0p1", DeviceKind.PARTITION),
        ("md127", DeviceKind.STACKED),
        ("dm-12", DeviceKind.STACKED),
        ("loop3", DeviceKind.STACKED),
        ("zram0", DeviceKind.MEMORY),
        ("ram15", DeviceKind.MEMORY),
    ],
)
def test_kernel_names_classify(name, kind):
    assert classify_by_name(name) is kind


MOUNTINFO = """\
22 1 0:31 / / rw,relatime shared:1 - btrfs /dev/nvme0n1p2 rw,ssd,subvol=/@
23 22 259:5 / /data rw,relatime shared:2 - ext4 /dev/sdb1 rw
24 23 0:40 / /data/my\\040models rw - xfs /dev/mapper/vg-models rw
25 22 0:41 / /dev/shm rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("/home/user", "/dev/nvme0n1p2"),
        ("/data", "/dev/sdb1"),
        ("/data/weights/model.safetensors", "/dev/sdb1"),
        ("/data/my models/x", "/dev/mapper/vg-models"),
        ("/datastore", "/dev/nvme0n1p2"),
        ("/dev/shm/x", "tmpfs"),
    ],
)
def test_mount_source_is_the_deepest_mount_holding_the_path(path, source):
    assert mount_source(path, MOUNTINFO) == source


def _fake_sysfs(root: Path, real_dev: int) -> Path:
    """A sysfs tree where ``real_dev`` is dm-0 on md0 on partitions of two NVMe disks."""
    devices = {
        "nvme0n1": root / "devices/pci/nvme0/nvme0n1",
        "nvme0n1p2": root / "devices/pci/nvme0/nvme0n1/nvme0n1p2",
        "nvme1n1": root / "devices/pci/nvme1/nvme1n1",
        "nvme1n1p1": root / "devices/pci/nvme1/nvme1n1/nvme1n1p1",
        "md0": root / "devices/virtual/block/md0",
        "dm-0": root / "devices/virtual/block/dm-0",
        "loop0": root / "devices/virtual/block/loop0",
    }
    for name, path in devices.items():
        (path / "slaves").mkdir(parents=True)
        (root / "class/block").mkdir(parents=True, exist_ok=True)
        (root / "class/block" / name).symlink_to(path)
    for part in ("nvme0n1p2", "nvme1n1p1"):
        (devices[part] / "partition").write_text("1\n")
    for holder, slaves in {"md0": ["nvme0n1p2", "nvme1n1p1"], "dm-0": ["md0"]}.items():
        for slave in slaves:
            (devices[holder] / "slaves" / slave).symlink_to(devices[slave])
    (devices["loop0"] / "loop").mkdir()
    (root / "dev/block").mkdir(parents=True)
    (root / f"dev/block/{os.major(real_dev)}:{os.minor(real_dev)}").symlink_to(devices["dm-0"])
    return root


def test_a_path_on_dm_on_md_resolves_to_the_whole_disks_under_it(tmp_path):
    sysfs = _fake_sysfs(tmp_path / "sys", os.stat(tmp_path).st_dev)
    model = tmp_path / "models" / "not-downloaded-yet.safetensors"  # nearest ancestor counts

    assert disks_for_path(str(model), sys_root=str(sysfs)) == {"nvme0n1", "nvme1n1"}
    kinds = {n: classify_device(n, sys_root=str(sysfs)) for n in STACKED_KINDS}
    assert kinds == STACKED_KINDS  # sysfs markers agree with the names


@pytest.mark.integration
def test_direct_reads_of_a_real_file_grow_the_counter_of_its_disk(data_file):
    source = DiskSource([str(data_file)])
    before = source.sample()
    read_direct(data_file)
    read_direct(data_file)
    after = source.sample()

    assert after.devices == before.devices and after.devices
    assert all(classify_device(name) is DeviceKind.DISK for name in after.devices)
    assert after.read_bytes - before.read_bytes >= 2 * DATA_BYTES


def test_every_whole_disk_by_default_and_never_a_partition_or_loop_device():
    sample = DiskSource().sample()
    with open("/proc/diskstats", encoding="ascii") as f:
        names = {line.split()[2] for line in f if line.strip()}
    disks = {n for n in names if classify_device(n) is DeviceKind.DISK}

    assert set(sample.devices) == disks
    assert not {n for n in sample.devices if n.startswith(("loop", "zram", "dm-", "md"))}


def test_missing_diskstats_is_a_failed_source_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "DISKSTATS", str(tmp_path / "diskstats"))  # as ProcSubset=pid

    result = run_source("disk", DiskSource().sample)

    assert not result.status.up and result.status.error == "not_visible"

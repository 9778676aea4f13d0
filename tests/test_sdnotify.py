"""sd_notify through a real NOTIFY_SOCKET: the datagrams systemd would read, and from whom."""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from exporter.sdnotify import Notifier
from tests.integration.harness import exporter

_CRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


@contextmanager
def notify_socket(address: str) -> Iterator[socket.socket]:
    """A bound datagram socket like systemd's, passing the sender's credentials."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind("\0" + address[1:] if address.startswith("@") else address)
        sock.settimeout(10)
        yield sock
    finally:
        sock.close()


def receive(sock: socket.socket) -> tuple[str, int]:
    """One datagram's text and the pid the kernel says sent it."""
    data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(_CRED.size))
    pid = next(
        _CRED.unpack(cdata[: _CRED.size])[0]
        for level, kind, cdata in ancillary
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
    )
    return data.decode(), pid


def test_fields_arrive_as_one_datagram_of_lines(tmp_path):
    path = str(tmp_path / "notify")
    with notify_socket(path) as sock:
        notifier = Notifier({"NOTIFY_SOCKET": path})
        try:
            assert notifier.enabled
            notifier.notify("READY=1", "STATUS=kimi=loading")
            notifier.notify("WATCHDOG=1")
            assert receive(sock) == ("READY=1\nSTATUS=kimi=loading", os.getpid())
            assert receive(sock)[0] == "WATCHDOG=1"
        finally:
            notifier.close()


def test_abstract_namespace_socket():
    address = f"@inference-lifecycle-test-{uuid.uuid4().hex}"
    with notify_socket(address) as sock:
        notifier = Notifier({"NOTIFY_SOCKET": address})
        try:
            notifier.notify("STOPPING=1")
            assert receive(sock)[0] == "STOPPING=1"
        finally:
            notifier.close()


@pytest.mark.parametrize("value", ["", "relative/path", "vsock:2:1234"])
def test_without_a_usable_socket_it_is_a_no_op(value):
    notifier = Notifier({"NOTIFY_SOCKET": value} if value else {})
    assert not notifier.enabled
    notifier.notify("READY=1")  # nothing to send to, nothing raised
    notifier.close()


def test_a_vanished_socket_is_logged_once_and_never_raises(tmp_path, caplog):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    try:
        with caplog.at_level(logging.WARNING, logger="exporter.sdnotify"):
            for _ in range(3):
                notifier.notify("WATCHDOG=1")
        assert [r.getMessage() for r in caplog.records] == [
            "sd_notify failed error=No such file or directory"
        ]
    finally:
        notifier.close()


@pytest.mark.parametrize(
    ("env", "seconds"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_from_the_environment(env, seconds):
    assert Notifier(env).watchdog_seconds == seconds


@pytest.mark.integration
def test_the_daemon_signals_ready_watchdog_status_and_stopping_from_its_main_pid(tmp_path):
    """What systemd sees with Type=notify and NotifyAccess=main: the exporter process itself."""
    address = f"@inference-lifecycle-test-{uuid.uuid4().hex}"
    target = '[[target]]\nname = "t"\nengine = "vllm"\nbase_url = "http://127.0.0.1:9"\n'
    with (
        notify_socket(address) as sock,
        exporter(tmp_path, target, interval=0.2, env={"NOTIFY_SOCKET": address}) as exp,
    ):
        first, pid = receive(sock)
        assert pid == exp.proc.pid
        assert first.splitlines() == ["READY=1", "STATUS=t=down"]
        beats = [receive(sock) for _ in range(3)]
        assert all(text.splitlines() == ["WATCHDOG=1", "STATUS=t=down"] for text, _ in beats)
        assert {p for _, p in beats} == {exp.proc.pid}
        exp.proc.send_signal(signal.SIGTERM)
        last = ""
        while last != "STOPPING=1":  # watchdog beats may still be queued ahead of it
            last, pid = receive(sock)
        assert pid == exp.proc.pid
        assert exp.proc.wait(timeout=10) == 0

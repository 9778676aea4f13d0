"""The scrape client: asks for /metrics the way Prometheus does and times every answer.

It runs in a process of its own (``python -m exporter_tooling.bench.scrape_client SPEC``), so
its CPU never counts against the server measured: one JSON spec in, one JSON summary line out.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Final

from exporter_tooling.bench.records import LatencySummary, ScrapeSpec

# What Prometheus 3 sends on every scrape (scrape/scrape.go), with gzip as it asks by default.
SCRAPE_ACCEPT: Final = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


class Scraper:
    """One keep-alive HTTP/1.1 connection that asks the way Prometheus does (gzip, OpenMetrics).

    Hand-written on a socket: a general HTTP client would cost more than the servers it
    times, and the bench measures the server's answer, not a library's.
    """

    def __init__(self, port: int, path: str = "/metrics", timeout: float = 10.0) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: Prometheus/3.0.0\r\n"
            f"Accept: {SCRAPE_ACCEPT}\r\nAccept-Encoding: gzip\r\n"
            "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
        ).encode()
        self._buffer = b""

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def scrape(self) -> int:
        """One request; returns the body's size. Raises OSError on anything but a 200."""
        self._sock.sendall(self._request)
        head = self._until(b"\r\n\r\n").lower()
        if not head.startswith(b"http/1.1 200"):
            raise OSError(f"scrape answered {head[:40]!r}")
        length = _header(head, b"content-length")
        if length is not None:
            return len(self._exactly(int(length)))
        if _header(head, b"transfer-encoding") == b"chunked":
            return self._chunked()
        raise OSError("scrape reply has neither a length nor chunks")

    def _fill(self) -> None:
        data = self._sock.recv(1 << 18)
        if not data:
            raise ConnectionError("server closed the connection")
        self._buffer += data

    def _until(self, marker: bytes) -> bytes:
        while marker not in self._buffer:
            self._fill()
        head, _, self._buffer = self._buffer.partition(marker)
        return head

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        body, self._buffer = self._buffer[:size], self._buffer[size:]
        return body

    def _chunked(self) -> int:
        total = 0
        while size := int(self._until(b"\r\n").split(b";")[0], 16):
            total += len(self._exactly(size))
            self._exactly(2)
        self._until(b"\r\n")  # no trailers: the empty line ends the body
        return total


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip() == name:
            return value.strip()
    return None


def scrape_sequential(port: int, count: int) -> LatencySummary:
    """``count`` scrapes one after the other on one connection."""
    scraper = Scraper(port)
    latencies, size = [], 0
    started = time.perf_counter()
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            size = scraper.scrape()
            latencies.append(time.perf_counter() - t0)
    finally:
        scraper.close()
    summary = latency_summary(latencies, time.perf_counter() - started, 0)
    summary["body_bytes"] = size
    return summary


def scrape_concurrent(port: int, scrapers: int, seconds: float) -> LatencySummary:
    """``scrapers`` connections scraping as fast as answered for ``seconds``."""
    latencies: list[float] = []
    errors = [0]
    deadline = time.perf_counter() + seconds

    def scrape_until_deadline() -> None:
        scraper, mine = Scraper(port), []
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                scraper.scrape()
            except OSError:
                errors[0] += 1
                scraper.close()
                scraper = Scraper(port)
                continue
            mine.append(time.perf_counter() - t0)
        scraper.close()
        latencies.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=scrape_until_deadline) for _ in range(scrapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latency_summary(latencies, time.perf_counter() - started, errors[0])


def latency_summary(latencies: list[float], elapsed: float, errors: int) -> LatencySummary:
    """Count, rate and percentiles (milliseconds) of request latencies."""
    ordered = sorted(latencies)
    return {
        "count": len(ordered),
        "errors": errors,
        "seconds": round(elapsed, 3),
        "per_second": round(len(ordered) / elapsed, 1) if elapsed > 0 else None,
        "p50_ms": _ms(percentile(ordered, 50)),
        "p90_ms": _ms(percentile(ordered, 90)),
        "p99_ms": _ms(percentile(ordered, 99)),
        "max_ms": _ms(ordered[-1] if ordered else None),
    }


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values; None when there are none."""
    if not ordered:
        return None
    rank = max(1, int(-(-q * len(ordered) // 100)))
    return ordered[min(rank, len(ordered)) - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def client_argv(spec: ScrapeSpec) -> list[str]:
    """The command line of a scrape client process running ``spec``."""
    return [sys.executable, "-m", "exporter_tooling.bench.scrape_client", json.dumps(spec)]


def client_main(argv: Sequence[str]) -> int:
    """Entry of the scrape client process: one JSON spec in, one JSON summary line out."""
    spec: ScrapeSpec = json.loads(argv[0])
    if spec["mode"] == "sequential":
        result = scrape_sequential(spec["port"], spec.get("count", 1))
    else:
        result = scrape_concurrent(spec["port"], spec.get("scrapers", 1), spec.get("seconds", 1.0))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))

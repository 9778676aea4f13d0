"""CPU per health probe: the probes' own HTTP/1.1 client against httpx's async client.

Issue 28 asked whether one asyncio loop multiplexing every target's probe over httpx's
``AsyncClient`` would cost less than the hand-written client the probes use. Both sides keep
the probes' bounds: one total deadline per probe (``asyncio.timeout`` on the httpx side, the
watchdog on ours), the body cap counted after decompression (the raw stream fed to the same
capped decoder, since httpx's own decoding inflates a whole read before any cap can see
it), no redirects followed and no proxy (``trust_env=False``). Every target is a loopback
port of one keep-alive server in a child process, so the server's CPU is not counted; the
figure is this process's user+system CPU (every thread: our client's watchdog, httpx's
loop) divided by the probes made.

Run: ``python -m exporter_tooling.bench.probe_clients [--targets 8,64] [--probes 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final

import httpx

from exporter.config import Target
from exporter.sources.probe import Prober
from exporter.sources.probe.wire import BodyDecoder, content_encoding
from exporter_tooling.processes import free_port, stop_process

TIMEOUT_SECONDS: Final = 0.8
CAP_BYTES: Final = 65536
#: The child: one asyncio server per port, answering every request as vLLM's /health does.
_SERVER: Final = r"""
import asyncio, sys
REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
class Health(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            self.transport.write(REPLY)
async def main():
    loop = asyncio.get_running_loop()
    for port in sys.argv[1:]:
        await loop.create_server(Health, "127.0.0.1", int(port))
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _own_client(urls: Sequence[str], rounds: int) -> int:
    """Every target probed once a round, in turn, as the loop's lane does; the OK count."""
    probers = [
        Prober(Target(f"t{i}", "vllm", url, "/health", TIMEOUT_SECONDS))
        for i, url in enumerate(urls)
    ]
    try:
        return sum(p.probe_health().ok for _ in range(rounds) for p in probers)
    finally:
        for p in probers:
            p.close()


async def _httpx_probe(client: httpx.AsyncClient, url: str) -> bool:
    try:
        async with asyncio.timeout(TIMEOUT_SECONDS):
            async with client.stream("GET", url) as reply:
                decoder = BodyDecoder(content_encoding(reply.headers.raw), CAP_BYTES)
                async for chunk in reply.aiter_raw():
                    decoder.feed(chunk)
                return 200 <= reply.status_code < 300
    except Exception:  # any failure is a failed probe, as ours never raises
        return False


async def _httpx_rounds(urls: Sequence[str], rounds: int) -> int:
    limits = httpx.Limits(max_connections=len(urls), max_keepalive_connections=len(urls))
    headers = {"Accept": "application/json", "Accept-Encoding": "gzip, deflate"}
    async with httpx.AsyncClient(
        trust_env=False, follow_redirects=False, limits=limits, headers=headers
    ) as client:
        ok = 0
        for _ in range(rounds):  # one tick: every target's probe multiplexed on the loop
            ok += sum(await asyncio.gather(*(_httpx_probe(client, u) for u in urls)))
        return ok


def _httpx_client(urls: Sequence[str], rounds: int) -> int:
    return asyncio.run(_httpx_rounds(urls, rounds))


def _measure(
    run: Callable[[Sequence[str], int], int], urls: Sequence[str], rounds: int
) -> dict[str, float]:
    run(urls, 3)  # connections opened, code paths warm
    cpu, wall = _cpu_seconds(), time.perf_counter()
    ok = run(urls, rounds)
    cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
    probes = rounds * len(urls)
    return {
        "probes": probes,
        "ok": ok,
        "cpu_ms_per_probe": round(cpu / probes * 1000, 4),
        "wall_ms_per_round": round(wall / rounds * 1000, 3),
    }


CLIENTS: Final[dict[str, Callable[[Sequence[str], int], int]]] = {
    "own (httptools, kept connection)": _own_client,
    "httpx AsyncClient (one loop)": _httpx_client,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Measure both clients at each target count; print a table and the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default="8,64", help="comma-separated target counts")
    p.add_argument("--probes", type=int, default=2000, help="probes per client and count")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.targets.split(",")]
    ports = [free_port() for _ in range(max(counts))]
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, *map(str, ports)], stdout=subprocess.PIPE
    )
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != b"ready":
            print("probe_clients: the loopback server did not start", file=sys.stderr)
            return 1
        for n in counts:
            urls = [f"http://127.0.0.1:{port}" for port in ports[:n]]
            rounds = max(2, args.probes // n)
            results[str(n)] = {name: _measure(run, urls, rounds) for name, run in CLIENTS.items()}
    finally:
        stop_process(server)
        if server.stdout is not None:
            server.stdout.close()
    print(f"{'targets':>7}  {'client':<34} {'CPU ms/probe':>12} {'wall ms/round':>13} {'ok':>9}")
    for count, row in results.items():
        for name, r in row.items():
            ok = f"{r['ok']:.0f}/{r['probes']:.0f}"
            cpu, wall = r["cpu_ms_per_probe"], r["wall_ms_per_round"]
            print(f"{count:>7}  {name:<34} {cpu:>12.4f} {wall:>13.3f} {ok:>9}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

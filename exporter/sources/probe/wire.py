"""HTTP/1.1 on one socket: a response parsed by httptools (llhttp), bodies decoded under a cap.

The wire half of the probes' client (``client`` is the other): no policy, no deadlines of its
own beyond the one each read is given, no knowledge of engines.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import ssl
import time
import zlib
from collections.abc import Iterable
from typing import Final

import httptools

# wbits 32+15: zlib auto-detects a gzip or zlib header, so "deflate" sent zlib-wrapped works too.
_AUTO_WBITS: Final = 32 | zlib.MAX_WBITS
_DECODED_ENCODINGS: Final = frozenset({"gzip", "x-gzip", "deflate"})
#: Largest response head accepted: httpcore's limit, so a reply refused today is refused still.
_MAX_HEAD_BYTES: Final = 100 * 1024
_READ_BYTES: Final = 65536
_TCP_QUICKACK: Final[int | None] = getattr(socket, "TCP_QUICKACK", None)


class BodyTooLarge(Exception):
    """The decoded body passed the byte cap."""


class Expired(Exception):
    """The probe's total deadline passed before the reply was complete."""


class Malformed(Exception):
    """The reply broke HTTP/1.1: a bad or oversized head, or a body that ended early."""


class BodyDecoder:
    """Decodes gzip/deflate incrementally, never producing more than the cap allows.

    httpx's ``iter_bytes()`` inflates a whole network read at once: one 64 KiB chunk of a gzip
    bomb becomes about 64 MB in memory before any cap can be checked.
    """

    def __init__(self, encoding: str, cap: int) -> None:
        self._inflate = encoding in _DECODED_ENCODINGS
        self._zlib = zlib.decompressobj(_AUTO_WBITS)
        self._room = cap
        self.body = bytearray()

    def feed(self, chunk: bytes) -> None:
        """Add one raw chunk.

        Raises:
            BodyTooLarge: the decoded body would pass the cap.
            zlib.error: the compressed stream is corrupt.
        """
        while chunk:
            if not self._inflate:
                out, chunk = chunk, b""
            else:
                # max_length one past the room tells "exactly full" from "too large".
                out = self._zlib.decompress(chunk, self._room + 1)
                chunk = self._zlib.unconsumed_tail or self._next_member()
            if len(out) > self._room:
                raise BodyTooLarge
            self._room -= len(out)
            self.body += out

    def _next_member(self) -> bytes:
        # A gzip body may hold several members back to back (RFC 1952 section 2.2).
        if not self._zlib.eof or not self._zlib.unused_data:
            return b""
        rest = self._zlib.unused_data
        self._zlib = zlib.decompressobj(_AUTO_WBITS)
        return rest


def content_encoding(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The body's coding, lower-cased ("" for none).

    Raises:
        zlib.error: a coding the decoder cannot undo.
    """
    # Repeated headers join with ", " as httpx's headers.get did: "gzip, br" is refused whole.
    values = [value.decode("latin-1") for name, value in headers if name == b"content-encoding"]
    encoding = ", ".join(values).strip().lower()
    if encoding not in _DECODED_ENCODINGS | {"identity", ""}:
        raise zlib.error("unsupported content-encoding")
    return encoding


class Response:
    """One response as llhttp (through httptools) parses it: the parser's callbacks fill it in.

    Interim 1xx responses are skipped, as httpcore did. Anything after the response's end (a
    second response, or bytes that are none) marks it ``after``: a connection with such bytes
    is never reused, since they would be read as the next reply.
    """

    __slots__ = (
        "after",
        "chunks",
        "complete",
        "headers",
        "interim",
        "keep_alive",
        "parser",
        "status",
    )

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        # A bare LF may end a line, as h11 allowed; every other rule of llhttp stays strict.
        self.parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        self.status: int | None = None  # the final response's, once its head is complete
        self.headers: list[tuple[bytes, bytes]] = []  # names lower-cased
        self.chunks: list[bytes] = []  # body bytes parsed and not yet taken
        self.interim = False
        self.complete = False
        self.keep_alive = False
        self.after = False

    def feed(self, data: bytes) -> None:
        """Parse the bytes of one read.

        Raises:
            Malformed: the bytes are not a valid response (or switch protocols unasked).
        """
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise Malformed("the server switched protocols unasked") from None
        except httptools.HttpParserError as exc:
            if not self.complete:
                raise Malformed(f"invalid reply: {exc}") from None
            self.after = True  # bytes past the reply that are not HTTP

    def end_of_stream(self) -> None:
        """The peer closed: a body delimited by the close ends here.

        Raises:
            Malformed: the head or a body of known length ended early.
        """
        if self.complete:
            return
        if self.status is None or not self._delimited_by_close():
            raise Malformed("the reply ended early")
        self.complete = True  # and keep_alive stays False: the connection is over

    def _delimited_by_close(self) -> bool:
        codings = b",".join(value for name, value in self.headers if name == b"transfer-encoding")
        chunked = codings.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
        return not chunked and all(name != b"content-length" for name, _ in self.headers)

    # The parser's callbacks (httptools' HTTPProtocol); they never raise.

    def on_message_begin(self) -> None:
        """A response starts; one after the complete reply is bytes past it."""
        if self.complete:
            self.after = True

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header of the head being read."""
        if not self.complete:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        """The head is complete: a 1xx is set aside, a final status is kept."""
        if self.complete:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # 101 raises HttpParserUpgrade after this
            self.interim, self.headers = True, []
        else:
            self.status = status

    def on_body(self, body: bytes) -> None:
        """Body bytes, already de-chunked."""
        if not self.complete:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        """The response ended; whether the connection may carry another."""
        if self.interim:
            self.interim = False
        elif not self.complete:
            self.complete = True
            # HTTP/1.0 closes after the reply, as h11 had it, even with "Connection: keep-alive".
            self.keep_alive = (
                self.parser.should_keep_alive() and self.parser.get_http_version() == "1.1"
            )


class Connection:
    """One HTTP/1.1 connection: a connected socket, the response being read, its origin."""

    __slots__ = ("eof", "origin", "read_whole", "received", "response", "sock")

    def __init__(self, sock: socket.socket, origin: tuple[str, int, bool]) -> None:
        self.sock = sock
        self.origin = origin
        self.response = Response()
        self.received = 0  # bytes of the current exchange's response read so far
        self.eof = False  # the last read met the end of the stream
        self.read_whole = False  # the current response was read to its end

    def begin(self) -> None:
        """Make ready for the next exchange's response."""
        self.response = Response()
        self.received, self.eof, self.read_whole = 0, False, False

    def read_head(self, deadline: float) -> int:
        """The final response's status, reading as needed (1xx skipped).

        Raises:
            Expired: the deadline passed between reads.
            Malformed: the reply is malformed, too large a head, or ended early.
            OSError: the connection failed (TimeoutError when a read ran out of time).
        """
        while self.response.status is None:
            self._read(deadline)
        return self.response.status

    def read_body(self, deadline: float, decoder: BodyDecoder) -> None:
        """The rest of the response into ``decoder``; raises as ``read_head`` and the decoder."""
        response = self.response
        while True:
            chunks, response.chunks = response.chunks, []
            for chunk in chunks:
                decoder.feed(chunk)
            if response.complete:
                break
            self._read(deadline)
        self.read_whole = True

    def _read(self, deadline: float) -> None:
        """One read into the parser, bounded by the time left."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Expired
        self.sock.settimeout(remaining)
        if self.received:  # the reply came in parts: acknowledge what came at once
            _ack_at_once(self.sock)
        data = self.sock.recv(_READ_BYTES)
        self.received += len(data)
        if not data:
            self.eof = True
            self.response.end_of_stream()
            return
        self.response.feed(data)
        if self.response.status is None and self.received > _MAX_HEAD_BYTES:
            raise Malformed("the reply's head passed the size limit")

    def reusable(self) -> bool:
        """True when the exchange ended cleanly and nothing followed it: fit for the next one.

        Anything else (``Connection: close`` or HTTP/1.0; a body left unread; bytes past the
        reply) leaves a state no next request can start from.
        """
        response = self.response
        return self.read_whole and response.keep_alive and not response.after

    def idle(self) -> bool:
        """True when nothing arrived since the last exchange ended.

        Readable while idle means the peer closed it (uvicorn does after 5 s idle) or sent
        something unasked: either way no request should go over it. poll, not select: a
        daemon watching many targets may hold descriptors past select's 1024.
        """
        if isinstance(self.sock, ssl.SSLSocket) and self.sock.pending():
            return False  # decrypted already, so the descriptor alone would not show it
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        """Close the socket; the caller has made sure no watchdog still watches it."""
        self.sock.close()


def is_stale(conn: Connection, exc: BaseException) -> bool:
    """True when ``conn`` failed before any byte of the response arrived, as a closed one does.

    The send broke (EPIPE, ECONNRESET) or the first read met an end of file or a reset: a
    server closing its idle connection as the request went out looks exactly like this.
    """
    if conn.received:
        return False
    if conn.eof or isinstance(exc, ssl.SSLEOFError):  # SSLEOFError: TLS's unclean end of file
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ECONNRESET)


def _ack_at_once(sock: socket.socket) -> None:
    """Acknowledge what arrived now rather than in 40 ms (Linux; a no-op elsewhere).

    A server that writes its head and body apart with Nagle on (no TCP_NODELAY) holds the
    body until the head is acknowledged, and on a kept connection Linux delays that ACK by
    up to 40 ms; a fresh connection's first segments are acknowledged at once, which hid
    this. Setting TCP_QUICKACK sends an ACK the kernel holds back; the flag is not sticky,
    so it is set before each further read of a reply that came in parts, and only then.
    """
    if _TCP_QUICKACK is not None:
        with contextlib.suppress(OSError):  # not TCP (a test's unix socket): nothing to do
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)

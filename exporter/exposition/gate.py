"""Where accepted connections wait until their request has arrived, so that a silent or trickling client
never occupies one of the server's workers.

One thread watches every waiting connection with a selector. A plain-HTTP connection is handed to the
workers once its request head is complete (seen with MSG_PEEK, nothing consumed). A TLS connection waits
(peeked the same way) until the first record of its ClientHello is whole, then does its handshake here,
without blocking, and its request head is read and decrypted here and handed over with it: a client that
sends part of a ClientHello and goes silent costs a selector entry, not a worker nor an SSL object (about
46 KiB each). A connection that has not got that far within `timeout` seconds, or that closes, is closed
here. A kept-alive connection comes back after each request it made and waits the same way for its next one,
up to `keepalive` seconds (TLS: already handshaken; the bytes its last request read ahead count as the start of
the next). One address holds at most PER_ADDRESS of the waiting connections, and at most TLS_WAITING connections
wait in the middle of a handshake: beyond either, the oldest such one is closed (unless it has asked or closed
meanwhile: then it leaves the gate that way), so that idle sockets can neither fill the server's connection limit
nor its memory. A connection is looked at as it arrives, so one whose request is there is never the one closed."""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

HEAD_LIMIT = 65536  # bytes peeked for the end of a request head; a longer head goes on to be refused by the handler
RECHECK_SECONDS = 0.1  # a connection with part of its request is peeked again this often (not on every event)
PER_ADDRESS = 64  # connections one address may have waiting at the gate at once
TLS_WAITING = 256  # TLS connections handshaking or sending their request at once (each holds an SSL object)
TLS_HEAD_LIMIT = 16384  # bytes of a TLS request head held here (decrypted); a longer head is read by the handler
_RECORD_PEEK = 5 + (1 << 14) + 2048  # a TLS record: 5-byte header, at most 2^14 + 2048 bytes of body
LOG_EVERY_SECONDS = 10.0

log = logging.getLogger(__name__)

Ready = Callable[[socket.socket, object, bytes], None]  # (connection, address, request bytes already read)


@dataclass(frozen=True)
class TlsAccept:
    """How the gate turns a TCP connection into a verified TLS one."""

    context: Callable[[], ssl.SSLContext]  # the current server context (it is reloaded when the files change)
    peer_ok: Callable[[ssl.SSLSocket], bool]  # after the handshake: is this client allowed (its SANs)?
    refused: Callable[[str], None]  # called once per handshake that failed or a peer that was refused


@dataclass(eq=False)
class _Waiting:
    address: object
    since: float
    key: str  # the address as the per-address limit counts it
    head: bytearray = field(default_factory=bytearray)  # request bytes already read (TLS: decrypted) so far
    wrapped: bool = False  # TLS: an SSL socket now (its ClientHello's first record was whole)
    handshaken: bool = False
    limit: float = 0.0  # seconds it may wait


class Gate:
    def __init__(self, ready: Ready, close: Callable[[socket.socket], None], timeout: float,
                 tls: TlsAccept | None = None, per_address: int = PER_ADDRESS, tls_waiting: int = TLS_WAITING,
                 keepalive: float | None = None) -> None:
        self._ready = ready  # takes a connection whose request is there
        self._close = close  # closes one that gave up or timed out
        self._timeout = timeout
        self._keepalive = timeout if keepalive is None else keepalive
        self._tls = tls
        self._per_address = per_address
        self._tls_waiting = tls_waiting
        self._wrapped = 0  # waiting connections that hold an SSL object
        self._new: queue.SimpleQueue[tuple[socket.socket, object, bytes | None]] = queue.SimpleQueue()
        self._waiting: dict[socket.socket, _Waiting] = {}  # insertion order: oldest first
        self._by_address: defaultdict[str, int] = defaultdict(int)
        self._partial: set[socket.socket] = set()  # part of a request there: peeked on a timer, not on events
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http-gate", daemon=True)
        self.evicted = 0  # waiting connections closed for a newer one (PER_ADDRESS, TLS_WAITING)
        self._logged_at = float("-inf")

    @property
    def holding_tls(self) -> int:
        """Waiting connections that hold an SSL object (handshaking, or handshaken and sending their request)."""
        return self._wrapped

    def start(self) -> Gate:
        self._thread.start()
        return self

    def add(self, conn: socket.socket, address: object, kept: bytes | None = None) -> None:
        """A new connection, or (`kept`: the bytes read ahead) one back after a request, kept alive."""
        self._new.put((conn, address, kept))
        self._wake()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        self._thread.join(5)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # the wake-up pipe is full: the gate is awake anyway
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        last_recheck = time.monotonic()
        try:
            while not self._stopping.is_set():
                for key, _ in self._sel.select(RECHECK_SECONDS):
                    if key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        self._check(key.fileobj)  # type: ignore[arg-type]
                self._take_new()
                now = time.monotonic()
                if now - last_recheck >= RECHECK_SECONDS:
                    last_recheck = now
                    for conn in list(self._partial):
                        self._check(conn)
                    for conn, w in list(self._waiting.items()):
                        if now - w.since > w.limit:
                            self._drop(conn)
        finally:
            for conn in list(self._waiting):
                self._drop(conn)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _take_new(self) -> None:
        while True:
            try:
                conn, address, kept = self._new.get_nowait()
            except queue.Empty:
                return
            key = address_key(address)
            if self._by_address[key] >= self._per_address:
                self._make_room(key)
            try:
                conn.setblocking(False)
            except OSError:
                self._close(conn)
                continue
            tls = isinstance(conn, ssl.SSLSocket)
            if tls and self._wrapped >= self._tls_waiting:
                self._evict(next(c for c, o in self._waiting.items() if o.wrapped),
                            f"{self._tls_waiting} TLS connections were waiting")
            w = _Waiting(address, time.monotonic(), key, bytearray(kept or b""), wrapped=tls, handshaken=tls,
                         limit=self._timeout if kept is None else self._keepalive)
            self._remember(conn, w)
            try:
                self._sel.register(conn, selectors.EVENT_READ)
            except (OSError, ValueError):
                self._drop(conn)
                continue
            if tls and kept is None:
                self._advance_tls(conn, w)  # type: ignore[arg-type]
            else:  # its request (or, kept alive, its close) may be here already: out of the gate at once, so that
                self._check(conn)  # a burst of new connections never finds it waiting, to be closed for room

    def _check(self, conn: socket.socket) -> None:
        w = self._waiting.get(conn)
        if w is None:
            return
        if w.wrapped:
            self._advance_tls(conn, w)  # type: ignore[arg-type]
            return
        try:
            head = conn.recv(_RECORD_PEEK if self._tls else HEAD_LIMIT, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            head = None  # nothing more there yet
        except OSError:
            self._drop(conn)
            return
        if w.head:  # kept alive, its next request begun in what the last one read ahead
            if _complete(w.head + (head or b"")):
                self._hand_over(conn, bytes(w.head))
            elif head == b"":
                self._drop(conn)  # closed with half a request
            else:
                self._wait_for_more(conn)
        elif head is None:
            return
        elif not head:
            self._drop(conn)  # closed before it asked anything
        elif self._tls is not None:
            if head[0] != 0x16:  # not a TLS handshake record: plain HTTP on the TLS port, say
                self._refuse(conn, "not a TLS handshake")
            elif len(head) >= 5 and len(head) >= 5 + int.from_bytes(head[3:5], "big"):
                self._start_tls(conn, w)
            else:
                self._wait_for_more(conn)
        elif _complete(head):
            self._hand_over(conn, b"")
        else:
            self._wait_for_more(conn)

    def _wait_for_more(self, conn: socket.socket) -> None:
        if conn not in self._partial:
            self._partial.add(conn)  # peeked again on the timer: the unread bytes would wake the selector at once
            self._sel.unregister(conn)

    def _start_tls(self, conn: socket.socket, w: _Waiting) -> None:
        """The first record of the ClientHello is here: an SSL socket takes the connection's place."""
        assert self._tls is not None
        if self._wrapped >= self._tls_waiting:
            self._evict(next(c for c, o in self._waiting.items() if o.wrapped),
                        f"{self._tls_waiting} TLS handshakes were under way")
        self._forget(conn)
        try:
            tls = self._tls.context().wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError, ssl.SSLError) as e:
            self._tls.refused(str(e))
            self._close(conn)
            return
        w.wrapped = True
        self._remember(tls, w)
        try:
            self._sel.register(tls, selectors.EVENT_READ)
        except (OSError, ValueError):
            self._drop(tls)
            return
        self._advance_tls(tls, w)

    def _remember(self, conn: socket.socket, w: _Waiting) -> None:
        """Puts a connection taken from the waiting ones (by _forget) back, with its age."""
        self._waiting[conn] = w
        self._by_address[w.key] += 1
        self._wrapped += w.wrapped

    def _advance_tls(self, conn: ssl.SSLSocket, w: _Waiting) -> None:
        assert self._tls is not None
        try:
            if not w.handshaken:
                conn.do_handshake()
                w.handshaken = True
                if not self._tls.peer_ok(conn):
                    self._refuse(conn, "client certificate not in client_allowed_sans")
                    return
            while len(w.head) < TLS_HEAD_LIMIT:  # read all there is: decrypted bytes wake no selector
                data = conn.recv(TLS_HEAD_LIMIT - len(w.head))
                if not data:
                    self._drop(conn)  # closed before it asked anything
                    return
                w.head += data
                if _complete(w.head):
                    break
            self._hand_over(conn, bytes(w.head))
        except ssl.SSLWantReadError:
            self._sel.modify(conn, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._sel.modify(conn, selectors.EVENT_WRITE)
        except (ssl.SSLError, OSError, ValueError) as e:
            if w.handshaken:
                self._drop(conn)
            else:
                self._refuse(conn, str(e))

    def _make_room(self, key: str) -> None:
        """Closes the oldest connection of `key` waiting, unless it turns out to have asked (or closed) meanwhile:
        then it leaves the gate that way. One peek per new connection, however many wait."""
        oldest = next(c for c, w in self._waiting.items() if w.key == key)
        self._check(oldest)
        if oldest in self._waiting:
            self._evict(oldest, f"{key} had {self._per_address} connections waiting")

    def _evict(self, conn: socket.socket, why: str) -> None:
        """Closes a waiting connection to make room; says so at most once per LOG_EVERY_SECONDS."""
        self.evicted += 1
        self._drop(conn)
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            log.warning("closed %d waiting connection(s) in all to make room for new ones; the latest because %s",
                        self.evicted, why)
            self._logged_at = now

    def _refuse(self, conn: socket.socket, why: str) -> None:
        assert self._tls is not None
        self._tls.refused(why)
        self._drop(conn)

    def _forget(self, conn: socket.socket) -> object:
        w = self._waiting.pop(conn)
        self._wrapped -= w.wrapped
        self._by_address[w.key] -= 1
        if not self._by_address[w.key]:
            del self._by_address[w.key]
        if conn in self._partial:
            self._partial.discard(conn)
        else:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn)
        return w.address

    def _hand_over(self, conn: socket.socket, head: bytes) -> None:
        self._ready(conn, self._forget(conn), head)

    def _drop(self, conn: socket.socket) -> None:
        if conn in self._waiting:
            self._forget(conn)
        self._close(conn)


def _complete(head: bytes | bytearray) -> bool:
    return b"\r\n\r\n" in head or b"\n\n" in head or len(head) >= HEAD_LIMIT


def address_key(address: object) -> str:
    """The host part of a peer address: IPv4 as it is, an IPv4-mapped IPv6 address as its IPv4 one, other IPv6
    addresses as their /64 (one host's usual share, which it can fill with addresses at will)."""
    host = address[0] if isinstance(address, tuple) and address else str(address)
    host = str(host)
    if host.startswith("::ffff:") and "." in host:
        return host[7:]
    if ":" in host:
        try:
            packed = socket.inet_pton(socket.AF_INET6, host.split("%", 1)[0])
        except OSError:
            return host
        return packed[:8].hex() + "::/64"
    return host

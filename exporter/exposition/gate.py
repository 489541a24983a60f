"""Where accepted connections wait until their request has arrived, so that a silent or trickling client
never occupies one of the server's workers.

One thread watches every waiting connection with a selector. A plain-HTTP connection is handed to the
workers once its request head is complete (seen with MSG_PEEK, nothing consumed); a TLS connection once its
first bytes (the ClientHello) are there, since its request can only be read after the handshake. A
connection that has not got that far within `timeout` seconds, or that closes, is closed here."""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable

HEAD_LIMIT = 65536  # bytes peeked for the end of a request head; a longer head goes on to be refused by the handler
RECHECK_SECONDS = 0.1  # a connection with part of its request is peeked again this often (not on every event)


class Gate:
    def __init__(self, ready: Callable[[socket.socket, object], None], close: Callable[[socket.socket], None],
                 timeout: float, tls: bool) -> None:
        self._ready = ready  # takes a connection whose request is there
        self._close = close  # closes one that gave up or timed out
        self._timeout = timeout
        self._tls = tls
        self._new: queue.SimpleQueue[tuple[socket.socket, object]] = queue.SimpleQueue()
        self._waiting: dict[socket.socket, tuple[object, float]] = {}  # conn -> (address, accepted at)
        self._partial: set[socket.socket] = set()  # part of a request there: peeked on a timer, not on events
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http-gate", daemon=True)

    def start(self) -> Gate:
        self._thread.start()
        return self

    def add(self, conn: socket.socket, address: object) -> None:
        self._new.put((conn, address))
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
                    for conn, (_, since) in list(self._waiting.items()):
                        if now - since > self._timeout:
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
                conn, address = self._new.get_nowait()
            except queue.Empty:
                return
            self._waiting[conn] = (address, time.monotonic())
            try:
                self._sel.register(conn, selectors.EVENT_READ)
            except (OSError, ValueError):
                self._drop(conn)

    def _check(self, conn: socket.socket) -> None:
        if conn not in self._waiting:
            return
        if self._tls:
            self._hand_over(conn)
            return
        try:
            head = conn.recv(HEAD_LIMIT, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        if not head:
            self._drop(conn)  # closed before it asked anything
        elif b"\r\n\r\n" in head or b"\n\n" in head or len(head) >= HEAD_LIMIT:
            self._hand_over(conn)
        elif conn not in self._partial:
            self._partial.add(conn)  # peeked again on the timer: the unread bytes would wake the selector at once
            self._sel.unregister(conn)

    def _forget(self, conn: socket.socket) -> object:
        address, _ = self._waiting.pop(conn)
        if conn in self._partial:
            self._partial.discard(conn)
        else:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn)
        return address

    def _hand_over(self, conn: socket.socket) -> None:
        self._ready(conn, self._forget(conn))

    def _drop(self, conn: socket.socket) -> None:
        if conn in self._waiting:
            self._forget(conn)
        self._close(conn)

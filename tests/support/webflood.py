"""Hostile clients of a TLS and basic-auth exporter, on loopback, for tests/test_web.py and bench/web_floods.py.

Run as a process of its own (so that its clients do not share the measured scraper's interpreter):

    python tests/support/webflood.py --port P --ca ca.crt --stalled 32 --wrong 150 --seconds 8

- `--stalled` connections send the first 6 bytes of a TLS ClientHello and go silent; each is opened again as
  soon as the server closes it.
- `--wrong` clients send a request with a wrong password, one after the other, each from an address of its
  own (127.0.1.1, 127.0.1.2, ...: loopback is a /8 on Linux; `--source ADDR`: all from ADDR) and each a new TLS
  connection, started `--pause` seconds apart; `--distinct`: a password not sent before on each try (so that each costs
  the server a bcrypt check), else the same wrong one every time.

It prints `ready` once every stalled connection is open, and, after `--seconds`, one JSON line: the responses
the wrong-password clients got by status, and how often the stalled connections were closed by the server."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import ssl
import sys
import time
from collections import Counter

CLIENT_HELLO_START = b"\x16\x03\x01\x02\x00\x01"  # record type handshake, TLS 1.0 record, length 512, ClientHello


def wrong_address(i: int) -> str:
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


async def stalled(port: int, until: float, closed: Counter, opened: asyncio.Event, n: int, count: list[int]) -> None:
    first = True
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(CLIENT_HELLO_START)
            await writer.drain()
            if first:
                count[0] += 1
                if count[0] == n:
                    opened.set()
                first = False
            try:
                await asyncio.wait_for(reader.read(1), max(0.01, until - time.monotonic()))
                closed["by_server"] += 1
            except TimeoutError:
                pass
            writer.close()
        except OSError:
            closed["connect_failed"] += 1
            await asyncio.sleep(0.05)


async def wrong_password(port: int, ctx: ssl.SSLContext, address: str, until: float, statuses: Counter,
                         pause: float, distinct: bool) -> None:
    tries, start = 0, time.monotonic()
    while time.monotonic() < until:
        tries += 1
        password = f"not-the-password-{address}-{tries}" if distinct else "not-the-password"
        auth = base64.b64encode(f"prometheus:{password}".encode()).decode()
        request = f"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {auth}\r\n\r\n".encode()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="localhost", local_addr=(address, 0)), 10)
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.read(12), 10)
            statuses[head[9:12].decode() or "closed"] += 1
            writer.close()
        except (OSError, TimeoutError, ssl.SSLError) as e:
            statuses[type(e).__name__] += 1
        await asyncio.sleep(max(0.0, start + tries * pause - time.monotonic()))  # `pause` from try to try


async def flood(port: int, ca: str, n_stalled: int, n_wrong: int, seconds: float, pause: float,
                source: str | None = None, distinct: bool = False) -> dict:
    ctx = ssl.create_default_context(cafile=ca)
    until = time.monotonic() + seconds
    closed: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    opened, count = asyncio.Event(), [0]
    tasks = [asyncio.create_task(stalled(port, until, closed, opened, n_stalled, count)) for _ in range(n_stalled)]
    if n_stalled:
        await asyncio.wait_for(opened.wait(), 30)
    print("ready", flush=True)
    tasks += [asyncio.create_task(wrong_password(port, ctx, source or wrong_address(i), until, statuses, pause,
                                                 distinct)) for i in range(n_wrong)]
    await asyncio.gather(*tasks)
    return {"wrong_password_responses": dict(statuses), "stalled_closed": dict(closed)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ca", required=True, help="the CA of the server's certificate")
    ap.add_argument("--stalled", type=int, default=32)
    ap.add_argument("--wrong", type=int, default=150)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds from the start of a wrong-password client's try to its next")
    ap.add_argument("--source", help="send every wrong password from this address (default: one address each)")
    ap.add_argument("--distinct", action="store_true", help="a new wrong password on every try")
    args = ap.parse_args()
    result = asyncio.run(flood(args.port, args.ca, args.stalled, args.wrong, args.seconds, args.pause, args.source,
                               args.distinct))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Requests/s of a kestrel (or any HTTP/1.1) server on one GET route: C keep-alive connections, each sending the
next request as soon as the previous response is read (no pipelining). Only the standard library: the client is
asyncio over raw streams, so on a small machine the client's CPU is part of the measurement (see the doc).

Usage: python3 tools/bench_http.py --url http://127.0.0.1:8888/health [--connections 32] [--seconds 5]
"""

import argparse
import asyncio
import time
import urllib.parse


async def client(host, port, path, stop_at, counts):
    reader, writer = await asyncio.open_connection(host, port)
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    done = 0
    try:
        while time.perf_counter() < stop_at:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            done += 1
    finally:
        writer.close()
        counts.append(done)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8888/health")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    counts = []
    start = time.perf_counter()
    await asyncio.gather(*(client(u.hostname, u.port or 80, u.path or "/", start + args.seconds, counts)
                           for _ in range(args.connections)))
    elapsed = time.perf_counter() - start
    total = sum(counts)
    print(f"{total} requests in {elapsed:.2f} s over {args.connections} connections: {total / elapsed:.0f} requests/s")


if __name__ == "__main__":
    asyncio.run(main())

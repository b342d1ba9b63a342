"""Strangers cannot take a keyed client's capacity: a real `embedder serve` process, 600 keyless connections that
each sent headers and one byte of a body (more than max_concurrent_requests), and a keyed client beside them."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import statistics
import time
from pathlib import Path

import httpx
import pytest

from tests.adapt.cluster import Replica

KEY = "keyed-client"
SLOW_CONNECTIONS = 600
CLIENTS, TEXTS = 8, 32
CLEAR = 0.95  # a median ratio of the first pairs that needs no more of them


async def _keyed_load(url: str, seconds: float) -> tuple[float, dict[int, int]]:
    """Texts/s of 8 concurrent clients sending 32 short texts per request, and their status codes."""
    statuses: dict[int, int] = {}
    texts = 0
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
        started = time.perf_counter()
        deadline = started + seconds

        async def one(i: int) -> None:
            nonlocal texts
            j = 0
            while time.perf_counter() < deadline:
                inputs = [f"client {i} request {j} text {k} about something short" for k in range(TEXTS)]
                response = await client.post("/v1/embeddings", json={"input": inputs})
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                texts += TEXTS if response.status_code == 200 else 0
                j += 1

        await asyncio.gather(*(one(i) for i in range(CLIENTS)))
        return texts / (time.perf_counter() - started), statuses


def _open_slow_connections(port: int) -> list[socket.socket]:
    conns = []
    for _ in range(SLOW_CONNECTIONS):
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"content-length: 4000\r\n\r\n{")  # fmt: skip
        conns.append(conn)
    return conns


def _answer(conn: socket.socket) -> str:
    """What the server did with a slow connection (left open): its status line, or 'closed'."""
    try:
        head = conn.recv(64)
    except ConnectionResetError:
        return "closed"
    except TimeoutError:
        return "no answer"
    return head.split(b"\r\n", 1)[0].decode() if head else "closed"


@pytest.mark.slow
def test_keyless_slow_connections_take_nothing_from_a_keyed_client(tiny_registry: Path, tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBED_")}
    env.update(
        EMBED_REGISTRY_DIR=str(tiny_registry), EMBED_DEFAULT_MODEL="tiny", EMBED_REGISTRY_POLL_SECONDS="0",
        EMBED_ADAPT_ENABLED="false", EMBED_ADAPT_DIR=str(tmp_path / "adapt"), EMBED_INTRA_OP_THREADS="1",
        EMBED_API_KEYS=KEY, EMBED_MAX_CONCURRENT_REQUESTS="512", HF_HUB_OFFLINE="1",
    )  # fmt: skip
    server = Replica("serve", env, tmp_path / "logs")
    try:
        server.wait_ready()
        url = f"http://127.0.0.1:{server.port}"
        asyncio.run(_keyed_load(url, 0.5))  # warm both sides
        alone, beside, answers, statuses = [], [], [], {}

        def measure_alone() -> None:
            alone.append(asyncio.run(_keyed_load(url, 1.5))[0])

        def measure_beside() -> None:
            conns = _open_slow_connections(server.port)
            answers.extend(_answer(conn) for conn in conns)  # at once: none waits for its body (or holds a slot)
            rate, seen = asyncio.run(_keyed_load(url, 1.5))  # beside them, still connected
            beside.append(rate)
            statuses.update({code: statuses.get(code, 0) + n for code, n in seen.items()})
            for conn in conns:
                conn.close()

        def rounds(n: int) -> float:
            """``n`` more pairs, the order alternating, so a drift of the machine hits both arms alike; the median
            ratio of every pair so far."""
            for _ in range(n):
                pair = (measure_alone, measure_beside) if len(alone) % 2 == 0 else (measure_beside, measure_alone)
                for measure in pair:
                    measure()
            return statistics.median(b / a for a, b in zip(alone, beside, strict=True))

        # A pair's ratio spreads ±0.15 around 1 on a busy 2-core machine with no effect at all (0.75-1.30 seen): the
        # median of 7 pairs then falls under 0.9 in some runs in a hundred. A clear first reading ends the test; any
        # other gets 14 more pairs and is judged on all 21, whose median spreads √3 times less.
        ratio = rounds(7)
        if ratio < CLEAR:
            ratio = rounds(14)
    finally:
        server.stop()
    assert set(statuses) == {200}, statuses  # no 429 (and nothing else) for the keyed client
    assert {answer.split(" ")[1] if answer.startswith("HTTP") else answer for answer in answers} <= {"401", "closed"}
    # each round's own pair (seconds apart) is compared: a drift between rounds moved the medians of the two lists
    # apart by more than the slow connections did (0.957, 1.03, 0.78 per round; 0.897 of the medians), and with the
    # keyed load always measured alone first, five rounds read 0.86-1.15 per pair on a quiet machine
    assert ratio >= 0.9, f"keyed texts/s beside 600 slow keyless connections {beside} vs alone {alone}"

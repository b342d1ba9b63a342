"""Uploads that cannot hurt serving, measured on a real `embedder serve` process: a Parquet file that weighs ~46 MB
and decodes to 2 GB, and one under 1 KB that decodes to 2 GB (one 1 MB string dictionary-encoded on 2,000 rows), are
refused with the limit they hit while the peak resident memory (VmHWM) of the server, and of the process it reads
large uploads in, each rise by less than 300 MB — reading either file whole, as `pyarrow.parquet.read_table` does,
takes 2 GB more."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.adapt.cluster import Replica, cluster_env
from tests.parquet_bombs import dictionary_bomb, plain_bomb

MB = 2**20
MAX_RISE = 300 * MB


def peak_rss(pid: int) -> int:
    """The process's peak resident set size in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def peaks(pid: int) -> dict[int, int]:
    """Peak RSS of the process and of each of its children (the upload reader; no worker runs here)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return {p: peak_rss(p) for p in (pid, *children)}


@pytest.fixture
def replica(tmp_path: Path, base_registry: Path, tiny_bert_path: Path):
    shutil.copytree(base_registry, tmp_path / "registry", symlinks=True)
    env = cluster_env(tmp_path, None, tiny_bert_path, adapt_supervise_worker=False)
    server = Replica("replica", env, tmp_path / "logs")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _post(replica: Replica, data: bytes, name: str = "bomb") -> tuple[int, dict, int]:
    """Post a Parquet upload; the answer's status and error, and the largest rise of a peak RSS (server, reader)."""
    before = peaks(replica.pid)
    r = replica.client.post(
        "/adapt",
        data={"base_model": "tiny", "name": name},
        files={"file": ("corpus.parquet", data, "application/vnd.apache.parquet")},
        timeout=120,
    )
    after = peaks(replica.pid)
    assert set(before) <= set(after), "a process reading uploads stopped"
    return r.status_code, r.json()["error"], max(peak - before.get(pid, 0) for pid, peak in after.items())


def test_parquet_bombs_are_refused_without_decoding_them(replica: Replica) -> None:
    # the reader process starts with the first upload over 1 MiB: start it, so its own start is not counted
    status, error, _ = _post(replica, dictionary_bomb(value_chars=1000, rows=2000) + b"\0" * 2**20, name="Warm")
    assert status == 422
    assert len(peaks(replica.pid)) >= 2  # the reader (and multiprocessing's resource tracker)
    tiny = dictionary_bomb()
    assert len(tiny) < 1024
    status, error, rise = _post(replica, tiny)
    assert (status, error["code"]) == (422, "document_too_long"), error
    assert "1000000 characters long; the limit is 20000" in error["message"]
    assert rise < MAX_RISE, f"a {len(tiny)}-byte upload raised the server's peak RSS by {rise / MB:.0f} MB"

    big = plain_bomb()
    assert 40 * MB < len(big) < 50 * MB
    status, error, rise = _post(replica, big)
    assert (status, error["code"]) == (413, "payload_too_large"), error
    assert "bytes of text; the limit is 52428800 bytes of decoded text (adapt_max_upload_bytes" in error["message"]
    assert rise < MAX_RISE, f"a {len(big) / MB:.0f} MB upload raised the server's peak RSS by {rise / MB:.0f} MB"
    print(f"peak RSS rise: {rise / MB:.0f} MB for a {len(big) / MB:.1f} MB upload that decodes to 2 GB")
    assert replica.serves("tiny-base")  # and the replica still serves

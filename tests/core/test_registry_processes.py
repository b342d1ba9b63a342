"""Several processes publishing and promoting one model name in a shared registry, for real (separate interpreters on
one folder, as replicas and workers on a shared volume): versions never collide, readers never see half a bundle, and
`current` only ever moves to a newer version."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

from core import registry

ROOT = Path(__file__).resolve().parents[2]


def _publish(root: Path, name: str, *, promote: bool, wait_for: Path | None = None) -> tuple[str, bool]:
    """What an exporter does: reserve, build in a hidden folder, rename into place, promote. With ``wait_for``, the
    build stalls after the reservation until that file exists (a slow copy onto the shared volume)."""
    version = registry.reserve_version(root, name)
    staging = root / name / f".staging-{version}"
    staging.mkdir()
    (staging / "model.onnx").write_bytes(b"w" * 4096)
    (staging / registry.MANIFEST).write_text(json.dumps({"name": name, "version": version}))
    if wait_for is not None:
        (wait_for.parent / "reserved").write_text(version)
        while not wait_for.exists():
            time.sleep(0.01)
    registry.publish(staging, root, name, version)
    return version, registry.promote(root, name, version) if promote else False


def _publish_many(root: str, name: str, times: int, out: multiprocessing.Queue) -> None:
    try:
        out.put([_publish(Path(root), name, promote=True) for _ in range(times)])
    except Exception as err:  # a version handed out twice: the second rename into it fails
        out.put(f"{type(err).__name__}: {err}")


def _read_until(
    root: str, name: str, stop: multiprocessing.Event, out: multiprocessing.Queue, reading: multiprocessing.Event,
    seeing: multiprocessing.Event,
) -> None:  # fmt: skip
    """A replica's poll, as fast as it goes: every bundle `current` names must be whole when it is read."""
    seen, broken = set(), []
    reading.set()
    while not stop.is_set():
        bundle = registry.served_models(Path(root)).get(name)
        if bundle is not None:
            seen.add(bundle.name)
            seeing.set()
            model = bundle / "model.onnx"
            if not (model.is_file() and model.stat().st_size == 4096 and registry.read_manifest(bundle)):
                broken.append(bundle.name)
    out.put((sorted(seen, key=int), broken))


def test_a_slower_publish_never_takes_current_back_to_an_older_version(tmp_path: Path) -> None:
    """Two jobs publish one name at once: the one that reserved version 1 is still copying when the other publishes
    and promotes version 2. When the first one promotes, version 2 stays current (it is newer), and the first is told
    its version was not promoted."""
    root, go = tmp_path / "registry", tmp_path / "go"
    root.mkdir()
    code = (
        "import json, sys; from pathlib import Path; from tests.core.test_registry_processes import _publish; "
        f"print(json.dumps(_publish(Path({str(root)!r}), 'acme', promote=True, wait_for=Path({str(go)!r}))))"
    )
    slow = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "reserved").exists():
            assert time.monotonic() < deadline and slow.poll() is None, "the slow publisher never reserved"
            time.sleep(0.01)
        fast = subprocess.run([sys.executable, "-c", code.replace("wait_for=Path", "wait_for=None and Path")],
                              cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        assert json.loads(fast.stdout) == ["2", True]
        assert registry.current_version(root, "acme") == "2"
        go.touch()
        out, _ = slow.communicate(timeout=60)
    finally:
        slow.kill()
    assert json.loads(out) == ["1", False]  # published, not promoted: a newer version is
    assert registry.list_versions(root, "acme") == ["1", "2"]
    assert registry.current_version(root, "acme") == "2"


def test_processes_promoting_one_name_at_once_end_on_the_newest_version(tmp_path: Path) -> None:
    """Four processes each publish and promote the same name five times, all at once, while a fifth reads what is
    current as fast as it can: it only ever finds whole bundles, no number is handed out twice (a listing taken while
    another process renamed its bundle in and dropped its reservation used to miss both, and the second publish of
    that number failed), and `current` ends on the highest."""
    root = tmp_path / "registry"
    root.mkdir()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_publish_many, args=(str(root), "acme", 5, out)) for _ in range(4)]
    stop, read, reading, seeing = ctx.Event(), ctx.Queue(), ctx.Event(), ctx.Event()
    reader = ctx.Process(target=_read_until, args=(str(root), "acme", stop, read, reading, seeing))
    try:
        reader.start()
        assert reading.wait(120)  # the publishers start once the reader runs, however slowly the processes start
        for p in procs:
            p.start()
        answers = [out.get(timeout=120) for _ in procs]
        seeing.wait(60)  # and it stops once it has read a version, however little time it was given meanwhile
        stop.set()
        seen, broken = read.get(timeout=60)
    finally:
        stop.set()
        for p in [*procs, reader]:  # none left working on the folder after a failure
            if p.pid is not None:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
                    p.join()
    assert seen and broken == []  # the reader saw versions come and go, each one whole
    assert [a for a in answers if isinstance(a, str)] == []
    results = [r for answer in answers for r in answer]
    versions = sorted(int(v) for v, _ in results)
    assert versions == list(range(1, 21))  # no version twice, none lost
    assert registry.list_versions(root, "acme") == [str(v) for v in versions]
    assert registry.current_version(root, "acme") == "20"
    assert ("20", True) in results

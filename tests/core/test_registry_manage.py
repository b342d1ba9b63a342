"""Managing a name's versions in the registry: what each is (`version_summary`), an operator's rollback
(`make_current`) beside the forward-only `promote` of publishes, and `prune` — in one process, then with several
processes sharing the folder (pruning while others publish, promote and roll back; a reader never finds a version
half there)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import registry

ROOT = Path(__file__).resolve().parents[2]
MODEL_BYTES = 4096


def publish(root: Path, name: str, *, promote: bool = True, age_s: float = 0.0, **extra: object) -> str:
    """What an exporter does (reserve, build in a hidden folder, rename in, promote); ``age_s`` dates it back."""
    version = registry.reserve_version(root, name)
    staging = root / name / f".staging-{version}"
    staging.mkdir()
    (staging / "model.onnx").write_bytes(b"w" * MODEL_BYTES)
    manifest = {"name": name, "version": version, "onnx": {"fp32": "model.onnx"}, "files": {"model.onnx": "x"}}
    (staging / registry.MANIFEST).write_text(json.dumps({**manifest, **extra}))
    bundle = registry.publish(staging, root, name, version)
    if age_s:
        then = time.time() - age_s
        os.utime(bundle, (then, then))
    if promote:
        registry.promote(root, name, version)
    return version


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "registry"
    folder.mkdir()
    return folder


def test_a_version_summary_says_what_it_is_and_the_gate_it_passed(root: Path) -> None:
    row = {"task": "Pieces", "baseline": 61.2, "candidate": 70.3, "delta": 9.1, "status": "ok"}
    gate = {"passed": True, "decided_on": "Pieces", "margin": 2.0, "reasons": [], "table": [row]}
    validation = {"job": "j1", "evaluation": {"big": "x" * 1000}, "gate": gate}
    publish(root, "acme", created_at="2026-12-01T10:00:00+00:00", base_model="minilm-l6", quantization="int8",
            method={"name": "adapt"}, validation=validation)  # fmt: skip
    publish(root, "acme", promote=False)
    registry.reserve_version(root, "acme")
    first, second = (registry.version_summary(root, "acme", v) for v in registry.list_versions(root, "acme"))
    assert first["current"] and not second["current"]
    assert (first["created_at"], first["base_model"], first["method"], first["quantization"]) == (
        "2026-12-01T10:00:00+00:00", "minilm-l6", "adapt", "int8")  # fmt: skip
    assert first["validation"]["job"] == "j1" and first["validation"]["gate_passed"] is True
    assert first["validation"]["decided_on_score"]["candidate"] == 70.3
    assert "evaluation" not in first["validation"]  # the whole evaluation stays in the manifest
    assert first["size_bytes"] > MODEL_BYTES and first["problem"] is None
    assert second["validation"] is None
    assert registry.publishing_versions(root, "acme") == ["3"]
    assert registry.model_names(root) == ["acme"]


def test_an_operator_rolls_back_while_publishes_still_only_move_forward(root: Path) -> None:
    for _ in range(3):
        publish(root, "acme")
    assert registry.make_current(root, "acme", "1") == "3"
    assert registry.current_version(root, "acme") == "1"
    assert registry.make_current(root, "acme", "1") == "1"  # already current: nothing changes
    # the rule of publishes is untouched: a promotion of a version older than the current one leaves it current
    registry.make_current(root, "acme", "3")
    assert registry.promote(root, "acme", "2") is False
    assert registry.current_version(root, "acme") == "3"


def test_a_rollback_to_a_version_that_is_missing_half_written_or_being_published_is_refused(root: Path) -> None:
    publish(root, "acme")
    publish(root, "acme")
    with pytest.raises(registry.RegistryError, match=r"acme has no version '7' \(versions: 1, 2\)"):
        registry.make_current(root, "acme", "7")
    with pytest.raises(registry.RegistryError, match=r"no model 'nope'.*models: acme"):
        registry.make_current(root, "nope", "1")
    reserved = registry.reserve_version(root, "acme")
    with pytest.raises(registry.RegistryError, match=f"version {reserved} of acme is still being published"):
        registry.make_current(root, "acme", reserved)
    (root / "acme" / "1" / "model.onnx").unlink()  # a bundle someone half deleted by hand
    with pytest.raises(registry.RegistryError, match=r"incomplete: model\.onnx missing; not promoted"):
        registry.make_current(root, "acme", "1")
    assert registry.current_version(root, "acme") == "2"


def test_prune_keeps_the_newest_the_current_and_what_is_being_published(root: Path) -> None:
    for _ in range(5):
        publish(root, "acme", age_s=3600)
    registry.make_current(root, "acme", "2")  # rolled back
    reserved = registry.reserve_version(root, "acme")
    dry = registry.prune(root, "acme", 2, dry_run=True)
    assert dry.removed == ["1", "3"] and dry.freed_bytes > 2 * MODEL_BYTES
    assert registry.list_versions(root, "acme") == ["1", "2", "3", "4", "5"]  # a dry run removes nothing
    done = registry.prune(root, "acme", 2)
    assert done.removed == ["1", "3"]
    assert done.kept == {"5": "among the newest 2", "4": "among the newest 2", "2": "current"}
    assert done.publishing == [reserved]
    assert registry.list_versions(root, "acme") == ["2", "4", "5"]
    assert registry.current_version(root, "acme") == "2"
    assert sorted(p.name for p in (root / "acme").iterdir()) == [".lock", f".reserved-{reserved}", "2", "4", "5",
                                                                 "current"]  # fmt: skip
    assert reserved == "6" and registry.reserve_version(root, "acme") == "7"  # numbers are never handed out twice


def test_prune_spares_a_version_published_moments_ago_and_refuses_keeping_none(root: Path) -> None:
    publish(root, "acme", age_s=3600)
    publish(root, "acme", promote=False)  # just published: its publisher may be about to promote it
    publish(root, "acme", promote=False)
    result = registry.prune(root, "acme", 1)
    assert result.removed == [] and result.kept["2"].startswith("published ")
    assert registry.prune(root, "acme", 1, grace_seconds=0).removed == ["2"]
    for keep in (0, -1):
        with pytest.raises(registry.RegistryError, match="keep must be at least 1"):
            registry.prune(root, "acme", keep)


def test_prune_deletes_what_a_prune_that_died_left_behind(root: Path) -> None:
    for _ in range(2):
        publish(root, "acme")
    left = root / "acme" / ".pruned-1-dead"
    (root / "acme" / "1").rename(left)  # a prune killed between its rename and its delete
    assert registry.list_versions(root, "acme") == ["2"]
    registry.prune(root, "acme", 1)
    assert not left.exists()


# ------------------------------------------------------------------------------------------- several processes
def _publish_many(root: str, times: int, out: multiprocessing.Queue) -> None:
    try:
        out.put([publish(Path(root), "acme") for _ in range(times)])
    except Exception as err:  # a version removed between its publish and its promotion, a number reused
        out.put(f"{type(err).__name__}: {err}")


def _prune_until(
    root: str, keep: int, grace: float, stop: multiprocessing.Event, out: multiprocessing.Queue,
    pruning: multiprocessing.Event,
) -> None:  # fmt: skip
    removed: list[str] = []
    try:
        while not stop.is_set():
            removed += registry.prune(Path(root), "acme", keep, grace_seconds=grace).removed
            pruning.set()
    except Exception as err:
        out.put(f"{type(err).__name__}: {err}")
        return
    out.put(removed)


def _roll_back_until(
    root: str, stop: multiprocessing.Event, out: multiprocessing.Queue, rolling: multiprocessing.Event
) -> None:
    """An operator promoting older and newer versions back and forth while the prune runs."""
    promoted, refused = [], 0
    while not stop.is_set():
        for version in registry.list_versions(Path(root), "acme"):
            try:
                registry.make_current(Path(root), "acme", version)
                promoted.append(version)
                rolling.set()
            except registry.RegistryError:  # pruned after it was listed: refused, never half done
                refused += 1
    out.put((promoted, refused))


def _read_until(
    root: str, stop: multiprocessing.Event, out: multiprocessing.Queue, reading: multiprocessing.Event
) -> None:
    """A replica's poll as fast as it goes: what `current` names is whole, or (pruned after it was read) gone whole —
    never a folder still there with files missing."""
    reads, broken = 0, []
    while not stop.is_set():
        bundle = registry.served_models(Path(root)).get("acme")
        if bundle is None:
            continue
        reads += 1
        reading.set()
        model = bundle / "model.onnx"
        whole = model.is_file() and model.stat().st_size == MODEL_BYTES and (bundle / registry.MANIFEST).is_file()
        if not whole and bundle.exists():
            broken.append(bundle.name)
    out.put((reads, broken))


def _end(*processes: multiprocessing.Process) -> None:
    """Join the processes a test started (stopped by its event); any still running after a failure is killed, so none
    keeps working on its folder beside the next tests."""
    for process in processes:
        if process.pid is not None:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
                process.join()


def test_pruning_while_other_processes_publish_and_promote_loses_nothing(root: Path) -> None:
    """Three processes publish and promote one name five times each while a fourth prunes it to one version in a loop
    and a fifth reads what is current: every publish gets its own number and promotes (none of the fresh versions is
    pruned under a publisher about to promote it), a publish held between its reservation and its rename the whole
    time finishes, the old versions go, and `current` is never found half there."""
    for _ in range(4):
        publish(root, "acme", age_s=3600)
    slow_go = root.parent / "go"
    code = (
        "import json, time; from pathlib import Path; from core import registry; "
        f"root, go = Path({str(root)!r}), Path({str(slow_go)!r}); v = registry.reserve_version(root, 'acme'); "
        "s = root / 'acme' / f'.staging-{v}'; s.mkdir(); (s / 'model.onnx').write_bytes(b'w' * 4096); "
        "(s / 'manifest.json').write_text(json.dumps({'name': 'acme', 'version': v})); print(v, flush=True); "
        "[time.sleep(0.01) for _ in iter(lambda: go.exists(), True)]; registry.publish(s, root, 'acme', v); print('ok')"
    )
    slow = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    ctx = multiprocessing.get_context("spawn")
    out, stop, pruned, read = ctx.Queue(), ctx.Event(), ctx.Queue(), ctx.Queue()
    pruning, reading = ctx.Event(), ctx.Event()
    pruner = ctx.Process(target=_prune_until, args=(str(root), 1, 60.0, stop, pruned, pruning))
    reader = ctx.Process(target=_read_until, args=(str(root), stop, read, reading))
    publishers = [ctx.Process(target=_publish_many, args=(str(root), 5, out)) for _ in range(3)]
    try:
        slow_version = slow.stdout.readline().strip()
        assert slow_version == "5"
        for p in [pruner, reader]:
            p.start()
        # the publishers start once the prune and the reader run: however slowly the processes start, they overlap
        assert pruning.wait(120) and reading.wait(120)
        for p in publishers:
            p.start()
        answers = [out.get(timeout=120) for _ in publishers]
        slow_go.touch()
        assert slow.communicate(timeout=60)[0].strip() == "ok"
        stop.set()
        removed, (reads, broken) = pruned.get(timeout=60), read.get(timeout=60)
    finally:
        stop.set()
        slow.kill()
        _end(pruner, reader, *publishers)
    assert [a for a in answers if isinstance(a, str)] == [] and not isinstance(removed, str), (answers, removed)
    fresh = sorted(int(v) for answer in answers for v in answer)
    assert fresh == list(range(6, 21))  # no number twice, every publish promoted without an error
    assert sorted(removed, key=int) == ["1", "2", "3", "4"]  # the old ones went; nothing fresh did
    assert registry.list_versions(root, "acme") == [slow_version, *map(str, fresh)]
    assert registry.current_version(root, "acme") == "20"
    assert reads and broken == []


def test_a_rollback_racing_a_prune_ends_on_a_whole_current_version(root: Path) -> None:
    """One process promotes every listed version in turn (rollbacks included) while another prunes the name to one
    version in a loop: each promotion either happens or is refused because its version was pruned first, `current`
    always names a whole bundle, and the versions left are the newest and the current one."""
    for _ in range(8):
        publish(root, "acme", age_s=3600)
    ctx = multiprocessing.get_context("spawn")
    stop, pruned, rolled, read = ctx.Event(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    pruning, rolling, reading = ctx.Event(), ctx.Event(), ctx.Event()
    pruner = ctx.Process(target=_prune_until, args=(str(root), 1, 0.0, stop, pruned, pruning))
    procs = [
        ctx.Process(target=_roll_back_until, args=(str(root), stop, rolled, rolling)),
        ctx.Process(target=_read_until, args=(str(root), stop, read, reading)),
    ]
    try:
        for p in procs:
            p.start()
        # the prune starts once the rollbacks and the reader run: however slowly the processes start, they overlap
        assert rolling.wait(120) and reading.wait(120)
        pruner.start()
        deadline = time.monotonic() + 60
        while len(registry.list_versions(root, "acme")) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        stop.set()
        removed, (promoted, _), (reads, broken) = pruned.get(timeout=60), rolled.get(timeout=60), read.get(timeout=60)
    finally:
        stop.set()
        _end(pruner, *procs)
    assert not isinstance(removed, str), removed
    assert promoted and reads and broken == []
    current = registry.current_version(root, "acme")
    assert current is not None and registry.bundle_problem(root / "acme" / current) is None
    assert set(registry.list_versions(root, "acme")) == {"8", current}
    assert sorted(set(removed) | {"8", current}, key=int) == [str(v) for v in range(1, 9)]


def test_a_promote_whose_version_is_pruned_before_it_holds_the_lock_leaves_current_alone(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried /adapt job promotes a version its earlier attempt published long ago, while another job's
    keep_versions prune may remove it: whether it is there is decided under the lock, or ``current`` would point at a
    removed version and the name would stop being served."""
    old = publish(root, "acme", promote=False, age_s=3600)
    newer = publish(root, "acme", promote=False)  # neither promoted: the gate failed, say
    real_locked = registry._locked

    @contextlib.contextmanager
    def pruned_first(folder: Path):  # another process prunes ``old`` just before this one takes the lock
        monkeypatch.setattr(registry, "_locked", real_locked)
        registry.prune(root, "acme", 1, grace_seconds=0)
        with real_locked(folder):
            yield

    monkeypatch.setattr(registry, "_locked", pruned_first)
    with pytest.raises(registry.RegistryError, match="no bundle"):
        registry.promote(root, "acme", old)
    assert not (root / "acme" / registry.CURRENT).is_symlink()
    assert registry.list_versions(root, "acme") == [newer]

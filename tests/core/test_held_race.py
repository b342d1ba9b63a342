"""A sweep that runs while another process marks its new folder as held leaves that folder alone."""

from __future__ import annotations

import fcntl
import threading

from core import held

PREFIX = "embedder-race-"


def test_a_folder_being_marked_is_not_swept(tmp_path, monkeypatch) -> None:
    locking, swept = threading.Event(), threading.Event()
    flock = fcntl.flock
    made: list[object] = []
    maker: threading.Thread | None = None

    def slow_flock(fd: int, operation: int) -> None:  # the maker's first lock waits until the sweep has run
        if threading.current_thread() is maker and operation & fcntl.LOCK_EX and not locking.is_set():
            locking.set()
            assert swept.wait(30)
        flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", slow_flock)
    maker = threading.Thread(target=lambda: made.append(held.make_held(PREFIX, tmp_path)))
    maker.start()
    assert locking.wait(30)
    try:
        assert held.sweep(tmp_path, f"{PREFIX}*") == []  # the folder is being marked: its maker lives
    finally:
        swept.set()
        maker.join()
    folder = made[0]
    assert folder.is_dir() and (folder / held.HELD_FILE).is_file()  # type: ignore[union-attr]
    assert not held.abandoned(folder)  # type: ignore[arg-type]
    assert held.sweep(tmp_path, f"{PREFIX}*") == []
    held.let_go(folder)  # type: ignore[arg-type]
    assert held.sweep(tmp_path, f"{PREFIX}*") == [folder]

"""Sleep's disk tier from Python (backup_dir, docs/sleep.md) on the session's simulated device:
stitch.configure takes backup_dir / backup_dir_mb / backup_host_mb (and refuses an unusable
directory by its path), a sleep's backups beyond backup_host_mb go to files and come back byte
for byte, the residency and stitch.stat say where they lie, nothing stays in the directory; the
progress of a long sleep or wake reaches a callable, stderr or the "stitch" logger; the launcher's
--backup-dir and --backup-host-mb.
"""

import ctypes
import logging
import os

import pytest

import stitch
from stitch import _progress
from test_torch_module import fake_torch_dir, launch  # noqa: F401  (the launcher's fixtures)

MiB = 1 << 20


@pytest.fixture
def disk_tier(tmp_path, no_leaks):
    """backup_dir in a fresh directory, 1 MiB of pinned host memory for backups; both off after."""
    d = tmp_path / "backups"
    stitch.configure(f"backup_dir:{d},backup_host_mb:1")
    yield d
    stitch.wake()
    stitch.configure("backup_dir:none,backup_host_mb:0")


def _fill(ptr, size, seed):
    data = bytes((seed + i * 13) % 253 for i in range(size))
    ctypes.memmove(ptr, data, size)
    return data


def test_backups_beyond_the_host_go_to_files_and_come_back(disk_tier):
    assert disk_tier.is_dir(), "created when missing"
    with stitch.region("py-disk", backup=True):
        p = stitch.malloc(6 * MiB, 0)
    try:
        data = _fill(p, 6 * MiB, 3)
        res = stitch.sleep("py-disk", device=0)
        entry = next(t for t in res["tags"] if t["tag"] == "py-disk")
        assert entry["state"] == "asleep"
        assert entry["backup"] in ("file", "both")
        assert entry["backup_file_bytes"] + entry["host_backup_bytes"] == 6 * MiB
        assert entry["backup_file_bytes"] >= 5 * MiB
        assert stitch.stat("backup_file_bytes.current", 0) == entry["backup_file_bytes"]
        assert res["backup_file_bytes"] == entry["backup_file_bytes"]
        assert os.listdir(disk_tier) == [], "the files have no name"
        stitch.wake("py-disk", device=0)
        assert ctypes.string_at(p, 6 * MiB) == data
        assert stitch.stat("backup_file_bytes.current", 0) == 0
        assert stitch.backup_progress(0).op is None, "nothing runs now"
    finally:
        stitch.free(p, 6 * MiB, 0)


def test_a_kv_pools_backup_beyond_the_host_goes_to_a_file(disk_tier):
    block = 128 * 1024
    with stitch.kv.Pool(0, buffers=2, block_bytes=block, max_blocks=64, tag="py-kv-disk", backup=True) as pool:
        ids = pool.alloc(12)
        data = [bytes((b * 31 + i * 7) % 251 for i in range(12 * block)) for b in range(2)]
        for b in range(2):
            memoryview(pool.buffer(b))[: 12 * block] = data[b]
        res = stitch.sleep("py-kv-disk", device=0)
        entry = next(k for k in res["kv_pools"] if k["tag"] == "py-kv-disk")
        assert entry["state"] == "asleep" and entry["backup"] == "file"
        assert entry["host_backup_bytes"] == 0 and entry["backup_file_bytes"] == entry["used_bytes"] > 0
        assert stitch.stat("backup_file_bytes.current", 0) == entry["backup_file_bytes"]
        assert os.listdir(disk_tier) == [], "the file has no name"
        stitch.wake("py-kv-disk", device=0)
        for b in range(2):
            assert bytes(memoryview(pool.buffer(b))[: 12 * block]) == data[b]
        assert stitch.stat("backup_file_bytes.current", 0) == 0
        pool.free(ids)


def test_configure_refuses_an_unusable_directory_by_its_path(tmp_path):
    f = tmp_path / "plain"
    f.write_text("x")
    with pytest.raises(stitch.StitchError, match=f"backup_dir '{f}' is not usable: it is not a directory"):
        stitch.configure(f"backup_dir:{f}")
    with pytest.raises(stitch.StitchError, match="backup_dir"):
        stitch.configure("backup_dir:relative/dir")
    assert "backup_dir" not in stitch.config()


def test_a_sleep_past_the_caps_fails_with_nothing_changed(disk_tier):
    stitch.configure("backup_dir_mb:2")
    with stitch.region("py-disk-cap", backup=True):
        p = stitch.malloc(8 * MiB, 0)
    try:
        data = _fill(p, 8 * MiB, 5)
        with pytest.raises(stitch.StitchError, match="backup_dir_mb caps the backup files"):
            stitch.sleep("py-disk-cap", device=0)
        assert ctypes.string_at(p, 8 * MiB) == data
        assert stitch.stat("sleeping_bytes.current", 0) == 0
        assert os.listdir(disk_tier) == []
    finally:
        stitch.configure("backup_dir_mb:0")
        stitch.free(p, 8 * MiB, 0)


class _Clock:
    """A monotonic clock that advances 1.5 s at every reading (each report is 'long')."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        self.now += 1.5
        return self.now


def _fake_progress(monkeypatch, steps):
    """_progress.read returns `steps` one after the other (then nothing runs); the call waits
    until the watcher has read them all."""
    seq = list(steps)
    done = __import__("threading").Event()

    def read(device):
        if seq:
            return seq.pop(0)
        done.set()
        return _progress.BackupProgress(None, 0, 0)

    monkeypatch.setattr(_progress, "read", read)
    monkeypatch.setattr(_progress, "time", _Clock())
    return lambda: done.wait(10) or "the watcher never read"


def test_progress_reaches_a_callable_stderr_and_the_logger(monkeypatch, capsys, caplog):
    steps = [_progress.BackupProgress("sleep", n * MiB, 4 * MiB) for n in (1, 2, 3)]
    seen = []
    wait = _fake_progress(monkeypatch, steps)
    assert _progress.run(wait, [0], "sleep", lambda d, t: seen.append((d, t)), interval=0.001) is True
    assert seen == [(MiB, 4 * MiB), (2 * MiB, 4 * MiB), (3 * MiB, 4 * MiB), (4 * MiB, 4 * MiB)]

    wait = _fake_progress(monkeypatch, steps)
    _progress.run(wait, [0], "sleep", True, interval=0.001)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("stitch sleep: 0.00 of 0.00 GiB of backups copied (25.0%)"), err
    assert "(100.0%)" in err[-1], err

    wait = _fake_progress(monkeypatch, steps)
    with caplog.at_level(logging.INFO, logger="stitch"):
        _progress.run(wait, [0], "wake", None, interval=0.001)
    assert any("stitch wake:" in r.getMessage() and "(75.0%)" in r.getMessage() for r in caplog.records)

    # A callback that raises is warned about once and not called again; the call goes on.
    wait = _fake_progress(monkeypatch, steps)

    def broken(done, total):
        raise ValueError("no")

    with pytest.warns(RuntimeWarning, match="progress callback raised"):
        assert _progress.run(wait, [0], "sleep", broken, interval=0.001) is True
    # False: no watcher at all.
    monkeypatch.setattr(_progress, "read", lambda d: pytest.fail("read with progress=False"))
    assert _progress.run(lambda: 7, [0], "sleep", False) == 7
    with pytest.raises(TypeError):
        _progress.run(lambda: 7, [0], "sleep", "yes")


def test_sleep_and_wake_take_progress(disk_tier):
    with stitch.region("py-disk-progress", backup=True):
        p = stitch.malloc(4 * MiB, 0)
    try:
        data = _fill(p, 4 * MiB, 9)
        calls = []
        stitch.sleep("py-disk-progress", device=0, progress=lambda d, t: calls.append((d, t)))
        stitch.wake("py-disk-progress", device=0, progress=False)
        assert ctypes.string_at(p, 4 * MiB) == data
        for done, total in calls:  # (a fast sleep may finish before the first report)
            assert 0 <= done <= total == 4 * MiB
    finally:
        stitch.free(p, 4 * MiB, 0)


def test_launcher_backup_options(launch, tmp_path):  # noqa: F811
    d = tmp_path / "parking lot"
    r = launch("--backup-dir", str(d), "--backup-host-mb", "2", "SCRIPT")
    assert r.returncode == 0, r.stderr
    assert d.is_dir(), "the launcher's directory is made"
    r = launch("--backup-dir=a,b", "SCRIPT")
    assert r.returncode != 0 and "has a ','" in r.stderr, r.stderr
    r = launch("--backup-host-mb", "lots", "SCRIPT")
    assert r.returncode != 0 and "--backup-host-mb takes a number of MiB" in r.stderr
    f = tmp_path / "file"
    f.write_text("x")
    r = launch("--backup-dir", str(f), "SCRIPT")
    assert r.returncode != 0 and f"backup_dir '{f}' is not usable" in r.stderr, r.stderr

"""stitch._progress — the progress of long sleeps and wakes (the disk tier, docs/sleep.md).

stitch_sleep and stitch_wake hold their device for as long as the backups take to copy (minutes
for a large model going to or coming from an NVMe disk). ctypes releases the GIL during the call,
so a watcher thread reads ``stitch_backup_progress`` meanwhile and reports it: to a callable, as
lines on stderr, or to the ``stitch`` logger (the default, at INFO, once the call has run for
2 s). Used by :func:`stitch.sleep` and :func:`stitch.wake` (their ``progress`` argument).
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
import warnings
from typing import Callable, Iterable, NamedTuple, Optional, TypeVar, Union

from . import _lib

#: What ``progress=`` takes: None (the ``stitch`` logger at INFO after 2 s), True (lines on
#: stderr), False (nothing), or a callable(done_bytes, total_bytes).
Progress = Union[None, bool, Callable[[int, int], None]]

_OPS = {1: "sleep", 2: "wake"}
_GiB = float(1 << 30)
logger = logging.getLogger("stitch")

T = TypeVar("T")


class BackupProgress(NamedTuple):
    """A sleep's or a wake's progress on one device: ``op`` "sleep", "wake" or None (neither
    runs), bytes of backups copied out or back so far (``done``) of ``total``."""

    op: Optional[str]
    done: int
    total: int


def read(device: int) -> BackupProgress:
    """The progress of the sleep or wake running on ``device`` now."""
    fn = _lib.require("stitch_backup_progress")
    done, total = ctypes.c_uint64(0), ctypes.c_uint64(0)
    rc = fn(device, ctypes.byref(done), ctypes.byref(total))
    _lib.check(rc < 0, "backup_progress")
    return BackupProgress(_OPS.get(rc), int(done.value), int(total.value))


def _text(what: str, done: int, total: int, seconds: float) -> str:
    pct = 100.0 * done / total if total else 100.0
    rate = done / _GiB / seconds if seconds > 0 else 0.0
    return (f"stitch {what}: {done / _GiB:.2f} of {total / _GiB:.2f} GiB of backups copied ({pct:.1f}%), "
            f"{rate:.2f} GiB/s, {seconds:.0f} s")


def run(call: Callable[[], T], devices: Iterable[int], what: str, progress: Progress,
        interval: float = 0.5) -> T:
    """Runs ``call`` (a stitch_sleep or stitch_wake of ``devices``) while a watcher thread
    reports its progress as ``progress`` says. Returns what ``call`` returns."""
    if progress is False or not _lib.has("stitch_backup_progress"):
        return call()
    if not (progress is None or progress is True or callable(progress)):
        raise TypeError("progress must be None, True, False or a callable(done_bytes, total_bytes)")
    devices = list(devices)
    stop = threading.Event()
    start = time.monotonic()
    seen = {"total": 0, "called": False, "printed": False}

    def report(done: int, total: int, final: bool = False) -> None:
        elapsed = time.monotonic() - start
        if callable(progress):
            try:
                progress(done, total)
                seen["called"] = True
            except Exception as e:  # noqa: BLE001 - a broken callback must not break the sleep
                warnings.warn(f"stitch.{what}: the progress callback raised {e!r}; it is not called again",
                              RuntimeWarning, stacklevel=3)
                seen["called"] = None
        elif progress is True:
            if elapsed >= 1.0 or (final and seen["printed"]):
                print(_text(what, done, total, elapsed), file=sys.stderr, flush=True)
                seen["printed"] = True
        elif elapsed >= 2.0 or (final and seen["printed"]):
            logger.info(_text(what, done, total, elapsed))
            seen["printed"] = True

    def watch() -> None:
        while not stop.wait(interval):
            done = total = 0
            running = False
            for d in devices:
                p = read(d)
                if p.op is not None:
                    running = True
                    done, total = done + p.done, total + p.total
            if running and total and seen["called"] is not None:
                seen["total"] = max(seen["total"], total)
                report(done, total)

    watcher = threading.Thread(target=watch, name=f"stitch-{what}-progress", daemon=True)
    watcher.start()
    try:
        result = call()
    finally:
        stop.set()
        watcher.join()
    # The end, once, where anything was reported.
    if seen["total"] and (seen["called"] or seen["printed"]):
        report(seen["total"], seen["total"], final=True)
    return result

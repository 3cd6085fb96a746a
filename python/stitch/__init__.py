"""stitch: a drop-in CUDA caching allocator — Python bindings (ctypes over libstitch's C API).

Everything here talks to the one process-wide stitch allocator that libstitch creates at first
use from ``STITCH_ALLOC_CONF`` plus any :func:`configure` calls made before it. For PyTorch, see
:mod:`stitch.torch` (``stitch.torch.enable()`` or ``python -m stitch.torch script.py``).

The statistics mirror ``torch.cuda.memory_stats()`` (which raises under a pluggable allocator):
:func:`memory_stats`, :func:`memory_allocated`, :func:`memory_reserved`, :func:`memory_summary`,
:func:`dump_snapshot` (opens in https://pytorch.org/memory_viz), :func:`record_history`.

Region tags, sleep and wake (docs/sleep.md): allocations made inside ``with stitch.region(tag):``
carry ``tag``; :func:`sleep` gives the tags' memory back to the device (addresses kept, contents
kept only for regions with ``backup=True`` or tags named in ``backup=``), :func:`wake` maps fresh
memory at the same addresses, :func:`residency` says what is where, :func:`trim` gives cached
memory back down to a target.
"""

from __future__ import annotations

import collections as _collections
import contextlib as _contextlib
import ctypes as _ctypes
import json as _json
import os as _os
import sys as _sys
import threading as _threading
from typing import Any, Iterable, Iterator, Optional, Union

from . import _lib, _progress
from ._lib import LibraryNotFoundError, OutOfMemoryError, StitchError, library_path

__version__ = "0.1.0"

__all__ = [
    "StitchError",
    "OutOfMemoryError",
    "LibraryNotFoundError",
    "MEMORY_STATS_KEYS",
    "TORCH_MEMORY_STATS_KEYS",
    "configure",
    "config",
    "device_count",
    "malloc",
    "free",
    "record_stream",
    "stat",
    "memory_stats",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_summary",
    "dump_snapshot",
    "record_history",
    "empty_cache",
    "set_memory_fraction",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "get_memory_fraction",
    "region",
    "backup_progress",
    "sleep",
    "wake",
    "trim",
    "residency",
    "spill",
    "unspill",
    "library_path",
]

Device = Union[int, str, Any, None]
Tags = Union[str, Iterable[str], None]
Stream = Union[int, Any, None]


# Flags of stitch_stat_key() (include/stitch/stitch.h).
_STAT_TORCH = 1          # one of torch.cuda.memory_stats()'s keys
_STAT_MEMORY_STATS = 2   # returned by memory_stats()
_key_table: Optional[tuple] = None


def _keys() -> tuple:
    """Every statistic's key and flags, in the order stitch_stats() fills them (from the library:
    core/stats.cpp is the one list)."""
    global _key_table
    if _key_table is None:
        L = _lib.lib()
        flags = _ctypes.c_int()
        table = []
        for i in range(L.stitch_stat_count()):
            key = L.stitch_stat_key(i, _ctypes.byref(flags))
            table.append((key.decode(), flags.value))
        _key_table = tuple(table)
    return _key_table


def __getattr__(name: str) -> Any:
    # The key lists come from the library, loaded at first use (not at import).
    if name == "TORCH_MEMORY_STATS_KEYS":
        #: The keys of ``torch.cuda.memory_stats()`` (PyTorch 2.x native allocator), sorted as it
        #: sorts them. (The newest PyTorch main also has ``num_oom_rejections`` and
        #: per-private-pool ``reserved_bytes_by_private_pools.*``, which stitch does not have.)
        return tuple(sorted(k for k, f in _keys() if f & _STAT_TORCH))
    if name == "MEMORY_STATS_KEYS":
        #: What :func:`memory_stats` returns: PyTorch's keys plus stitch's ``num_invalid_frees``.
        return tuple(sorted(k for k, f in _keys() if f & _STAT_MEMORY_STATS))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _device_index(device: Device, default_all: bool = False) -> int:
    """An int device index from an int, "cuda:N", a torch.device, or None (the current device;
    with ``default_all``, None means every device: -1)."""
    if device is None:
        if default_all:
            return -1
        torch = _sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # pragma: no cover - a broken torch must not break stitch
            pass
        return 0
    if isinstance(device, bool):
        raise TypeError("stitch: device must be an int, 'cuda:N' or a torch.device")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        if kind != "cuda" or (idx and not idx.isdigit()):
            raise ValueError(f"stitch: not a CUDA device: {device!r}")
        return int(idx) if idx else _device_index(None)
    index = getattr(device, "index", None)
    if getattr(device, "type", "cuda") != "cuda":
        raise ValueError(f"stitch: not a CUDA device: {device!r}")
    return _device_index(None) if index is None else int(index)


def _stream_handle(stream: Stream) -> Optional[int]:
    """A raw cudaStream_t from an int, None (the default stream) or a torch.cuda.Stream."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        raise TypeError(f"stitch: not a stream: {stream!r}")
    return int(handle) or None


def configure(conf: str) -> None:
    """Applies a ``key:value,...`` configuration (STITCH_ALLOC_CONF syntax).

    Before the first allocation any key may be set (backend, sim_capacity_mb, ...); afterwards
    only tunables. Raises StitchError with stitch's message for an unknown key or a bad value.
    """
    if not isinstance(conf, str):
        raise TypeError("stitch.configure: conf must be a str")
    rc = _lib.lib().stitch_configure(conf.encode())
    _lib.check(rc != 0, "configure")


def malloc(size: int, device: Device = None, stream: Stream = None) -> int:
    """Allocates ``size`` bytes; returns the address (0 for size 0).

    Raises OutOfMemoryError (a StitchError and a MemoryError) with stitch's report when there is
    no room, StitchError for anything else. Meant for tests and tools: tensors get their memory
    through stitch.torch.
    """
    if size < 0:
        raise ValueError("stitch.malloc: size must be >= 0")
    ptr = _lib.lib().stitch_malloc(size, _device_index(device), _stream_handle(stream))
    if not ptr:
        _lib.check(size != 0, "malloc")
        return 0
    return int(ptr)


def free(ptr: int, size: int, device: Device = None, stream: Stream = None) -> None:
    """Frees ``ptr`` (``size`` and ``device`` as allocated; ``stream``: its last use).

    An unknown pointer, a double free or a wrong size/device changes nothing, is counted in
    ``num_invalid_frees`` and raises StitchError with stitch's message. 0 does nothing.
    """
    if not ptr:
        return
    L = _lib.lib()
    L.stitch_clear_error()  # stitch_free returns nothing: an error text after it is its failure
    L.stitch_free(ptr, size, _device_index(device), _stream_handle(stream))
    msg = _lib.last_error()
    if msg:
        raise _lib.error_from(msg)


def record_stream(ptr: int, stream: Stream) -> None:
    """Marks ``ptr`` as used on ``stream`` too (see Tensor.record_stream)."""
    rc = _lib.lib().stitch_record_stream(ptr, _stream_handle(stream))
    _lib.check(rc != 0, "record_stream")


def stat(key: str, device: Device = None) -> int:
    """One statistic by its PyTorch name, e.g. ``"reserved_bytes.all.peak"``."""
    L = _lib.lib()
    L.stitch_clear_error()
    value = L.stitch_stat(_device_index(device), key.encode())
    # -1 is also a real value (max_split_size when unlimited): the error text decides.
    if value == -1:
        msg = _lib.last_error()
        if msg:
            raise _lib.error_from(msg)
    return int(value)


def memory_stats(device: Device = None) -> "_collections.OrderedDict[str, int]":
    """``torch.cuda.memory_stats()`` for stitch: an OrderedDict with exactly PyTorch's keys (sorted
    like PyTorch sorts them) plus ``num_invalid_frees``.

    One call reads every value at once, under the device's lock: the values are one consistent
    snapshot of the device.
    """
    table = _keys()
    values = (_ctypes.c_int64 * len(table))()
    L = _lib.lib()
    n = L.stitch_stats(_device_index(device), values, len(table))
    _lib.check(n < 0, "stats")
    got = {k: int(values[i]) for i, (k, f) in enumerate(table) if f & _STAT_MEMORY_STATS}
    return _collections.OrderedDict((k, got[k]) for k in sorted(got))


def memory_allocated(device: Device = None) -> int:
    """Bytes of live allocations (``allocated_bytes.all.current``)."""
    return stat("allocated_bytes.all.current", device)


def max_memory_allocated(device: Device = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last reset."""
    return stat("allocated_bytes.all.peak", device)


def memory_reserved(device: Device = None) -> int:
    """Bytes held from the device (``reserved_bytes.all.current``)."""
    return stat("reserved_bytes.all.current", device)


def max_memory_reserved(device: Device = None) -> int:
    """Peak of :func:`memory_reserved` since the start or the last reset."""
    return stat("reserved_bytes.all.peak", device)


def memory_summary(device: Device = None, abbreviated: bool = False) -> str:
    """``torch.cuda.memory_summary()``'s table for ``device``, plus stitch's fragmentation lines.

    With ``abbreviated``, as in PyTorch, the per-pool rows ("from large pool", "from small
    pool") are left out.
    """
    text = _memory_summary_full(device)
    if not abbreviated:
        return text
    return "\n".join(line for line in text.split("\n")
                     if "from large pool" not in line and "from small pool" not in line)


def _memory_summary_full(device: Device) -> str:
    return _read_text("stitch_memory_summary", _device_index(device))


def _read_text(name: str, *args: Any) -> str:
    """The text a snprintf-style C function (``fn(*args, buf, cap)`` returning the full length, 0
    on error) writes."""
    fn = _lib.require(name)
    size = fn(*args, None, 0)
    _lib.check(size == 0, name)
    for _ in range(4):  # the text can grow between the two calls: retry with the new length
        buf = _ctypes.create_string_buffer(size + 1)
        full = fn(*args, buf, size + 1)
        _lib.check(full == 0, name)
        if full <= size:
            break
        size = full
    return buf.value.decode("utf-8", "replace")


def config() -> str:
    """The settings in effect, as a ``key:value,...`` string :func:`configure` accepts: the
    allocator's, or those it will be built with (``STITCH_ALLOC_CONF`` plus earlier
    :func:`configure` calls). Creates nothing."""
    return _read_text("stitch_config")


def device_count() -> int:
    """The number of devices of the configured backend (for ``backend:cuda`` the driver is opened,
    but no context or allocator is created). Raises StitchError when the backend is unusable:
    no CUDA driver, or no device."""
    n = _lib.require("stitch_device_count")()
    _lib.check(n < 0, "device_count")
    return int(n)


def dump_snapshot(path: Union[str, "_os.PathLike[str]"]) -> None:
    """Writes a memory snapshot to ``path``: a pickle in PyTorch's format (open it at
    https://pytorch.org/memory_viz), or JSON when the path ends in ``.json``. Call
    :func:`record_history` first to include the allocation trace."""
    fn = _lib.require("stitch_dump_snapshot")
    rc = fn(_os.fsencode(_os.fspath(path)))
    _lib.check(rc != 0, "dump_snapshot")


def record_history(enabled: Union[bool, str, None] = True, max_entries: int = 0,
                   stacks: Optional[str] = None) -> None:
    """Starts (or stops, with False/None) recording allocation events on every device, keeping
    up to ``max_entries`` per device (0: the current limit, 100000 by default). Stopping
    discards the history. Like ``torch.cuda.memory._record_memory_history(enabled, stacks=,
    max_entries=)`` (``enabled`` may be PyTorch's "all"/"state" strings, meaning on).

    ``stacks`` sets what each entry keeps (None: as configured): ``"python"`` the Python frames
    of the allocating thread (file, function, line, as memory_viz shows them), ``"cpp"`` native
    frames, ``"all"`` both, ``"none"`` nothing.
    """
    if max_entries < 0:
        raise ValueError("stitch.record_history: max_entries must be >= 0")
    if stacks is not None:
        kinds = {"python": "python", "cpp": "cpp", "all": "all", "none": "False"}
        if stacks not in kinds:
            raise ValueError(f"stitch.record_history: stacks must be one of {sorted(kinds)}")
        configure("record_stacks:" + kinds[stacks])
    fn = _lib.require("stitch_record_history")
    rc = fn(1 if enabled else 0, max_entries)
    _lib.check(rc != 0, "record_history")


def empty_cache(device: Device = None) -> None:
    """Returns entirely free cached segments to the device (``device`` None: every device)."""
    rc = _lib.lib().stitch_empty_cache(_device_index(device, default_all=True))
    _lib.check(rc != 0, "empty_cache")


def set_memory_fraction(fraction: float, device: Device = None) -> None:
    """Caps what ``device`` may reserve at ``fraction`` of its capacity (1.0 removes the cap)."""
    rc = _lib.lib().stitch_set_memory_fraction(float(fraction), _device_index(device))
    _lib.check(rc != 0, "set_memory_fraction")


def get_memory_fraction(device: Device = None) -> float:
    """``device``'s reserved-memory cap as a fraction of its capacity (1.0: no cap), as
    ``torch.cuda.get_per_process_memory_fraction()``."""
    value = _lib.require("stitch_memory_fraction")(_device_index(device))
    _lib.check(value < 0, "memory_fraction")
    return float(value)


def reset_accumulated_memory_stats(device: Device = None) -> None:
    """Resets the running sums (``*.allocated``, ``*.freed``) and the event counters
    (``num_ooms``, ``num_alloc_retries``, ...) of ``device`` (-1: every device)."""
    rc = _lib.require("stitch_reset_accumulated_stats")(_device_index(device))
    _lib.check(rc != 0, "reset_accumulated_memory_stats")


def reset_peak_memory_stats(device: Device = None) -> None:
    """Sets every peak statistic of ``device`` (None: the current one; -1: every device) to its
    current value."""
    rc = _lib.lib().stitch_reset_peak_stats(_device_index(device))
    _lib.check(rc != 0, "reset_peak_memory_stats")


# ---- region tags, sleep and wake (docs/sleep.md) -------------------------------------------------

# stitch_region_begin's flags (include/stitch/stitch.h).
_REGION_BACKUP = 1
_REGION_SPILL = 2

# The regions this thread opened through region(), innermost last: (tag, flags). Only
# _suspended_regions() reads it (the library keeps the authoritative stack, per thread too).
_region_state = _threading.local()


def _open_regions() -> "list[tuple[str, int]]":
    stack = getattr(_region_state, "stack", None)
    if stack is None:
        stack = _region_state.stack = []
    return stack


def _tag_list(tags: Tags, what: str) -> Optional[bytes]:
    """None, or the comma-separated tags of a str (taken as is: ``"weights,kv"`` names two) or of
    an iterable of str, as the C API wants them."""
    if tags is None:
        return None
    if isinstance(tags, str):
        return tags.encode()
    if isinstance(tags, (bytes, bytearray)):
        raise TypeError(f"stitch.{what}: tags must be str or an iterable of str, not bytes")
    items = list(tags)
    for t in items:
        if not isinstance(t, str):
            raise TypeError(f"stitch.{what}: every tag must be a str, got {t!r}")
    return ",".join(items).encode()


class _Region(_contextlib.ContextDecorator):
    """What :func:`region` returns: opens the region at ``__enter__`` and closes it at
    ``__exit__``, on the calling thread. Reusable, and usable as a decorator."""

    def __init__(self, tag: str, backup: bool, spill: bool = False) -> None:
        if not isinstance(tag, str):
            raise TypeError(f"stitch.region: tag must be a str, got {tag!r}")
        self.tag = tag
        self.backup = bool(backup)
        self.spill = bool(spill)

    def __repr__(self) -> str:
        return f"stitch.region({self.tag!r}, backup={self.backup}, spill={self.spill})"

    def __enter__(self) -> "_Region":
        _region_begin(self.tag, (_REGION_BACKUP if self.backup else 0) | (_REGION_SPILL if self.spill else 0))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        stack = _open_regions()
        if stack:
            stack.pop()
        rc = _lib.require("stitch_region_end")()
        # A failure to close is raised, unless it would hide the exception leaving the block.
        if rc != 0 and exc is None:
            _lib.check(True, "region_end")
        return False


def _region_begin(tag: str, flags: int) -> None:
    rc = _lib.require("stitch_region_begin")(tag.encode(), flags)
    _lib.check(rc != 0, "region_begin")
    _open_regions().append((tag, flags))


def region(tag: str, backup: bool = False, spill: bool = False) -> _Region:
    """A context manager: allocations the calling thread makes inside ``with stitch.region(tag):``
    (on every device) carry ``tag``, so that :func:`sleep` can give their memory back.

    Regions belong to the thread that opens them (other threads' allocations stay untagged) and
    nest (the innermost tag wins); the ``with`` block must end on the thread it began on. With
    ``backup=True`` the region's blocks are copied to host memory at every sleep and back at the
    wake; otherwise their contents are lost by a sleep (a KV cache, scratch space). Freed blocks
    of a tag stay cached for that tag only. With ``spill=True`` the tag's memory may move to host
    pages under the same addresses (:func:`spill`, ``spill:tags``): once any region opened the tag
    with it, all of the tag may spill, whichever region allocated it. An empty tag, or one with a
    comma, raises StitchError. Usable as a decorator too.
    """
    return _Region(tag, backup, spill)


@_contextlib.contextmanager
def _suspended_regions() -> Iterator[None]:
    """Closes the regions this thread opened with :func:`region` for the length of the block
    (allocations inside are untagged) and reopens them, in order, after it. Regions opened from
    C or C++ (stitch_region_begin) are not seen here and stay open."""
    stack = _open_regions()
    saved = list(stack)
    end = _lib.require("stitch_region_end")
    for _ in saved:
        stack.pop()
        _lib.check(end() != 0, "region_end")
    try:
        yield
    finally:
        for tag, flags in saved:
            _region_begin(tag, flags)


def _devices_of(dev: int) -> "list[int]":
    """The device indices a call on ``dev`` (-1: every device) runs on."""
    return list(range(device_count())) if dev == -1 else [dev]


def backup_progress(device: Device = 0) -> "_progress.BackupProgress":
    """How far the sleep or wake running on ``device`` is (readable from another thread while
    :func:`sleep` or :func:`wake` runs): ``op`` ("sleep", "wake" or None), the bytes of backups
    copied out or back so far (``done``) and of how many (``total``)."""
    return _progress.read(_device_index(device))


def sleep(tags: Tags = None, backup: Tags = None, device: Device = -1,
          progress: "_progress.Progress" = None) -> "dict[str, Any]":
    """Puts region tags to sleep; returns :func:`residency` of ``device`` afterwards.

    ``tags``: a tag, comma-separated tags, or an iterable of tags; None: every tag. ``backup``
    (same forms; None: none more): tags whose live blocks are copied to host memory and restored
    by :func:`wake`, in addition to the regions opened with ``backup=True``; every other block
    keeps its address but loses its contents. ``device``: an index, "cuda:N", a torch.device, or
    -1 / None for every device.

    The device is synchronized first; then every page of the tags is unmapped and given back to
    the device. A tag asleep already is left alone. Allocating under a sleeping tag raises
    StitchError until it wakes. Raises StitchError, and changes nothing on the device that
    failed, for a tag never used (the message names it), during a CUDA graph capture, or when the
    host cannot hold the backups. With ``backup_dir`` configured (the disk tier), what pinned
    host memory (``backup_host_mb``) cannot take goes to files there; a file that cannot be
    written fails the sleep with nothing changed and nothing left in the directory.

    ``progress``: how a long sleep reports how far it is (the copies to host memory and files):
    None logs to the ``stitch`` logger at INFO once it has run 2 s, True prints lines on stderr,
    False says nothing, and a callable is called with (done_bytes, total_bytes) every half second
    and once at the end.
    """
    dev = _device_index(device, default_all=True)
    fn = _lib.require("stitch_sleep")
    names, backups = _tag_list(tags, "sleep"), _tag_list(backup, "sleep")
    rc = _progress.run(lambda: fn(dev, names, backups), _devices_of(dev), "sleep", progress)
    _lib.check(rc != 0, "sleep")
    return residency(dev)


def wake(tags: Tags = None, device: Device = -1, progress: "_progress.Progress" = None) -> None:
    """Wakes sleeping tags (``tags`` as for :func:`sleep`; None: every sleeping tag) on ``device``
    (-1 / None: every device): fresh memory at the same addresses, the backups copied back (from
    host memory, and from files for the disk tier). ``progress`` as for :func:`sleep`.

    Wake the tags one at a time, largest need first (weights, then the KV cache), to keep the
    peak low. When the device cannot give the memory, raises OutOfMemoryError with stitch's
    report, and the tags stay asleep on that device (free something and retry). A backup file
    that cannot be read raises StitchError naming it and the offset; the tags stay asleep with
    their backups, and the wake may be retried.
    """
    fn = _lib.require("stitch_wake")
    dev = _device_index(device, default_all=True)
    names = _tag_list(tags, "wake")
    rc = _progress.run(lambda: fn(dev, names), _devices_of(dev), "wake", progress)
    _lib.check(rc != 0, "wake")


def trim(keep_bytes: int, device: Device = -1) -> None:
    """Gives cached free memory of ``device`` (-1 / None: every device, each kept to
    ``keep_bytes``) back to the device until its reserved memory is at most ``keep_bytes``, or
    nothing more can go: :func:`empty_cache` that stops once enough has gone."""
    if isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int):
        raise TypeError("stitch.trim: keep_bytes must be an int")
    if keep_bytes < 0:
        raise ValueError("stitch.trim: keep_bytes must be >= 0")
    rc = _lib.require("stitch_trim")(_device_index(device, default_all=True), keep_bytes)
    _lib.check(rc != 0, "trim")


def spill(tags: Tags = None, bytes: int = 0, device: Device = -1) -> "dict[str, Any]":
    """Moves the live memory of spillable tags (``tags`` as for :func:`sleep`; None: every tag
    opened with ``spill=True``) on ``device`` (-1 / None: every device) to host pages mapped at the
    same addresses: at least ``bytes`` of it per device (0: all), coldest tag first. Tensors keep
    their pointers and kernels keep working, over the bus (docs/spill.md). Pinned and exported
    blocks stay. All or nothing per device: raises OutOfMemoryError when the host (or
    ``spill_limit_mb``) cannot take it, and StitchError for a tag never used or not spillable (the
    message names it), during a CUDA graph capture, or where the back end has no host pages.
    Returns :func:`residency` of ``device`` afterwards."""
    if isinstance(bytes, bool) or not isinstance(bytes, int) or bytes < 0:
        raise TypeError("stitch.spill: bytes must be an int >= 0")
    dev = _device_index(device, default_all=True)
    rc = _lib.require("stitch_spill")(dev, _tag_list(tags, "spill"), bytes)
    _lib.check(rc != 0, "spill")
    return residency(dev)


def unspill(tags: Tags = None, device: Device = -1) -> None:
    """Brings spilled memory back to device pages (``tags`` as for :func:`sleep`; None: all of
    it, untagged memory too) on ``device`` (-1 / None: every device), releasing cached free
    memory first when the device has no room. Raises OutOfMemoryError naming what stays on the
    host (still usable at its address; retry once memory is free). Spilled memory also comes back
    by itself at :func:`empty_cache`, and a free of spilled memory gives its host pages back."""
    rc = _lib.require("stitch_unspill")(_device_index(device, default_all=True), _tag_list(tags, "unspill"))
    _lib.check(rc != 0, "unspill")


def residency(device: Device = -1) -> "dict[str, Any]":
    """What is resident on ``device``, as a dict (the JSON of stitch_residency): reserved,
    allocated, sleeping and host-backup bytes, the device's free and total memory, the untagged
    memory, the private pools, and each tag (``state`` "awake", "spilled" or "asleep", ``spill``,
    live, cached, reserved, spilled and sleeping bytes, segments, host backup, ``backup_file_bytes``
    and ``backup``: where its backup lies, "host", "file", "both" or "none"); the device's
    ``backup_file_bytes`` and ``backup_staging_bytes`` (the disk tier). ``device`` -1 / None: every
    device, as ``{"devices": [...]}``."""
    return _json.loads(_read_text("stitch_residency", _device_index(device, default_all=True)))


def __dir__() -> "list[str]":
    """The public names only (not the modules and typing names this module uses)."""
    return sorted(__all__ + ["__version__", "torch", "kv"])


from . import kv  # noqa: E402  (stitch.kv.Pool: the elastic paged KV cache, docs/kv.md)

"""stitch: a drop-in CUDA caching allocator — Python bindings (ctypes over libstitch's C API).

Everything here talks to the one process-wide stitch allocator that libstitch creates at first
use from ``STITCH_ALLOC_CONF`` plus any :func:`configure` calls made before it. For PyTorch, see
:mod:`stitch.torch` (``stitch.torch.enable()`` or ``python -m stitch.torch script.py``).

The statistics mirror ``torch.cuda.memory_stats()`` (which raises under a pluggable allocator):
:func:`memory_stats`, :func:`memory_allocated`, :func:`memory_reserved`, :func:`memory_summary`,
:func:`dump_snapshot` (opens in https://pytorch.org/memory_viz), :func:`record_history`.
"""

from __future__ import annotations

import collections as _collections
import ctypes as _ctypes
import os as _os
import sys as _sys
from typing import Any, Optional, Union

from . import _lib
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
    "library_path",
]

Device = Union[int, str, Any, None]
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


def __dir__() -> "list[str]":
    """The public names only (not the modules and typing names this module uses)."""
    return sorted(__all__ + ["__version__", "torch"])

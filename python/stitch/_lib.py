"""Loads libstitch with ctypes and declares the C API (include/stitch/stitch.h).

The library is found, in this order:

1. ``STITCH_LIBRARY``: the path of libstitch.so, or of a directory holding it;
2. ``libstitch.so`` next to this package (what ``pip install`` puts there);
3. ``build/libstitch.so`` of the source checkout this package sits in (``python/stitch``);
4. ``ctypes.util.find_library("stitch")`` (the system library path, e.g. after ``cmake --install``).

Nothing is loaded at import time: the first call that needs the library loads it, so ``import
stitch`` always works and a missing library is reported with the places that were searched.

Every C function reports failure through ``stitch_last_error()``; :func:`check` turns that into a
:class:`StitchError` (an :class:`OutOfMemoryError` for stitch's out-of-memory report).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path
from typing import Optional

__all__ = [
    "StitchError",
    "OutOfMemoryError",
    "LibraryNotFoundError",
    "lib",
    "library_path",
    "has",
    "hook_address",
    "last_error",
    "clear_error",
    "check",
    "OOM_PREFIX",
]

#: Every out-of-memory report of stitch starts with this (as PyTorch's does).
OOM_PREFIX = "CUDA out of memory"

_LIB_NAME = "libstitch.so"


class StitchError(RuntimeError):
    """A call into libstitch failed; the message is ``stitch_last_error()``."""


class OutOfMemoryError(StitchError, MemoryError):
    """stitch could not serve an allocation; the message is stitch's out-of-memory report."""


class LibraryNotFoundError(OSError):
    """libstitch.so was not found (the message lists where it was looked for)."""


# Shown as stitch.StitchError etc. in tracebacks (they are re-exported by the package).
for _cls in (StitchError, OutOfMemoryError, LibraryNotFoundError):
    _cls.__module__ = "stitch"
del _cls


# name: (restype, argtypes). Required: the library is refused without them.
_REQUIRED = {
    "stitch_malloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "stitch_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "stitch_configure": (ctypes.c_int, [ctypes.c_char_p]),
    "stitch_record_stream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "stitch_empty_cache": (ctypes.c_int, [ctypes.c_int]),
    "stitch_set_memory_fraction": (ctypes.c_int, [ctypes.c_double, ctypes.c_int]),
    "stitch_stat": (ctypes.c_int64, [ctypes.c_int, ctypes.c_char_p]),
    "stitch_stats": (ctypes.c_int64, [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]),
    "stitch_stat_count": (ctypes.c_size_t, []),
    "stitch_stat_key": (ctypes.c_char_p, [ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]),
    "stitch_reset_peak_stats": (ctypes.c_int, [ctypes.c_int]),
    "stitch_last_error": (ctypes.c_char_p, []),
    "stitch_clear_error": (None, []),
}
# Newer entry points: a library built before them still loads, and the wrappers that need them
# raise NotImplementedError naming the missing function.
_OPTIONAL = {
    "stitch_record_history": (ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]),
    "stitch_dump_snapshot": (ctypes.c_int, [ctypes.c_char_p]),
    "stitch_memory_summary": (ctypes.c_size_t, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
    "stitch_config": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    "stitch_reset_accumulated_stats": (ctypes.c_int, [ctypes.c_int]),
    "stitch_memory_fraction": (ctypes.c_double, [ctypes.c_int]),
    "stitch_device_count": (ctypes.c_int, []),
    # Region tags, sleep and wake (docs/sleep.md).
    "stitch_trim": (ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]),
    "stitch_region_begin": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    "stitch_region_end": (ctypes.c_int, []),
    "stitch_sleep": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]),
    "stitch_wake": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
    "stitch_residency": (ctypes.c_size_t, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
    "stitch_backup_progress": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64),
                                              ctypes.POINTER(ctypes.c_uint64)]),
    # KV pools (docs/kv.md).
    "stitch_kv_create": (ctypes.c_void_p, [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t,
                                           ctypes.c_char_p, ctypes.c_uint]),
    "stitch_kv_buffer": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int]),
    "stitch_kv_alloc": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64)]),
    "stitch_kv_free": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]),
    "stitch_kv_set_limit": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]),
    "stitch_kv_available": (ctypes.c_size_t, [ctypes.c_void_p]),
    "stitch_kv_trim": (ctypes.c_int, [ctypes.c_void_p]),
    "stitch_kv_destroy": (ctypes.c_int, [ctypes.c_void_p]),
    # Spill to host pages (docs/spill.md).
    "stitch_spill": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
    "stitch_unspill": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
}
# PyTorch hooks (include/stitch/torch_hooks.h). They THROW C++ exceptions, so they are never
# called from Python (an exception through ctypes aborts the process): only their addresses are
# handed to PyTorch, which calls them from C++.
TORCH_HOOKS = (
    "stitch_torch_malloc",
    "stitch_torch_empty_cache",
    "stitch_torch_set_memory_fraction",
    "stitch_torch_record_stream",
    "stitch_torch_begin_allocate_to_pool",
    "stitch_torch_end_allocate_to_pool",
    "stitch_torch_release_pool",
)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def _candidates() -> list[tuple[str, Optional[Path]]]:
    """(where, path) pairs in search order; path None when that place gave nothing."""
    out: list[tuple[str, Optional[Path]]] = []
    env = os.environ.get("STITCH_LIBRARY")
    if env:
        p = Path(env).expanduser()
        out.append(("STITCH_LIBRARY", p / _LIB_NAME if p.is_dir() else p))
    here = Path(__file__).resolve().parent
    out.append(("the package directory", here / _LIB_NAME))
    out.append(("the source checkout", here.parent.parent / "build" / _LIB_NAME))
    found = ctypes.util.find_library("stitch")
    out.append(("ctypes.util.find_library('stitch')", Path(found) if found else None))
    return out


def _find() -> str:
    tried = []
    env_set = bool(os.environ.get("STITCH_LIBRARY"))
    for where, path in _candidates():
        if path is None:
            tried.append(f"{where}: nothing")
            continue
        # find_library returns a bare soname (e.g. "libstitch.so.0") that dlopen resolves itself.
        if where.startswith("ctypes") and os.sep not in str(path):
            return str(path)
        if path.is_file():
            return str(path.resolve())
        tried.append(f"{where}: {path} (missing)")
        if where == "STITCH_LIBRARY" and env_set:
            # An explicit choice that does not exist is an error, not a reason to pick another.
            break
    raise LibraryNotFoundError(
        "stitch: libstitch.so not found. Build it (cmake -S . -B build && cmake --build build "
        "--target stitch) and set STITCH_LIBRARY=/path/to/libstitch.so, or pip install the "
        "package. Looked in: " + "; ".join(tried)
    )


def _declare(cdll: ctypes.CDLL, name: str, spec) -> bool:
    try:
        fn = getattr(cdll, name)
    except AttributeError:
        return False
    fn.restype, fn.argtypes = spec[0], spec[1]
    return True


def lib() -> ctypes.CDLL:
    """The loaded library (loads it on first use)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = _find()
            try:
                cdll = ctypes.CDLL(path)
            except OSError as e:
                raise LibraryNotFoundError(f"stitch: cannot load {path}: {e}") from e
            missing = [n for n, spec in _REQUIRED.items() if not _declare(cdll, n, spec)]
            if missing:
                raise LibraryNotFoundError(
                    f"stitch: {path} is not libstitch (missing {', '.join(missing)})"
                )
            for n, spec in _OPTIONAL.items():
                _declare(cdll, n, spec)
            _path = path
            _lib = cdll
    return _lib


def library_path() -> str:
    """The path of the loaded library (loads it on first use); what CUDAPluggableAllocator needs."""
    lib()
    assert _path is not None
    return _path


def has(name: str) -> bool:
    """Whether the loaded library exports ``name``."""
    try:
        getattr(lib(), name)
    except AttributeError:
        return False
    return True


def require(name: str):
    """The function ``name``, or NotImplementedError if this libstitch predates it."""
    try:
        return getattr(lib(), name)
    except AttributeError:
        raise NotImplementedError(
            f"stitch: {library_path()} does not export {name}(): it was built from an older "
            "stitch; rebuild libstitch"
        ) from None


def hook_address(name: str) -> int:
    """The address of C function ``name`` as an int (for PyTorch's set_*_fn hooks)."""
    addr = ctypes.cast(require(name), ctypes.c_void_p).value
    if not addr:
        raise StitchError(f"stitch: {name} has no address")
    return int(addr)


def last_error() -> str:
    """This thread's most recent stitch failure ("" if none since :func:`clear_error`); kept
    until the next failure, like errno."""
    raw = lib().stitch_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def clear_error() -> None:
    """Clears this thread's last error (before a call whose result cannot signal failure)."""
    lib().stitch_clear_error()


def error_from(message: str, fallback: str = "stitch: unknown error") -> StitchError:
    """The exception for stitch error text: OutOfMemoryError for an OOM report."""
    message = message or fallback
    if message.startswith(OOM_PREFIX):
        return OutOfMemoryError(message)
    return StitchError(message)


def check(failed: bool, what: str) -> None:
    """Raises the last error if ``failed`` (``what`` names the call, for an empty message)."""
    if failed:
        raise error_from(last_error(), f"stitch: {what} failed")

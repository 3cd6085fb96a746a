"""stitch as PyTorch's CUDA allocator.

Two routes:

* :func:`enable` makes stitch serve **every** CUDA allocation of the process through
  ``torch.cuda.memory.CUDAPluggableAllocator`` + ``change_current_allocator``. It must run before
  CUDA is initialized (before the first CUDA tensor or ``torch.cuda`` call that initializes CUDA);
  ``python -m stitch.torch train.py ...`` does that for an unmodified script.
* :func:`mempool` returns a ``torch.cuda.MemPool`` whose segments come from stitch; allocations
  made inside ``with torch.cuda.use_mem_pool(pool):`` (on that thread) use it, everything else
  keeps PyTorch's allocator. Works after CUDA is initialized.

Under :func:`enable`, PyTorch's memory API answers from stitch: ``torch.cuda.memory_stats()``,
``memory_allocated()``, ``memory_summary()``, ``reset_peak_memory_stats()``,
``get_per_process_memory_fraction()``, ``torch.cuda.memory._record_memory_history()``,
``_snapshot()`` and ``_dump_snapshot()`` (stitch serves the ``torch._C`` entry points they call;
see _memory_api.py and docs/python.md).

Sleep and wake (docs/sleep.md): tensors created inside ``with stitch.torch.region("weights"):``
carry the tag; :func:`sleep` gives their GPU memory back (the tensors keep their addresses),
:func:`wake` brings it back. :mod:`stitch.torch.memory_saver` is a drop-in for torch_memory_saver.

This module imports torch only when a function is called.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
import threading
from typing import Any, Callable, Optional, TypeVar

from .. import _lib
from .._lib import StitchError
from . import _memory_api

__all__ = [
    "enable",
    "backend",
    "is_enabled",
    "allocator",
    "mempool",
    "raise_torch_oom",
    "is_stitch_oom",
    "region",
    "spill",
    "unspill",
    "sleep",
    "wake",
    "trim",
    "residency",
    "ALLOC_HOOK",
    "FREE_HOOK",
    "POOL_ALLOC_HOOK",
]

#: Alloc hook of the global route: throws stitch's OOM report (PyTorch ignores a NULL here).
ALLOC_HOOK = "stitch_torch_malloc"
#: Free hook of both routes (never throws).
FREE_HOOK = "stitch_free"
#: Alloc hook of the MemPool route: returns NULL on failure, which a MemPool turns into its own
#: out-of-memory path (free cached blocks, retry, then torch.OutOfMemoryError).
POOL_ALLOC_HOOK = "stitch_malloc"

_lock = threading.Lock()
_allocator: Any = None  # the CUDAPluggableAllocator installed by enable(), or NATIVE
_backend: Optional[str] = None  # "native" or "pluggable" once enable() installed one

#: What enable() returns (and allocator() is) under the native backend.
NATIVE = "stitch-native"

#: What the pluggable hooks cannot do that the native backend does (the fallback's warning).
PLUGGABLE_GAPS = (
    "torch.backends.cudnn.benchmark (cacheInfo), CUDA IPC (torch.multiprocessing), "
    "torch.compile(mode='reduce-overhead') checkpoints, MemPool use counts, "
    "ProcessGroupNCCL's registration hook, and torch.OutOfMemoryError raised from C++")

# Only the tests against the stand-in torch (tests/python/fake_torch.py) set this, to run enable()
# on the simulated device; with a real PyTorch, host pointers must never reach CUDA kernels.
_ALLOW_SIM_FOR_TESTS = False

F = TypeVar("F", bound=Callable[..., Any])


def _import_torch():
    try:
        import torch  # noqa: F401  (the real torch: absolute import)
    except ImportError as e:
        raise StitchError("stitch.torch: PyTorch is not installed") from e
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    if memory is None or not hasattr(memory, "CUDAPluggableAllocator"):
        raise StitchError(
            "stitch.torch: this PyTorch has no torch.cuda.memory.CUDAPluggableAllocator "
            "(PyTorch >= 2.0 built with CUDA is needed)"
        )
    return torch


def backend() -> Optional[str]:
    """Which backend enable() installed: "native" (libstitch_torch, a full CUDAAllocator),
    "pluggable" (CUDAPluggableAllocator over the C hooks), or None before enable()."""
    return _backend


def _install_native(torch) -> bool:
    """The native backend, as STITCH_TORCH_BACKEND says: "native" (it or an error), "pluggable"
    (not tried), else (auto) tried and, where it cannot be built or loaded, one warning naming
    what will not work and False."""
    import os
    import warnings

    from . import _native

    choice = os.environ.get("STITCH_TORCH_BACKEND", "auto").strip().lower()
    if choice == "pluggable":
        return False
    try:
        _native.install()
        return True
    except Exception as e:  # noqa: BLE001 - any failure to build or load means the fallback
        if choice == "native":
            raise StitchError(f"stitch.torch.enable(): STITCH_TORCH_BACKEND=native: {e}") from e
        warnings.warn(
            f"stitch.torch: the native backend is not available ({e}); using the pluggable "
            f"hooks, under which these do not work: {PLUGGABLE_GAPS}. Build it with "
            "`python -m stitch.torch build-native` (a C++ compiler and ninja are needed).",
            RuntimeWarning, stacklevel=3)
        return False


#: Keys of PyTorch's allocator settings that stitch leaves to PyTorch (pinned host memory, its
#: own allocator choice and locking): passed on to PyTorch, not to stitch.
_TORCH_ONLY_KEYS = ("backend", "release_lock_on_cudamalloc", "graph_capture_record_stream_reuse")
#: Keys both understand: stitch applies them, and PyTorch's own settings follow.
_SHARED_KEYS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
                "roundup_power2_divisions", "per_process_memory_fraction")


def _split_settings(env: str) -> "list[str]":
    """`key:value,...` items; commas inside [...] (roundup_power2_divisions) stay in their item."""
    items, depth, cur = [], 0, ""
    for ch in env:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def _route_allocator_settings(torch) -> None:
    """torch.cuda.memory._set_allocator_settings reaches stitch (PyTorch calls no allocator
    method for it; SGLang and verl toggle expandable_segments with it at run time): the keys
    stitch knows go to stitch.configure (one it cannot apply raises StitchError, naming it), the
    pinned-memory and PyTorch-only keys to PyTorch alone."""
    import stitch

    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    original = getattr(memory, "_set_allocator_settings", None)
    if original is None or getattr(original, "_stitch", False):
        return

    @functools.wraps(original)
    def settings(env: str) -> None:
        ours, theirs = [], []
        for item in _split_settings(env):
            key = item.split(":", 1)[0].strip()
            if key.startswith("pinned_") or key in _TORCH_ONLY_KEYS:
                theirs.append(item)
                continue
            ours.append(item)
            if key in _SHARED_KEYS:
                theirs.append(item)
        if ours:
            try:
                stitch.configure(",".join(ours))
            except StitchError as e:
                raise StitchError(
                    f"torch.cuda.memory._set_allocator_settings({env!r}): stitch cannot apply "
                    f"{','.join(ours)!r}: {e}") from e
        if theirs:
            original(",".join(theirs))

    settings._stitch = True  # type: ignore[attr-defined]
    memory._set_allocator_settings = settings


def is_enabled() -> bool:
    """Whether :func:`enable` installed stitch as this process's CUDA allocator."""
    return _allocator is not None


def allocator() -> Any:
    """The ``CUDAPluggableAllocator`` installed by :func:`enable` (``NATIVE`` under the native
    backend), or None."""
    return _allocator


def enable(conf: Optional[str] = None) -> Any:
    """Makes stitch the CUDA allocator of this process.

    The native backend (libstitch_torch, a full ``CUDAAllocator``: see :func:`backend`) is
    installed where it can be built for this torch (built once, cached); otherwise the pluggable
    hooks, with one warning naming what does not work under them. ``STITCH_TORCH_BACKEND=native``
    or ``=pluggable`` chooses. Returns the ``CUDAPluggableAllocator``, or ``NATIVE``.

    ``conf`` is applied with ``stitch.configure()`` on top of ``STITCH_ALLOC_CONF`` (both are
    validated here: a bad key raises StitchError now rather than at the first allocation).
    Calling it again is a no-op apart from applying ``conf`` (then only tunables may change).

    Raises StitchError, installing nothing in PyTorch:

    * if CUDA is already initialized in this process: PyTorch cannot swap an initialized allocator
      ("Can't swap an already initialized allocator"). Call it first thing, use
      ``python -m stitch.torch script.py``, or use :func:`mempool`;
    * if the configuration says ``backend:sim``: its pointers are host memory, which CUDA kernels
      cannot use;
    * if the CUDA driver cannot be opened or reports no device (stitch's message says which), at
      once rather than at PyTorch's first allocation.
    """
    global _allocator, _backend
    import stitch

    torch = _import_torch()
    with _lock:
        if _allocator is not None:
            if conf:
                stitch.configure(conf)
            return _allocator
        if torch.cuda.is_initialized():
            raise StitchError(
                "stitch.torch.enable(): CUDA is already initialized in this process, and PyTorch "
                "cannot swap an initialized allocator. Call enable() before anything touches "
                "CUDA (first CUDA tensor, torch.cuda.set_device, ...), run the script with "
                "`python -m stitch.torch script.py`, or use stitch.torch.mempool() instead."
            )
        path = _lib.library_path()
        # Validates STITCH_ALLOC_CONF (and conf) now; nothing is allocated yet.
        stitch.configure(conf or "")
        _check_backend(stitch, "enable")
        if _install_native(torch):
            # PyTorch's own memory API answers from the native backend: nothing is replaced.
            _allocator, _backend = NATIVE, "native"
            _route_allocator_settings(torch)
            return _allocator
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, ALLOC_HOOK, FREE_HOOK)
        raw = alloc.allocator()
        # Optional hooks: each PyTorch call maps to the stitch one. set_init_fn is not used:
        # stitch creates its allocator at the first call, and PyTorch calls init once while
        # creating the pluggable allocator, before any hook can be set.
        for setter, hook in (
            ("set_reset_fn", "stitch_torch_empty_cache"),
            ("set_memory_fraction_fn", "stitch_torch_set_memory_fraction"),
            ("set_record_stream_fn", "stitch_torch_record_stream"),
            # CUDA graphs, torch.compile(mode="reduce-overhead") and MemPools: private pools.
            ("set_begin_allocate_to_pool", "stitch_torch_begin_allocate_to_pool"),
            ("set_end_allocate_to_pool_fn", "stitch_torch_end_allocate_to_pool"),
            ("set_release_pool", "stitch_torch_release_pool"),
        ):
            fn = getattr(raw, setter, None)
            if fn is not None:  # older PyTorch lacks some setters
                fn(_lib.hook_address(hook))
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise StitchError(
                f"stitch.torch.enable(): PyTorch refused the allocator swap ({e}). Something "
                "initialized CUDA's allocator before enable(); call it earlier or use "
                "`python -m stitch.torch script.py`."
            ) from e
        _allocator, _backend = alloc, "pluggable"
        _route_allocator_settings(torch)
        # PyTorch's memory API (memory_stats, _snapshot, ...) answers from stitch from now on.
        _memory_api.install(torch)
        return alloc


def _check_backend(stitch: Any, caller: str) -> None:
    """Refuses a backend PyTorch cannot use: the simulated device, or CUDA without a device."""
    backend = re.search(r"(?:^|,)backend:(\w+)", stitch.config())
    if backend is not None and backend.group(1) == "sim":
        if _ALLOW_SIM_FOR_TESTS:
            return
        raise StitchError(
            f"stitch.torch.{caller}(): the configuration says backend:sim, whose memory is host "
            "memory: PyTorch would hand those pointers to CUDA kernels. Remove backend:sim from "
            "STITCH_ALLOC_CONF (backend:cuda is the default); the simulated device is for "
            "stitch's own API (stitch.malloc) and the tests."
        )
    try:
        stitch.device_count()  # opens the driver and counts the devices; creates no context
    except StitchError as e:
        raise StitchError(f"stitch.torch.{caller}(): no usable CUDA device: {e}") from e


def mempool(conf: Optional[str] = None, **kwargs: Any) -> Any:
    """A ``torch.cuda.MemPool`` whose memory comes from stitch.

    Use it as ``with torch.cuda.use_mem_pool(pool): ...``: allocations of that thread inside the
    block are served by PyTorch's caching allocator from segments that stitch provides (the pool
    asks stitch for 2 MiB / 20 MiB / larger segments and returns them when the pool is emptied or
    destroyed). Other keyword arguments go to MemPool (e.g. ``use_on_oom=True``) when this
    PyTorch accepts them. Works after CUDA is initialized; needs a PyTorch whose MemPool takes an
    allocator (2.6+). Not combinable with :func:`enable` (which already serves everything).
    """
    import stitch

    torch = _import_torch()
    if is_enabled():
        raise StitchError(
            "stitch.torch.mempool(): stitch already serves every allocation (enable() was called)"
        )
    pool_cls = getattr(torch.cuda, "MemPool", None)
    if pool_cls is None:
        raise StitchError("stitch.torch.mempool(): this PyTorch has no torch.cuda.MemPool")
    if conf:
        stitch.configure(conf)
    _check_backend(stitch, "mempool")
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        _lib.library_path(), POOL_ALLOC_HOOK, FREE_HOOK
    )
    try:
        params = inspect.signature(pool_cls).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtin without a signature
        params = {}
    unknown = [k for k in kwargs if params and k not in params]
    if unknown:
        raise StitchError(
            f"stitch.torch.mempool(): this PyTorch's MemPool does not take {', '.join(unknown)}"
        )
    try:
        return pool_cls(alloc.allocator(), **kwargs)
    except TypeError as e:
        raise StitchError(
            f"stitch.torch.mempool(): this PyTorch's MemPool does not take an allocator ({e}); "
            "PyTorch 2.6 or newer is needed"
        ) from e


def is_stitch_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is stitch's out-of-memory report arriving from the alloc hook.

    PyTorch turns the C++ exception thrown by stitch_torch_malloc into RuntimeError (from its own
    bindings) or MemoryError (from plain pybind11 bindings), with stitch's report as message.
    """
    if not isinstance(exc, (RuntimeError, MemoryError)):
        return False
    torch_oom = _torch_oom_class()
    if torch_oom is not None and isinstance(exc, torch_oom):
        return False
    return str(exc).lstrip().startswith(_lib.OOM_PREFIX)


def _torch_oom_class() -> Optional[type]:
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return getattr(torch, "OutOfMemoryError", None) or getattr(
        getattr(torch, "cuda", None), "OutOfMemoryError", None
    )


class _RaiseTorchOom(contextlib.ContextDecorator):
    def __enter__(self) -> "_RaiseTorchOom":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not is_stitch_oom(exc):
            return False
        torch_oom = _torch_oom_class()
        if torch_oom is None:
            return False
        raise torch_oom(str(exc)) from exc


def raise_torch_oom(fn: Optional[F] = None):
    """Re-raises stitch's out-of-memory errors as ``torch.OutOfMemoryError``.

    A context manager (``with stitch.torch.raise_torch_oom(): step()``) or a decorator. Code that
    catches ``torch.OutOfMemoryError`` (batch-size finders, OOM skippers) works when the
    allocation happens inside it; other exceptions pass through unchanged. The launcher wraps the
    whole script in it.
    """
    if fn is None:
        return _RaiseTorchOom()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        with _RaiseTorchOom():
            return fn(*args, **kwargs)

    return wrapper


# ---- sleep and wake for PyTorch (docs/sleep.md) ----------------------------------------------


def _synchronize(device: Any) -> None:
    """torch.cuda.synchronize() before memory goes back, but only when torch is imported already
    and CUDA initialized (never imports torch, never initializes CUDA). The library synchronizes
    the device itself; this also waits for PyTorch's non-blocking streams. ``device`` -1 or None
    (every device) synchronizes the current device only: touching another one would create a
    CUDA context there."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return
    if device is None or (isinstance(device, int) and device < 0):
        cuda.synchronize()
    else:
        cuda.synchronize(device)


def region(tag: str, backup: bool = False, spill: bool = False):
    """``stitch.region`` for tensors: tensors the calling thread creates inside
    ``with stitch.torch.region("weights"):`` carry the tag (under :func:`enable`, where stitch
    serves every CUDA allocation). ``backup=True``: their contents survive :func:`sleep`
    (copied to host memory and back). See :func:`stitch.region`.

    Memory that PyTorch routes to a private pool (CUDA graph capture, ``torch.cuda.MemPool``) is
    the pool's and is not tagged in this version.
    """
    import stitch

    return stitch.region(tag, backup, spill)


def sleep(tags: Any = None, backup: Any = None, device: Any = -1, progress: Any = None) -> "dict[str, Any]":
    """``stitch.sleep`` for PyTorch: ``torch.cuda.synchronize()`` first (only if torch is imported
    and CUDA initialized), then the tags (None: every tag; a str, comma-separated str or iterable)
    go to sleep; ``backup`` names more tags whose contents are kept. Returns the residency dict.

    A sleeping tensor keeps its address (``data_ptr()``) but must not be touched until
    :func:`wake`. Memory PyTorch has freed but stitch still caches for a tag goes back too. With
    ``backup_dir`` (``--backup-dir``), backups beyond pinned host memory go to files;
    ``progress`` reports a long sleep as :func:`stitch.sleep` says.
    """
    import stitch

    _synchronize(device)
    return stitch.sleep(tags, backup=backup, device=device, progress=progress)


def wake(tags: Any = None, device: Any = -1, progress: Any = None) -> None:
    """``stitch.wake`` for PyTorch: the tags (None: every sleeping tag) get fresh memory at the
    same addresses, backups restored (from host memory and files). Wake one tag at a time,
    weights first, to keep the peak low. Raises stitch.OutOfMemoryError (tags still asleep) when
    the device has no room. ``progress`` as for :func:`sleep`."""
    import stitch

    _synchronize(device)
    stitch.wake(tags, device=device, progress=progress)


def trim(keep_bytes: int, device: Any = -1) -> None:
    """``stitch.trim`` for PyTorch: ``torch.cuda.synchronize()`` first (as :func:`sleep`), then
    cached free memory goes back until each device reserves at most ``keep_bytes``."""
    import stitch

    _synchronize(device)
    stitch.trim(keep_bytes, device=device)


def spill(tags: Any = None, bytes: int = 0, device: Any = -1) -> "dict[str, Any]":
    """``stitch.spill`` for PyTorch: ``torch.cuda.synchronize()`` first (as :func:`sleep`), then
    the live memory of spillable tags moves to host pages at the same addresses (tensors keep
    their ``data_ptr()`` and stay usable, over the bus). Returns the residency dict."""
    import stitch

    _synchronize(device)
    return stitch.spill(tags, bytes=bytes, device=device)


def unspill(tags: Any = None, device: Any = -1) -> None:
    """``stitch.unspill`` for PyTorch: spilled memory back on the device (None: all of it).
    Raises stitch.OutOfMemoryError naming what stays on the host when the device has no room."""
    import stitch

    _synchronize(device)
    stitch.unspill(tags, device=device)


def residency(device: Any = -1) -> "dict[str, Any]":
    """``stitch.residency``: what is resident, per tag, as a dict."""
    import stitch

    return stitch.residency(device)

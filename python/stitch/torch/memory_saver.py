"""A drop-in for torch_memory_saver's Python API (SGLang, verl, slime), on stitch.

Change only the import::

    # from torch_memory_saver import torch_memory_saver
    from stitch.torch.memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = build_model()                   # tagged "weights", contents kept over a pause
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(...)                   # tagged "kv_cache", contents dropped by a pause
    torch_memory_saver.pause()                  # GPU memory of both tags goes back
    torch_memory_saver.resume("weights")        # one tag at a time: weights first ...
    torch_memory_saver.resume("kv_cache")       # ... then the KV cache

The process must run on stitch (``python -m stitch.torch script.py``, or
``stitch.torch.enable()`` before CUDA is initialized): that is what replaces torch_memory_saver's
``LD_PRELOAD`` hook. Regions are stitch regions (:func:`stitch.region`), ``pause`` is
:func:`stitch.torch.sleep`, ``resume`` is :func:`stitch.torch.wake`.

Covered: ``region(tag, enable_cpu_backup)``, ``pause(tag)``, ``resume(tag)``, ``disable()``,
``cuda_graph(...)`` (see its limitation), ``enabled``, ``hook_mode`` (accepted, selects nothing),
``configure_subprocess()`` (does nothing: the child must run stitch itself), the
``torch_memory_saver`` singleton (also ``memory_saver``) and the ``TorchMemorySaver`` class.
Not covered: the ``LD_PRELOAD`` mode itself, disk backup, ``memory_margin_bytes`` and
``get_cpu_backup()`` (both raise NotImplementedError), and the tagging of a CUDA graph's private
pool. See docs/sleep.md.

This module imports torch only when ``cuda_graph`` is used.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import stitch

from . import is_enabled as _stitch_enabled
from . import sleep as _sleep
from . import wake as _wake

__all__ = [
    "TorchMemorySaver",
    "torch_memory_saver",
    "memory_saver",
    "region",
    "pause",
    "resume",
    "cuda_graph",
    "disable",
    "configure_subprocess",
]

_TAG_DEFAULT = "default"

def _known_tags() -> "set[str]":
    """Every tag used so far, on any device."""
    found = set()
    for dev in stitch.residency(-1)["devices"]:
        found.update(t["tag"] for t in dev["tags"])
    return found


class TorchMemorySaver:
    """torch_memory_saver's ``TorchMemorySaver`` on stitch. Every instance drives the same
    process-wide allocator; use the module's ``torch_memory_saver`` singleton."""

    def __init__(self) -> None:
        self._hook_mode: Optional[str] = None

    def region(self, tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False):
        """Context manager: the calling thread's allocations inside it carry ``tag``; with
        ``enable_cpu_backup`` their contents survive :meth:`pause` (copied to host memory).
        Unlike torch_memory_saver, regions may nest (the innermost tag wins)."""
        return stitch.region(tag, backup=enable_cpu_backup)

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph: Any,
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
    ) -> Iterator[None]:
        """Used in place of ``torch.cuda.graph(cuda_graph, pool, stream, capture_error_mode)``:
        captures the graph inside a region with ``tag``. The graph's private pool begins inside
        the region, so it carries ``tag`` (and ``enable_cpu_backup``): every allocation into it
        is tagged, and ``pause(tag)`` releases the graph's memory too; the graph replays
        unchanged after ``resume(tag)``. (Under ``stitch.torch.enable()``, where stitch serves
        the graph's pool.)
        """
        import torch  # the real torch, only now

        with stitch.region(tag, backup=enable_cpu_backup):
            with torch.cuda.graph(
                cuda_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode
            ):
                yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations inside are untagged: the regions this thread opened through stitch's
        Python API (this module, ``stitch.region``, ``stitch.torch.region``) are closed for the
        block and reopened after it. Regions opened from C/C++ (``stitch_region_begin``) stay
        in effect."""
        with stitch._suspended_regions():
            yield

    def pause(self, tag: Optional[str] = None) -> None:
        """Releases the GPU memory of ``tag`` (None or "": every tag), keeping the addresses.
        Regions opened with ``enable_cpu_backup=True`` keep their contents; the rest is lost.

        As in torch_memory_saver, a tag without allocations is nothing to pause (no error). A
        tag paused already is left alone (torch_memory_saver exits the process)."""
        if tag:
            if tag not in _known_tags():
                return
            _sleep(tag)
        else:
            _sleep(None)

    def resume(self, tag: Optional[str] = None) -> None:
        """Brings back the memory of ``tag`` (None or "": every paused tag) at the same
        addresses, backups restored. Raises ``stitch.OutOfMemoryError`` (the tag stays paused)
        when the device has no room. A tag without allocations, or awake, is left alone."""
        if tag:
            if tag not in _known_tags():
                return
            _wake(tag)
        else:
            _wake(None)

    @property
    def enabled(self) -> bool:
        """Whether stitch serves this process's CUDA allocations (``stitch.torch.enable()`` or
        ``python -m stitch.torch``): only then do tensors created in a region carry its tag."""
        return _stitch_enabled()

    @property
    def hook_mode(self) -> Optional[str]:
        """What was set (``"preload"`` or ``"torch"``); it selects nothing: stitch is hooked in
        as PyTorch's allocator (``stitch.torch.enable()``), whichever is set."""
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, value: str) -> None:
        if value not in ("preload", "torch"):
            raise ValueError(f"hook_mode must be 'preload' or 'torch', got {value!r}")
        self._hook_mode = value

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("stitch.torch.memory_saver: memory_margin_bytes is not supported")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        raise NotImplementedError(
            "stitch.torch.memory_saver: memory_margin_bytes is not supported (stitch has no "
            "free-memory margin for tagged allocations; set_per_process_memory_fraction caps "
            "the whole process)"
        )

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> Any:
        raise NotImplementedError(
            "stitch.torch.memory_saver: get_cpu_backup() is not supported (stitch's host "
            "backups live only while a tag sleeps and are not exposed as tensors)"
        )


#: The singleton, under both names scripts use.
torch_memory_saver = TorchMemorySaver()
memory_saver = torch_memory_saver


def region(tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False):
    """``torch_memory_saver.region``."""
    return torch_memory_saver.region(tag, enable_cpu_backup)


def pause(tag: Optional[str] = None) -> None:
    """``torch_memory_saver.pause``."""
    torch_memory_saver.pause(tag)


def resume(tag: Optional[str] = None) -> None:
    """``torch_memory_saver.resume``."""
    torch_memory_saver.resume(tag)


def cuda_graph(cuda_graph: Any, pool: Any = None, stream: Any = None,
               capture_error_mode: str = "global", tag: str = _TAG_DEFAULT,
               enable_cpu_backup: bool = False):
    """``torch_memory_saver.cuda_graph`` (see :meth:`TorchMemorySaver.cuda_graph`)."""
    return torch_memory_saver.cuda_graph(cuda_graph, pool=pool, stream=stream,
                                         capture_error_mode=capture_error_mode, tag=tag,
                                         enable_cpu_backup=enable_cpu_backup)


def disable():
    """``torch_memory_saver.disable``."""
    return torch_memory_saver.disable()


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """torch_memory_saver's ``configure_subprocess()`` sets ``LD_PRELOAD`` for child processes;
    stitch needs no preload, so this changes nothing. A child process must run on stitch itself:
    start it with ``python -m stitch.torch`` or call ``stitch.torch.enable()`` first thing."""
    yield


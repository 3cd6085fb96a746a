"""PyTorch's memory API served by stitch while stitch is PyTorch's allocator.

Under a CUDAPluggableAllocator, PyTorch's ``torch._C`` entry points behind
``torch.cuda.memory_stats()``, ``reset_peak_memory_stats()``, ``memory._snapshot()``,
``memory._record_memory_history()`` and ``get_per_process_memory_fraction()`` raise ("... does not
yet support ..."). torch/cuda/memory.py looks them up at call time, so replacing them on
``torch._C`` serves every wrapper, including those imported by name elsewhere, with stitch's
numbers under PyTorch's keys, types and per-device rules.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any, Dict, Optional

import stitch


def _device(device: Any) -> int:
    return stitch._device_index(device)


def _nested(flat: "Dict[str, int]") -> Dict[str, Any]:
    """PyTorch's nested statistics dict (what _cuda_memoryStats returns) from flat keys."""
    out: Dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def memory_stats(device: Any = None) -> Dict[str, Any]:
    """torch._C._cuda_memoryStats: PyTorch's keys only, nested as PyTorch nests them."""
    stats = stitch.memory_stats(_device(device))
    return _nested({k: stats[k] for k in stitch.TORCH_MEMORY_STATS_KEYS})


def reset_peak_memory_stats(device: Any = None) -> None:
    stitch.reset_peak_memory_stats(_device(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    stitch.reset_accumulated_memory_stats(_device(device))


def get_memory_fraction(device: Any = None) -> float:
    return stitch.get_memory_fraction(_device(device))


def memory_snapshot(*_args: Any, **_kwargs: Any) -> Dict[str, Any]:
    """torch._C._cuda_memorySnapshot: the snapshot dict memory_viz reads (segments,
    device_traces, allocator_settings), for every device, as PyTorch's is."""
    fd, path = tempfile.mkstemp(suffix=".pickle", prefix="stitch-snapshot-")
    os.close(fd)
    try:
        stitch.dump_snapshot(path)
        with open(path, "rb") as f:
            return pickle.load(f)  # plain builtins only
    finally:
        os.unlink(path)


def _record(enabled: bool, stacks: Optional[str], max_entries: Any, clear: bool) -> None:
    if not enabled:
        stitch.record_history(False)
        return
    if clear:
        stitch.record_history(False)
    stitch.record_history(True, max_entries=int(max_entries or 0),
                          stacks=stacks if stacks in ("python", "cpp", "all") else "none")


def record_memory_history(enabled: Optional[str] = "all", context: Optional[str] = "all",
                          stacks: str = "all", max_entries: int = 0, clear_history: bool = False,
                          *_rest: Any, **_kwargs: Any) -> None:
    """torch._C._cuda_record_memory_history (enabled: None, "state" or "all")."""
    _record(enabled is not None, stacks, max_entries, bool(clear_history))


def record_memory_history_legacy(enabled: bool, record_context: bool = True,
                                 trace_alloc_max_entries: int = 1,
                                 trace_alloc_record_context: bool = False,
                                 record_context_cpp: bool = False, clear_history: bool = False,
                                 *_rest: Any, **_kwargs: Any) -> None:
    """torch._C._cuda_record_memory_history_legacy (the bool form of _record_memory_history)."""
    stacks = ("all" if record_context_cpp else "python") if record_context else None
    _record(bool(enabled), stacks, trace_alloc_max_entries, bool(clear_history))


#: torch._C entry point -> stitch's implementation.
ENTRY_POINTS = {
    "_cuda_memoryStats": memory_stats,
    "_cuda_resetPeakMemoryStats": reset_peak_memory_stats,
    "_cuda_resetAccumulatedMemoryStats": reset_accumulated_memory_stats,
    "_cuda_getMemoryFraction": get_memory_fraction,
    "_cuda_memorySnapshot": memory_snapshot,
    "_cuda_record_memory_history": record_memory_history,
    "_cuda_record_memory_history_legacy": record_memory_history_legacy,
}


def install(torch: Any) -> list:
    """Replaces the entry points this torch._C has; returns their names."""
    c = getattr(torch, "_C", None)
    if c is None:
        return []
    served = []
    for name, fn in ENTRY_POINTS.items():
        if hasattr(c, name):
            setattr(c, name, fn)
            served.append(name)
    return served

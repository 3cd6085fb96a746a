"""An elastic paged KV cache on stitch's pages (docs/kv.md).

``stitch.kv.Pool(device, buffers, block_bytes, max_blocks, tag="kv")`` reserves ``buffers`` virtual
ranges (K and V of every layer) of ``max_blocks * block_bytes`` and maps device pages only under the
blocks in use, from the same budget as the caching allocator's memory. Block ``i`` lives at byte
``i * block_bytes`` of every buffer. :meth:`Pool.buffer` gives a buffer as an array over the whole
range without a copy: a CUDA tensor under torch (``__cuda_array_interface__``), a NumPy array on
the simulated device (its device memory is host memory). Touch only allocated blocks: the pages of
the others are not mapped.
"""

from __future__ import annotations

import ctypes
from typing import Any, Iterable, List, Optional

from . import _lib

__all__ = ["Pool", "REGION_BACKUP", "REGION_SPILL"]

#: stitch_kv_create's flags (stitch.h).
REGION_BACKUP = 1
REGION_SPILL = 2


class Pool:
    """A KV pool on ``device``: ``alloc(n)`` returns ``n`` block ids (lowest free first),
    ``free(ids)`` gives them back (never waits, never unmaps), ``available()``, ``trim()``,
    ``set_limit(bytes)``, ``buffer(i)``, ``close()`` (also a context manager). ``backup=True``:
    live blocks survive a :func:`stitch.sleep` of the tag; ``spill=True``: the tag may spill."""

    def __init__(self, device: int, buffers: int, block_bytes: int, max_blocks: int, tag: str = "kv",
                 backup: bool = False, spill: bool = False) -> None:
        flags = (REGION_BACKUP if backup else 0) | (REGION_SPILL if spill else 0)
        fn = _lib.require("stitch_kv_create")
        handle = fn(int(device), int(buffers), int(block_bytes), int(max_blocks), tag.encode(), flags)
        _lib.check(not handle, "kv.Pool")
        self._handle: Optional[int] = handle
        self.device = int(device)
        self.buffers = int(buffers)
        self.block_bytes = int(block_bytes)
        self.max_blocks = int(max_blocks)
        self.tag = tag

    def _h(self) -> int:
        if self._handle is None:
            raise _lib.StitchError("stitch.kv.Pool: the pool is closed")
        return self._handle

    def __repr__(self) -> str:
        return (f"stitch.kv.Pool(device={self.device}, buffers={self.buffers}, block_bytes={self.block_bytes}, "
                f"max_blocks={self.max_blocks}, tag={self.tag!r})")

    def address(self, buffer: int) -> int:
        """The base address of buffer ``buffer``."""
        p = _lib.require("stitch_kv_buffer")(self._h(), int(buffer))
        _lib.check(not p, "kv.Pool.address")
        return int(p)

    def alloc(self, n: int) -> List[int]:
        """``n`` block ids, lowest free first; raises OutOfMemoryError (nothing allocated) for the
        limit or the device, StitchError while the tag is asleep."""
        ids = (ctypes.c_int64 * max(int(n), 1))()
        rc = _lib.require("stitch_kv_alloc")(self._h(), int(n), ids)
        _lib.check(rc != 0, "kv.Pool.alloc")
        return [int(ids[i]) for i in range(int(n))]

    def free(self, ids: Iterable[int]) -> None:
        """Frees the ids; a bad id (out of range, not allocated, listed twice) raises StitchError
        and frees nothing."""
        items = [int(i) for i in ids]
        arr = (ctypes.c_int64 * max(len(items), 1))(*items)
        rc = _lib.require("stitch_kv_free")(self._h(), arr, len(items))
        _lib.check(rc != 0, "kv.Pool.free")

    def available(self) -> int:
        """Blocks allocatable now, within the limit and the device's room."""
        return int(_lib.require("stitch_kv_available")(self._h()))

    def set_limit(self, nbytes: int) -> None:
        """Bytes of pages under live blocks the pool may hold (0: no limit)."""
        _lib.check(_lib.require("stitch_kv_set_limit")(self._h(), int(nbytes)) != 0, "kv.Pool.set_limit")

    def trim(self) -> None:
        """Unmaps every page without a live block (after one device synchronization)."""
        _lib.check(_lib.require("stitch_kv_trim")(self._h()) != 0, "kv.Pool.trim")

    def close(self) -> None:
        """Destroys the pool; raises StitchError (the pool stays) while blocks are live."""
        if self._handle is None:
            return
        _lib.check(_lib.require("stitch_kv_destroy")(self._handle) != 0, "kv.Pool.close")
        self._handle = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def buffer(self, buffer: int) -> Any:
        """Buffer ``buffer`` as an array over the whole range, without a copy: a uint8 CUDA tensor
        when torch is imported and the device is a CUDA one (``__cuda_array_interface__``), else a
        NumPy uint8 array (the simulated device's memory is host memory; a memoryview where NumPy
        is not installed)."""
        import sys

        addr = self.address(buffer)
        size = self.block_bytes * self.max_blocks
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "cuda", None) is not None and _on_cuda():
            holder = _CudaArray(addr, size)
            return torch.as_tensor(holder, device=f"cuda:{self.device}")
        raw = (ctypes.c_uint8 * size).from_address(addr)
        try:
            import numpy as np
        except ImportError:  # without NumPy: a writable memoryview of the same bytes
            return memoryview(raw).cast("B")
        return np.ctypeslib.as_array(raw)


def _on_cuda() -> bool:
    """Whether the process allocator runs on backend:cuda."""
    try:
        import stitch

        return "backend:sim" not in stitch.config()
    except Exception:  # noqa: BLE001 - no library: not CUDA
        return False


class _CudaArray:
    """An object with ``__cuda_array_interface__`` over ``size`` bytes at ``addr`` (torch reads it
    without a copy)."""

    def __init__(self, addr: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (addr, False),
            "version": 3,
            "strides": None,
        }

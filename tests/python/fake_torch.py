"""A stand-in for the few parts of PyTorch that stitch.torch touches (tests only; no real torch).

It behaves like torch/cuda/memory.py and torch/csrc/cuda/CUDAPluggableAllocator.cpp where it
matters: CUDAPluggableAllocator(path, alloc, free) loads the library with ctypes and resolves both
symbols to addresses; the set_*_fn setters take integer addresses; change_current_allocator
refuses once an allocator is initialized ("Can't swap an already initialized allocator"), and a
pluggable allocator counts as initialized from its creation (createCustomAllocator calls init).

Loaded in-process as module "torch" (tests put it in sys.modules) or written out as
torch/__init__.py for subprocess tests.
"""

import ctypes
import types

__version__ = "0.0+fake"

state = types.SimpleNamespace(
    cuda_initialized=False,  # what torch.cuda.is_initialized() returns
    allocator_initialized=False,  # the current allocator's initialized()
    current=None,
    swaps=0,
    pools=[],
)


class OutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError"""


OutOfMemoryError.__module__ = "torch"


class _PluggableAllocatorHandle:
    """torch._C._CUDAPluggableAllocator"""

    def __init__(self, path, alloc_fn, free_fn):
        self.path, self.alloc_fn, self.free_fn = path, alloc_fn, free_fn
        self.hooks = {}

    def _set(self, name, func_ptr):
        if not isinstance(func_ptr, int) or func_ptr <= 0:
            raise TypeError(f"{name}: expected a function address, got {func_ptr!r}")
        self.hooks[name] = func_ptr

    def set_init_fn(self, func_ptr):
        self._set("init", func_ptr)

    def set_reset_fn(self, func_ptr):
        self._set("reset", func_ptr)

    def set_memory_fraction_fn(self, func_ptr):
        self._set("memory_fraction", func_ptr)

    def set_record_stream_fn(self, func_ptr):
        self._set("record_stream", func_ptr)

    def set_begin_allocate_to_pool(self, func_ptr):
        self._set("begin_allocate_to_pool", func_ptr)

    def set_end_allocate_to_pool_fn(self, func_ptr):
        self._set("end_allocate_to_pool", func_ptr)

    def set_release_pool(self, func_ptr):
        self._set("release_pool", func_ptr)


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
        assert alloc_fn is not None
        assert free_fn is not None
        self.names = (alloc_fn_name, free_fn_name)
        self._allocator = _PluggableAllocatorHandle(path_to_so_file, alloc_fn, free_fn)

    def allocator(self):
        return self._allocator


def change_current_allocator(allocator):
    if state.allocator_initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    state.current = allocator
    state.swaps += 1
    state.allocator_initialized = True


class MemPool:
    def __init__(self, allocator=None, use_on_oom=False):
        self.allocator = allocator
        self.use_on_oom = use_on_oom
        state.pools.append(self)


def is_initialized():
    return state.cuda_initialized


def current_device():
    return 0


memory = types.SimpleNamespace(
    CUDAPluggableAllocator=CUDAPluggableAllocator,
    change_current_allocator=change_current_allocator,
)
cuda = types.SimpleNamespace(
    is_initialized=is_initialized,
    current_device=current_device,
    memory=memory,
    MemPool=MemPool,
    OutOfMemoryError=OutOfMemoryError,
)

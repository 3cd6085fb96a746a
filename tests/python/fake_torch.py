"""A stand-in for the few parts of PyTorch that stitch.torch touches (tests only; no real torch).

It behaves like torch/cuda/memory.py and torch/csrc/cuda/CUDAPluggableAllocator.cpp where it
matters: CUDAPluggableAllocator(path, alloc, free) loads the library with ctypes and resolves both
symbols to addresses; the set_*_fn setters take integer addresses; change_current_allocator
refuses once an allocator is initialized ("Can't swap an already initialized allocator"), and a
pluggable allocator counts as initialized from its creation (createCustomAllocator calls init).

Loaded in-process as module "torch" (tests put it in sys.modules) or written out as
torch/__init__.py for subprocess tests.
"""

import collections
import ctypes
import pickle
import types

__version__ = "0.0+fake"

state = types.SimpleNamespace(
    cuda_initialized=False,  # what torch.cuda.is_initialized() returns
    allocator_initialized=False,  # the current allocator's initialized()
    current=None,
    swaps=0,
    pools=[],
    synchronized=[],  # the device argument of each torch.cuda.synchronize() call
    captures=[],  # (graph, pool, stream, capture_error_mode) of each torch.cuda.graph block
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


def synchronize(device=None):
    if not state.cuda_initialized:
        raise RuntimeError("torch.cuda.synchronize() would initialize CUDA")
    state.synchronized.append(device)


class CUDAGraph:
    """torch.cuda.CUDAGraph (nothing is captured)."""


class graph:
    """torch.cuda.graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"): a
    context manager around the capture; the stand-in records its arguments."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.args = (cuda_graph, pool, stream, capture_error_mode)

    def __enter__(self):
        state.captures.append(self.args)

    def __exit__(self, *exc):
        return False


# torch._C's allocator entry points, as a CUDAPluggableAllocator leaves them: each raises.
def _unsupported(what):
    def entry(*args, **kwargs):
        raise RuntimeError(f"CUDAPluggableAllocator does not yet support {what}. If you need it, "
                           "please file an issue describing your use case.")
    return entry


_C = types.SimpleNamespace(
    _cuda_memoryStats=_unsupported("getDeviceStats"),
    _cuda_resetPeakMemoryStats=_unsupported("resetPeakStats"),
    _cuda_resetAccumulatedMemoryStats=_unsupported("resetAccumulatedStats"),
    _cuda_getMemoryFraction=_unsupported("getMemoryFraction"),
    _cuda_memorySnapshot=_unsupported("snapshot"),
    _cuda_record_memory_history=_unsupported("recordHistory"),
    _cuda_record_memory_history_legacy=_unsupported("recordHistory"),
)


# torch/cuda/memory.py's wrappers: each looks its torch._C entry point up at call time.
def _index(device):
    return current_device() if device is None else int(device)


def memory_stats_as_nested_dict(device=None):
    return _C._cuda_memoryStats(_index(device))


def memory_stats(device=None):
    result = []

    def _recurse_add_to_result(prefix, obj):
        if isinstance(obj, dict):
            if len(prefix) > 0:
                prefix += "."
            for k, v in obj.items():
                _recurse_add_to_result(prefix + k, v)
        else:
            result.append((prefix, obj))

    _recurse_add_to_result("", memory_stats_as_nested_dict(device=device))
    result.sort()
    return collections.OrderedDict(result)


def memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device=device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None):
    return memory_stats(device=device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    return _C._cuda_resetPeakMemoryStats(_index(device))


def reset_accumulated_memory_stats(device=None):
    return _C._cuda_resetAccumulatedMemoryStats(_index(device))


def get_per_process_memory_fraction(device=None):
    return _C._cuda_getMemoryFraction(_index(device))


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=9223372036854775807,
                           device=None, clear_history=False):
    if isinstance(enabled, bool):
        return _C._cuda_record_memory_history_legacy(enabled, True, max_entries, False,
                                                      stacks in ("all", "cpp"), clear_history)
    return _C._cuda_record_memory_history(enabled, context, stacks, max_entries, clear_history,
                                          False, False)


def _snapshot(device=None):
    return _C._cuda_memorySnapshot(None)


def _dump_snapshot(filename="dump_snapshot.pickle"):
    s = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(s, f)


memory = types.SimpleNamespace(
    CUDAPluggableAllocator=CUDAPluggableAllocator,
    change_current_allocator=change_current_allocator,
    memory_stats=memory_stats,
    memory_stats_as_nested_dict=memory_stats_as_nested_dict,
    memory_allocated=memory_allocated,
    max_memory_allocated=max_memory_allocated,
    memory_reserved=memory_reserved,
    max_memory_reserved=max_memory_reserved,
    reset_peak_memory_stats=reset_peak_memory_stats,
    reset_accumulated_memory_stats=reset_accumulated_memory_stats,
    get_per_process_memory_fraction=get_per_process_memory_fraction,
    _record_memory_history=_record_memory_history,
    _snapshot=_snapshot,
    _dump_snapshot=_dump_snapshot,
)
cuda = types.SimpleNamespace(
    is_initialized=is_initialized,
    current_device=current_device,
    synchronize=synchronize,
    CUDAGraph=CUDAGraph,
    graph=graph,
    memory=memory,
    memory_stats=memory_stats,
    memory_allocated=memory_allocated,
    max_memory_allocated=max_memory_allocated,
    memory_reserved=memory_reserved,
    max_memory_reserved=max_memory_reserved,
    reset_peak_memory_stats=reset_peak_memory_stats,
    get_per_process_memory_fraction=get_per_process_memory_fraction,
    MemPool=MemPool,
    OutOfMemoryError=OutOfMemoryError,
)

/* stitch/torch_hooks.h — hooks for PyTorch's torch.cuda.memory.CUDAPluggableAllocator that report
 * failures the only way PyTorch notices them: by throwing a C++ exception.
 *
 * PyTorch keeps whatever the alloc hook returns: a NULL from stitch_malloc() becomes a tensor whose
 * data pointer is NULL, and the first kernel that touches it faults. stitch_torch_malloc() throws
 * instead. PyTorch calls these hooks through std::function from C++ code, where the exception
 * unwinds to the Python binding and is raised as RuntimeError (or MemoryError from a plain pybind11
 * binding) with stitch's message; see docs/python.md.
 *
 * The hooks throw C++ exceptions: call them only from C++ that catches them (PyTorch does). Never
 * call them from C, through ctypes/cffi, or from any frame that cannot unwind. The free hook is
 * stitch_free() itself, which never throws (PyTorch frees from destructors).
 *
 * stitch.torch.enable() wires them up:
 *   alloc = CUDAPluggableAllocator(libstitch, "stitch_torch_malloc", "stitch_free")
 *   alloc.allocator().set_reset_fn(&stitch_torch_empty_cache)
 *   alloc.allocator().set_memory_fraction_fn(&stitch_torch_set_memory_fraction)
 *   alloc.allocator().set_record_stream_fn(&stitch_torch_record_stream)
 *   alloc.allocator().set_begin_allocate_to_pool(&stitch_torch_begin_allocate_to_pool)
 *   alloc.allocator().set_end_allocate_to_pool_fn(&stitch_torch_end_allocate_to_pool)
 *   alloc.allocator().set_release_pool(&stitch_torch_release_pool)
 * The last three are C++ functions with C names: PyTorch calls them with its own C++ types
 * (c10::cuda::MempoolId_t, which is std::pair<unsigned long long, unsigned long long>, and the
 * stream filter as std::function<bool(cudaStream_t)>), so they are declared only for C++. */
#ifndef STITCH_TORCH_HOOKS_H
#define STITCH_TORCH_HOOKS_H

#include <stddef.h>

#include "stitch/stitch.h"

#ifdef __cplusplus
extern "C" {
#endif

/** As stitch_malloc(), but a failure for a non-zero size throws: stitch::out_of_memory (a
 *  std::bad_alloc whose what() is stitch's out-of-memory report, starting "CUDA out of memory.")
 *  when the device or the memory limit has no room, stitch::error (a std::runtime_error) for any
 *  other failure (bad device, backend error). Size 0 returns NULL. PyTorch's alloc hook. */
STITCH_API void* stitch_torch_malloc(size_t size, int device, void* stream);
/** stitch_empty_cache(-1) for torch.cuda.empty_cache(). Never throws: a failure is reported on
 *  stderr (PyTorch may call it where an exception would terminate the process). */
STITCH_API void stitch_torch_empty_cache(void);
/** stitch_set_memory_fraction() for torch.cuda.set_per_process_memory_fraction(); throws
 *  stitch::error with stitch's message on failure. */
STITCH_API void stitch_torch_set_memory_fraction(double fraction, int device);
/** stitch_record_stream() for Tensor.record_stream(); NULL (an empty tensor) is ignored. Throws
 *  stitch::error with stitch's message on failure (e.g. a pointer stitch did not allocate). */
STITCH_API void stitch_torch_record_stream(void* ptr, void* stream);

#ifdef __cplusplus
}  // extern "C"

#include <functional>
#include <utility>

struct CUstream_st;  // cudaStream_t is CUstream_st*

extern "C" {

/** CUDA graph and MemPool pools (Allocator::begin_allocate_to_pool): from now on, `device`'s
 *  allocations on the streams `filter` accepts come from private pool `mempool_id`, and nothing
 *  on the device queries an event, synchronizes or returns memory. PyTorch calls it when a graph
 *  capture begins and in torch.cuda.use_mem_pool(). Throws stitch::error on failure. */
STITCH_API void stitch_torch_begin_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> mempool_id,
    std::function<bool(CUstream_st*)> filter);
/** Ends the allocation to `mempool_id` (PyTorch: before the capture ends). Throws stitch::error
 *  when none is underway. */
STITCH_API void stitch_torch_end_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> mempool_id);
/** Drops one use of `mempool_id` (PyTorch: the graph or MemPool is destroyed); its memory goes
 *  back to the device once its blocks are free. Throws stitch::error for an unknown pool. */
STITCH_API void stitch_torch_release_pool(
    int device, std::pair<unsigned long long, unsigned long long> mempool_id);

}  // extern "C"
#endif

#endif /* STITCH_TORCH_HOOKS_H */

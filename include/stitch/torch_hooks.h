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
 *   alloc.allocator().set_record_stream_fn(&stitch_torch_record_stream) */
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
}
#endif

#endif /* STITCH_TORCH_HOOKS_H */

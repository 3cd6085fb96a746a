// torch/ipc_handles.hpp — PyTorch's binary CUDA IPC handles (shareIpcHandle / getIpcDevPtr),
// written from and read into stitch's handle text (stitch/ipc_handle.hpp), so that a process on
// stitch and a process on PyTorch's own allocator exchange tensors both ways.
#pragma once

#include <cstddef>
#include <string>

namespace stitch::torch_native::detail {

/// PyTorch's handle for the block `text` (Allocator::export_block) names: a version byte, a type
/// byte and the type's bytes. 'c' (SHAREABLE_CUDA_MALLOC: a cuIpcGetMemHandle) for a cudaMalloc'd
/// segment; 'e' (SHAREABLE_CUDA_EXPANDABLE_SEGMENT: PyTorch's header, then a file descriptor or
/// a fabric handle per page) for pages that all map the same size; stitch's own 's' (the text)
/// otherwise, and on backend:sim.
std::string torch_handle(const std::string& text);

/// What getIpcDevPtr maps for a handle of any of those types: the text for
/// Allocator::import_block on `device`, and how far the block lies from the start of what
/// PyTorch's receiver expects back (0 for 'c' and 'e', the base of the shared memory; the
/// block's offset for 's'). Throws c10::Error for a handle of another kind.
struct Import {
  std::string text;
  std::size_t block_offset = 0;
};
Import stitch_import(const std::string& handle, int device);

}  // namespace stitch::torch_native::detail

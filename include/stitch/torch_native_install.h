/* stitch/torch_native_install.h — installs libstitch_torch's allocator (torch_native.hpp) as
 * PyTorch's CUDA allocator from C: what stitch.torch.enable() calls through ctypes. Call it before
 * anything initializes CUDA's allocator in PyTorch. */
#ifndef STITCH_TORCH_NATIVE_INSTALL_H
#define STITCH_TORCH_NATIVE_INSTALL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Makes stitch::torch_native::make_allocator()'s allocator (over the process's stitch allocator,
   c10::cuda's current device and stream) c10::cuda::CUDACachingAllocator's, and c10's allocator of
   the CUDA device type. 0 on success (a second call does nothing); -1 when PyTorch's allocator is
   initialized already, or on error: stitch_torch_native_error() says why. */
__attribute__((visibility("default"))) int stitch_torch_native_install(void);
__attribute__((visibility("default"))) const char* stitch_torch_native_error(void);

#ifdef __cplusplus
}
#endif

#endif

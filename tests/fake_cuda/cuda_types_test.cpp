// tests/fake_cuda/cuda_types_test.cpp — the driver types libstitch declares for builds without
// the CUDA toolkit (src/backends/cuda/cuda_types_fallback.hpp) have cuda.h's ABI: the same
// sizes, member offsets and constant values. Checked at compile time (ctest cuda_types_match_cuda_h
// only runs the program). Built where the toolkit is.
#include <cuda.h>

#include <cstddef>
#include <cstdio>
#include <type_traits>

#define STITCH_CUDA_TYPES_NAMESPACE fb
#include "backends/cuda/cuda_types_fallback.hpp"
#undef STITCH_CUDA_TYPES_NAMESPACE

#define SAME_VALUE(name) static_assert(static_cast<long long>(fb::name) == static_cast<long long>(::name), #name)
SAME_VALUE(CUDA_SUCCESS);
SAME_VALUE(CUDA_ERROR_INVALID_VALUE);
SAME_VALUE(CUDA_ERROR_OUT_OF_MEMORY);
SAME_VALUE(CUDA_ERROR_NOT_INITIALIZED);
SAME_VALUE(CUDA_ERROR_DEINITIALIZED);
SAME_VALUE(CUDA_ERROR_NO_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_CONTEXT);
SAME_VALUE(CUDA_ERROR_NOT_FOUND);
SAME_VALUE(CUDA_ERROR_NOT_READY);
SAME_VALUE(CUDA_ERROR_NOT_SUPPORTED);
SAME_VALUE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
SAME_VALUE(CUDA_ERROR_CAPTURED_EVENT);
SAME_VALUE(CUDA_ERROR_UNKNOWN);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
SAME_VALUE(CU_EVENT_DISABLE_TIMING);
SAME_VALUE(CU_STREAM_CAPTURE_STATUS_NONE);
SAME_VALUE(CU_STREAM_CAPTURE_STATUS_ACTIVE);
SAME_VALUE(CU_STREAM_CAPTURE_STATUS_INVALIDATED);
SAME_VALUE(CU_STREAM_CAPTURE_MODE_GLOBAL);
SAME_VALUE(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
SAME_VALUE(CU_STREAM_CAPTURE_MODE_RELAXED);
SAME_VALUE(CU_GET_PROC_ADDRESS_DEFAULT);
SAME_VALUE(CU_GET_PROC_ADDRESS_LEGACY_STREAM);
SAME_VALUE(CU_GET_PROC_ADDRESS_SUCCESS);
SAME_VALUE(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
SAME_VALUE(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
SAME_VALUE(CU_MEM_HANDLE_TYPE_NONE);
SAME_VALUE(CU_MEM_ACCESS_FLAGS_PROT_NONE);
SAME_VALUE(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME_VALUE(CU_MEM_LOCATION_TYPE_DEVICE);
SAME_VALUE(CU_MEM_ALLOCATION_TYPE_PINNED);
SAME_VALUE(CU_MEM_ALLOC_GRANULARITY_MINIMUM);

#define SAME_SIZE(type) static_assert(sizeof(fb::type) == sizeof(::type) && alignof(fb::type) == alignof(::type), #type)
SAME_SIZE(CUresult);
SAME_SIZE(CUdevice);
SAME_SIZE(CUdeviceptr);
SAME_SIZE(CUmemGenericAllocationHandle);
SAME_SIZE(CUdevice_attribute);
SAME_SIZE(CUmemLocation);
SAME_SIZE(CUmemAllocationProp);
SAME_SIZE(CUmemAccessDesc);
SAME_SIZE(CUstreamCaptureStatus);
SAME_SIZE(CUstreamCaptureMode);
SAME_SIZE(CUdriverProcAddressQueryResult);

#define SAME_OFFSET(type, member) static_assert(offsetof(fb::type, member) == offsetof(::type, member), #type "." #member)
SAME_OFFSET(CUmemLocation, type);
SAME_OFFSET(CUmemLocation, id);
SAME_OFFSET(CUmemAllocationProp, type);
SAME_OFFSET(CUmemAllocationProp, requestedHandleTypes);
SAME_OFFSET(CUmemAllocationProp, location);
SAME_OFFSET(CUmemAllocationProp, win32HandleMetaData);
SAME_OFFSET(CUmemAllocationProp, allocFlags);
SAME_OFFSET(CUmemAccessDesc, location);
SAME_OFFSET(CUmemAccessDesc, flags);

int main() {
  std::printf("the fallback driver types match cuda.h (CUDA_VERSION %d)\n", CUDA_VERSION);
  return 0;
}

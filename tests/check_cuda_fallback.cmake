# tests/check_cuda_fallback.cmake — the CUDA back end compiles without the CUDA toolkit: its
# sources, with STITCH_CUDA_TYPES_FALLBACK (the declarations of cuda_types_fallback.hpp instead
# of cuda.h), pass the compiler's syntax check. Run as:
#   cmake -DCXX=<compiler> -DSRC=<repository> -P check_cuda_fallback.cmake
file(GLOB sources ${SRC}/src/backends/cuda/*.cpp ${SRC}/src/backends/backend_factory.cpp)
foreach(source ${sources})
  execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -Wall -Wextra -Werror
                          -DSTITCH_CUDA_TYPES_FALLBACK -I${SRC}/include -I${SRC}/src ${source}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${source} does not compile without cuda.h:\n${err}")
  endif()
endforeach()
message(STATUS "the CUDA back end compiles without the CUDA toolkit")

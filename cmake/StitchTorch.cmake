# cmake/StitchTorch.cmake — libstitch_torch (src/torch/): stitch as PyTorch's CUDAAllocator, built
# against the torch the Python interpreter imports (-DPython3_EXECUTABLE=...), as every C++
# extension is: torch's headers and ABI flag, its c10 and c10_cuda, and the CUDA runtime headers
# and library its wheel ships (else the toolkit's). A RUNPATH points at torch's library folder.
# STITCH_WITH_TORCH: ON (fail without torch), OFF, AUTO (build where the interpreter has torch).
set(STITCH_WITH_TORCH "AUTO" CACHE STRING "Build libstitch_torch against the Python interpreter's torch: AUTO, ON or OFF")
set_property(CACHE STITCH_WITH_TORCH PROPERTY STRINGS AUTO ON OFF)
set(STITCH_HAVE_TORCH OFF)
if(NOT STITCH_WITH_TORCH STREQUAL "OFF")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  set(torch_probe "")
  if(Python3_Interpreter_FOUND)
    execute_process(COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/torch_probe.py
      OUTPUT_VARIABLE torch_probe ERROR_VARIABLE torch_probe_error RESULT_VARIABLE torch_probe_rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  if(Python3_Interpreter_FOUND AND torch_probe_rc EQUAL 0)
    # One `key=value` per line: version, cuda, abi, include (;-list), lib, cuda_include, cudart.
    string(REPLACE "\n" ";" torch_lines "${torch_probe}")
    foreach(line ${torch_lines})
      if(line MATCHES "^([a-z_]+)=(.*)$")
        set(TORCH_PROBE_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
      endif()
    endforeach()
    string(REPLACE "," ";" TORCH_PROBE_include "${TORCH_PROBE_include}")
    if(NOT TORCH_PROBE_cuda_include AND STITCH_HAVE_CUDA)
      set(TORCH_PROBE_cuda_include ${CUDAToolkit_INCLUDE_DIRS})
    endif()
    if(NOT TORCH_PROBE_cudart AND STITCH_HAVE_CUDA)
      set(TORCH_PROBE_cudart CUDA::cudart)
    endif()
    if(TORCH_PROBE_cuda STREQUAL "" OR NOT TORCH_PROBE_cuda_include OR NOT TORCH_PROBE_cudart)
      set(torch_probe_error "torch ${TORCH_PROBE_version} has no CUDA build, or no CUDA runtime was found (the CPU wheels lack c10_cuda)")
    else()
      set(STITCH_HAVE_TORCH ON)
    endif()
  endif()
  if(NOT STITCH_HAVE_TORCH AND STITCH_WITH_TORCH STREQUAL "ON")
    message(FATAL_ERROR "STITCH_WITH_TORCH=ON but ${Python3_EXECUTABLE} has no usable torch: ${torch_probe_error}")
  endif()
endif()
message(STATUS "stitch: libstitch_torch ${STITCH_HAVE_TORCH} ${TORCH_PROBE_version}")

if(STITCH_HAVE_TORCH)
  file(GLOB stitch_torch_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/torch/*.cpp)
  add_library(stitch_torch SHARED ${stitch_torch_sources})
  add_library(stitch::stitch_torch ALIAS stitch_torch)
  target_include_directories(stitch_torch PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_include_directories(stitch_torch SYSTEM PUBLIC ${TORCH_PROBE_include} ${TORCH_PROBE_cuda_include})
  stitch_layer_includes(stitch_torch torch)
  target_compile_definitions(stitch_torch PUBLIC _GLIBCXX_USE_CXX11_ABI=${TORCH_PROBE_abi})
  target_compile_options(stitch_torch PRIVATE -Wall -Wextra)
  target_link_directories(stitch_torch PUBLIC ${TORCH_PROBE_lib})
  target_link_libraries(stitch_torch PUBLIC stitch c10 c10_cuda ${TORCH_PROBE_cudart})
  get_filename_component(torch_cudart_dir "${TORCH_PROBE_cudart}" DIRECTORY)
  set_target_properties(stitch_torch PROPERTIES
    OUTPUT_NAME stitch_torch VERSION ${PROJECT_VERSION} SOVERSION 0
    BUILD_RPATH "${TORCH_PROBE_lib};${torch_cudart_dir};${CMAKE_CURRENT_BINARY_DIR}"
    INSTALL_RPATH "${TORCH_PROBE_lib};${torch_cudart_dir};$ORIGIN")
  install(TARGETS stitch_torch EXPORT stitchTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

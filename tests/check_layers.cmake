# tests/check_layers.cmake — the layers of libstitch (docs/architecture.md) are enforced by the
# build: each layer compiles with only itself and the layers it may use on its include path. This
# checks that the mechanism holds: from each layer's include root, a header of every layer it may
# not use is not found, and one of its own is.
# Run as: cmake -DCXX=<c++> -DSRC=<source dir> -DLAYERS=<build>/layers -P check_layers.cmake
set(all config diagnostics core replay backends api capi tools)
# One header per layer (any would do: the directory is either on the path or not).
set(header_config config/keys.hpp)
set(header_diagnostics diagnostics/recorder.hpp)
set(header_core core/block_store.hpp)
set(header_replay replay/engine.hpp)
set(header_backends backends/cuda/driver.hpp)
set(header_api api)
set(header_capi capi/c_api_testing.hpp)
set(header_tools tools/stitch_replay/trace_file.hpp)
# What each layer may use (the CMakeLists.txt's stitch_sees_* and the tools').
set(sees_config config)
set(sees_diagnostics diagnostics)
set(sees_core core diagnostics)
set(sees_replay replay core diagnostics)
set(sees_backends backends)
set(sees_api api replay core diagnostics config)
set(sees_capi capi)
set(sees_tools tools replay core diagnostics config)
set(probe ${LAYERS}/probe.cpp)
foreach(layer ${all})
  set(target stitch_${layer})
  if(NOT IS_DIRECTORY ${LAYERS}/${target})
    message(FATAL_ERROR "no include root for layer ${layer} in ${LAYERS}")
  endif()
  foreach(other ${all})
    if(other STREQUAL "api")
      continue()  # src/api has no header of its own
    endif()
    file(WRITE ${probe} "#include \"${header_${other}}\"\n")
    execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${LAYERS}/${target} -I${SRC}/include ${probe}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    list(FIND sees_${layer} ${other} allowed)
    if(allowed EQUAL -1)
      if(rc EQUAL 0 OR NOT err MATCHES "No such file|file not found")
        message(FATAL_ERROR "layer ${layer} can include ${header_${other}} (layer ${other}): ${err}")
      endif()
    elseif(NOT rc EQUAL 0 AND err MATCHES "No such file|file not found")
      message(FATAL_ERROR "layer ${layer} cannot include ${header_${other}} (layer ${other}): ${err}")
    endif()
  endforeach()
endforeach()
file(REMOVE ${probe})
message(STATUS "every layer sees exactly the layers it may use")

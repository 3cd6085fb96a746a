# tests/check_linkage.cmake — fails if libstitch.so depends on any CUDA library or carries a
# RUNPATH/RPATH (backend:cuda opens the driver at run time; the library must load in any
# process, whatever CUDA runtime it uses, or none). Run as:
#   cmake -DLIB=<path to libstitch.so> -P check_linkage.cmake
find_program(READELF readelf REQUIRED)
execute_process(COMMAND ${READELF} -d ${LIB} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf failed on ${LIB}")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dynamic}")
foreach(entry ${needed})
  if(entry MATCHES "cuda|cublas|nvrtc|nvidia")
    message(FATAL_ERROR "${LIB} depends on a CUDA library: ${entry}")
  endif()
endforeach()
if(dynamic MATCHES "\\((RUNPATH|RPATH)\\)[^\n]*")
  message(FATAL_ERROR "${LIB} has a search path: ${CMAKE_MATCH_0}")
endif()
message(STATUS "libstitch links no CUDA library and has no RUNPATH: ${needed}")

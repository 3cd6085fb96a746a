# traces/check_reproducible.cmake — runs every `stitch-tracegen ... -o traces/NAME.pickle` line of
# traces/README.md with the output redirected to OUT and checks that each result is byte-identical
# to the shipped file: the shipped traces are what the documented commands produce.
#   cmake -DTRACEGEN=path/to/stitch-tracegen -DTRACES=path/to/traces -DOUT=scratch/dir -P check_reproducible.cmake
foreach(var TRACEGEN TRACES OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_reproducible.cmake: -D${var}=... is required")
  endif()
endforeach()
file(STRINGS "${TRACES}/README.md" lines REGEX "^stitch-tracegen ")
if(NOT lines)
  message(FATAL_ERROR "no stitch-tracegen command in ${TRACES}/README.md")
endif()
file(MAKE_DIRECTORY "${OUT}")
set(checked 0)
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^stitch-tracegen (.*) -o traces/([A-Za-z0-9_.-]+\\.pickle)$")
    message(FATAL_ERROR "cannot parse README line: ${line}")
  endif()
  set(name "${CMAKE_MATCH_2}")
  separate_arguments(args UNIX_COMMAND "${CMAKE_MATCH_1}")
  execute_process(COMMAND "${TRACEGEN}" ${args} -o "${OUT}/${name}"
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "stitch-tracegen ${CMAKE_MATCH_1} failed (${rc}): ${err}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${OUT}/${name}" "${TRACES}/${name}" RESULT_VARIABLE diff)
  if(NOT diff EQUAL 0)
    message(FATAL_ERROR "traces/${name} differs from what `stitch-tracegen ${CMAKE_MATCH_1}` writes now: "
                        "regenerate traces/ with the commands of traces/README.md")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
message(STATUS "${checked} shipped traces reproduced byte for byte")

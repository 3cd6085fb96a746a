# tests/check_no_friends.cmake — no friend declaration in src/ or include/ (docs/architecture.md:
# a collaborator owns its state and gets a narrow interface, never another type's private part).
# Run as: cmake -DSRC=<source dir> -P check_no_friends.cmake
file(GLOB_RECURSE files ${SRC}/src/*.hpp ${SRC}/src/*.cpp ${SRC}/src/*.h ${SRC}/include/*.hpp ${SRC}/include/*.h)
set(found "")
foreach(f ${files})
  # At a line's start or after a template header or a brace ("template <...> friend", "{ friend").
  file(STRINGS ${f} lines REGEX "(^|[>{;])[ \t]*friend[ \t]")
  file(RELATIVE_PATH rel ${SRC} ${f})
  foreach(line ${lines})
    string(STRIP "${line}" line)
    string(APPEND found "\n  ${rel}: ${line}")
  endforeach()
endforeach()
list(LENGTH files count)
if(count EQUAL 0)
  message(FATAL_ERROR "no sources found under ${SRC}/src and ${SRC}/include")
endif()
if(NOT found STREQUAL "")
  message(FATAL_ERROR "friend declarations (give the collaborator a narrow interface instead):${found}")
endif()
message(STATUS "no friend declaration in ${count} files of src/ and include/")

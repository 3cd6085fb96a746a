# tests/check_exports.cmake — fails unless libstitch.so exports every C API function.
# Run as: cmake -DLIB=<path to libstitch.so> -P check_exports.cmake
find_program(NM nm REQUIRED)
execute_process(COMMAND ${NM} -D --defined-only ${LIB} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${LIB}")
endif()
foreach(fn stitch_malloc stitch_free stitch_configure stitch_record_stream stitch_pin stitch_unpin stitch_empty_cache
           stitch_set_memory_fraction stitch_stat stitch_stat_count stitch_stat_key stitch_stats
           stitch_reset_peak_stats stitch_last_error
           stitch_clear_error stitch_record_history stitch_dump_snapshot stitch_memory_summary
           stitch_config stitch_device_count stitch_reset_accumulated_stats stitch_memory_fraction stitch_torch_malloc
           stitch_torch_begin_allocate_to_pool stitch_torch_end_allocate_to_pool
           stitch_torch_release_pool stitch_sleep stitch_wake stitch_backup_progress)
  if(NOT symbols MATCHES " T ${fn}\n")
    message(FATAL_ERROR "${LIB} does not export ${fn}")
  endif()
endforeach()
# Internal C++ symbols stay hidden: only the stitch:: API classes may be visible.
string(REGEX MATCHALL "[^\n]* T _ZN6stitch6detail[^\n]*" leaked "${symbols}")
if(leaked)
  message(FATAL_ERROR "internal symbols are exported: ${leaked}")
endif()
message(STATUS "libstitch exports the whole C API")

// fuzz/fuzz_rmm_csv.cpp — libFuzzer target: the RMM CSV log reader and the start-state
// reconstruction of the replay tool.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "stitch/errors.hpp"
#include "tools/stitch_replay/trace_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const stitch::replay_cli::TraceFile w = stitch::replay_cli::trace_file_from_rmm_csv(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& t : w.devices) (void)stitch::replay::peak_requested(t);
  } catch (const stitch::error&) {
  }
  return 0;
}

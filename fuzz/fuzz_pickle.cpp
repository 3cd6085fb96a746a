// fuzz/fuzz_pickle.cpp — libFuzzer target: the safe pickle reader and the snapshot conversion.
// Any input is either read or rejected with stitch::error; nothing may crash, hang or allocate
// without bound (the reader's limits are lowered so the fuzzer cannot hit its memory cap).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tools/formats/pickle_reader.hpp"
#include "stitch/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  stitch::formats::PickleLimits limits;
  limits.max_memory = std::size_t{64} << 20;
  try {
    const stitch::detail::PyValue v =
        stitch::formats::read_pickle(std::string_view(reinterpret_cast<const char*>(data), size),
                                    "fuzz", limits);
    (void)stitch::formats::snapshot_from_pyvalue(v, "fuzz");
  } catch (const stitch::error&) {
  }
  return 0;
}

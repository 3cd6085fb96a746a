// fuzz/fuzz_config.cpp — libFuzzer target: the STITCH_ALLOC_CONF parser. Any input either parses
// or throws stitch::config_error; a parsed config must survive to_string() -> parse() unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "stitch/config.hpp"
#include "stitch/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  stitch::Config c;
  try {
    c = stitch::Config::parse(text);
  } catch (const stitch::config_error&) {
    return 0;
  }
  const stitch::Config again = stitch::Config::parse(c.to_string());
  if (again.to_string() != c.to_string()) std::abort();  // the round trip must be exact
  return 0;
}

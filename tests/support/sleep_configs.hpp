// tests/support/sleep_configs.hpp — the three configurations sleep and wake are tested in
// (defaults, expandable segments, stitching), as a gtest parameter list with readable names.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace stitch::test {

inline auto sleep_configs() {
  return ::testing::Values("backend:sim", "backend:sim,expandable_segments:True",
                           "backend:sim,expandable_segments:True,stitching:True");
}

inline std::string sleep_config_name(const ::testing::TestParamInfo<const char*>& info) {
  switch (info.index) {
    case 0: return "defaults";
    case 1: return "expandable";
    default: return "stitching";
  }
}

}  // namespace stitch::test

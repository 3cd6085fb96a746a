// Tests of the snapshot reader on a corpus (tests/data/snapshots, written by make_corpus.py with
// Python's own pickler): PyTorch-style snapshots in pickle protocols 2 to 5, with unknown keys
// everywhere and integers wider than 64 bits in metadata, must load and give the start state
// Python computes from the same data; broken and hostile files must be refused with an error
// that names the file and says where.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "stitch/errors.hpp"
#include "tools/formats/pickle_reader.hpp"
#include "tools/stitch_replay/trace_file.hpp"

namespace {

namespace fs = std::filesystem;
namespace rp = stitch::replay_cli;

fs::path corpus() { return fs::path(__FILE__).parent_path() / "data" / "snapshots"; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// "device=0 events=5 ..." lines: device -> key -> value.
std::map<int, std::map<std::string, std::uint64_t>> facts(const fs::path& p) {
  std::map<int, std::map<std::string, std::uint64_t>> out;
  std::istringstream lines(slurp(p));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::map<std::string, std::uint64_t> kv;
    for (std::string w; words >> w;) {
      const auto eq = w.find('=');
      kv[w.substr(0, eq)] = std::stoull(w.substr(eq + 1));
    }
    out[static_cast<int>(kv.at("device"))] = kv;
  }
  return out;
}

TEST(SnapshotCorpus, EveryGoodFileLoadsWithTheStartStatePythonComputes) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(corpus() / "good")) {
    if (entry.path().extension() != ".pickle") continue;
    SCOPED_TRACE(entry.path().filename().string());
    rp::TraceFile w;
    ASSERT_NO_THROW(w = rp::read_trace_file(entry.path().string()));
    const auto want = facts(fs::path(entry.path()).replace_extension(".facts"));
    ASSERT_EQ(w.devices.size(), want.size());
    for (const rp::DeviceWorkload& t : w.devices) {
      SCOPED_TRACE(t.device);
      const auto& f = want.at(t.device);
      EXPECT_EQ(t.events.size(), f.at("events"));
      EXPECT_EQ(t.initial.size(), f.at("initial_blocks"));
      EXPECT_EQ(rp::live_at_start(t), f.at("live_at_start"));
      EXPECT_EQ(t.reserved_at_start, f.at("reserved_at_start"));
      EXPECT_EQ(t.recorded_peak_reserved.value_or(0), f.at("recorded_peak_reserved"));
    }
    ++files;
  }
  EXPECT_GE(files, 9);
}

TEST(SnapshotCorpus, WideMetadataIsKeptAsMetadata) {
  const stitch::Snapshot s = stitch::formats::read_snapshot_file(
      (corpus() / "good" / "two-devices-p4-wide-metadata.pickle").string());
  ASSERT_EQ(s.device_traces.size(), 2u);
  const stitch::TraceEntry& e = s.device_traces[0].at(0);
  // A line of 2^70 and PyTorch's unknown line (2^64 - 1) are no line; a time of 2^80 is none.
  ASSERT_GE(e.frames.size(), 2u);
  EXPECT_EQ(e.frames[0], "forward (model.py)");
  EXPECT_EQ(e.frames[1], std::string("??") + " (" + "??" + ")");  // (no trigraph)
  EXPECT_EQ(e.time_us, 0);
  // A stream id wider than 64 bits is read by its low 64 bits.
  EXPECT_EQ(s.device_traces[1].at(0).stream, 0x1234u);
  // The recorded settings: what stitch shares with PyTorch, the rest of the string left out.
  EXPECT_TRUE(s.has_settings);
  const stitch::Config c = rp::recorded_settings(s);
  EXPECT_EQ(c.max_non_split_rounding, std::size_t{40} << 20);
  EXPECT_FALSE(c.expandable_segments);
  EXPECT_EQ(rp::settings_difference(c), "max_non_split_rounding_mb:40");
}

TEST(SnapshotCorpus, EveryBadFileIsRefusedNamingTheFileAndThePlace) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(corpus() / "bad")) {
    if (entry.path().extension() != ".pickle") continue;
    SCOPED_TRACE(entry.path().filename().string());
    std::string want = slurp(fs::path(entry.path()).replace_extension(".txt"));
    while (!want.empty() && want.back() == '\n') want.pop_back();
    std::string message;
    try {
      (void)rp::read_trace_file(entry.path().string());
    } catch (const stitch::error& e) {
      message = e.what();
    }
    EXPECT_EQ(message.rfind(entry.path().string() + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(want), std::string::npos) << message;
    ++files;
  }
  EXPECT_GE(files, 6);
}

}  // namespace

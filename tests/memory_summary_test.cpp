// Tests of memory_summary(): torch.cuda.memory_summary()'s layout and number formatting, the
// numbers against DeviceStats, stitch's free-memory lines against the snapshot, and the C API.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "diagnostics/memory_summary.hpp"
#include "diagnostics/oom_report.hpp"
#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"

namespace {

using stitch::detail::summary_count;
using stitch::detail::summary_size;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The cells of a table row "| a | b | c |" without the outer bars.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string inner = line.substr(1, line.size() - 2);
  std::size_t start = 0;
  for (std::size_t bar; (bar = inner.find('|', start)) != std::string::npos; start = bar + 1)
    out.push_back(inner.substr(start, bar - start));
  out.push_back(inner.substr(start));
  return out;
}

stitch::stream_t stream(std::uintptr_t n) { return reinterpret_cast<stitch::stream_t>(n); }

TEST(MemorySummary, FormatsSizesAsPyTorchDoes) {
  // Expected strings computed with torch/cuda/memory.py's _format_size.
  const struct {
    std::int64_t sz, pref;
    const char* want;
  } cases[] = {
      {0, 0, "     0 B  "},
      {1023, 1023, "  1023 B  "},
      {786431, 786431, "786431 B  "},
      {786432, 786432, "   768 KiB"},
      {5242880, 5242880, "  5120 KiB"},
      {1000, 5242880, "     0 KiB"},  // a pool row follows the "all" row's unit
      {3221225472, 3221225472, "  3072 MiB"},
      {805306367, 805306367, "786431 KiB"},
      {805306368, 805306368, "   768 MiB"},
      {5497558138880, 5497558138880, "  5120 GiB"},
      {123456789012345, 123456789012345, "114978 GiB"},
      {-5, 10485760, "    -1 KiB"},  // Python's floor division
      {7881299347898368, 7881299347898368, "  7168 TiB"},
  };
  for (const auto& c : cases) EXPECT_EQ(summary_size(c.sz, c.pref), c.want) << c.sz << " / " << c.pref;
}

TEST(MemorySummary, FormatsCountsAsPyTorchDoes) {
  // Expected strings computed with torch/cuda/memory.py's _format_count.
  const struct {
    std::int64_t cnt, pref;
    const char* want;
  } cases[] = {
      {0, 0, "      0   "},        {749999, 749999, " 749999   "}, {750000, 750000, "    750 K "},
      {1234567, 1234567, "   1234 K "}, {999, 2000000, "      0 K "}, {750000000, 750000000, "    750 M "},
      {3, 3, "      3   "},
  };
  for (const auto& c : cases) EXPECT_EQ(summary_count(c.cnt, c.pref), c.want) << c.cnt << " / " << c.pref;
}

struct Scenario {
  Scenario() {
    stitch::SimBackend::Options o;
    o.capacity = 64 * MiB;
    sim = std::make_shared<stitch::SimBackend>(o);
    alloc = std::make_unique<stitch::Allocator>(stitch::Config::parse("backend:sim"), sim);
    stitch::Allocator& a = *alloc;
    small = a.allocate(1000);
    large = a.allocate(5 * MiB);
    void* hole = a.allocate(3 * MiB);
    a.deallocate(hole);                                       // free 3 MiB inside the large segment
    EXPECT_THROW((void)a.allocate(200 * MiB), stitch::out_of_memory);  // num_ooms = 1
    side = a.allocate(256 * KiB, stream(0x10));               // a segment of stream 0x10
    void* side_free = a.allocate(100 * KiB, stream(0x10));
    a.deallocate(side_free);
    pending = a.allocate(64 * KiB, stream(0x10));
    a.record_stream(pending, stream(0x20));
    sim->hold_stream(stream(0x20));
    a.deallocate(pending);                                    // waits for stream 0x20
  }
  ~Scenario() {
    sim->release_stream(stream(0x20));
    for (void* p : {small, large, side}) alloc->deallocate(p);
  }
  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<stitch::Allocator> alloc;
  void* small = nullptr;
  void* large = nullptr;
  void* side = nullptr;
  void* pending = nullptr;
};

TEST(MemorySummary, HasPyTorchsLayout) {
  Scenario s;
  const std::vector<std::string> lines = lines_of(s.alloc->memory_summary(0));
  ASSERT_GT(lines.size(), 40u);
  for (const std::string& l : lines) {
    EXPECT_EQ(l.size(), 77u) << "'" << l << "'";
    EXPECT_EQ(l.front(), '|');
    EXPECT_EQ(l.back(), '|');
  }
  EXPECT_EQ(lines[0], "|" + std::string(75, '=') + "|");
  EXPECT_EQ(lines[1], "|                  stitch CUDA memory summary, device ID 0                  |");
  EXPECT_EQ(lines[2], "|" + std::string(75, '-') + "|");
  // The 200 MiB request failed after the full retry ladder (one retry counted).
  EXPECT_EQ(lines[3], "|            CUDA OOMs: 1            |        cudaMalloc retries: 1         |");
  EXPECT_EQ(lines[4], "|" + std::string(75, '=') + "|");
  EXPECT_EQ(lines[5], "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |");
  // Nine groups of three rows, then the two oversize rows, each group after a '-' rule.
  const char* groups[] = {"Allocated memory",    "Active memory",         "Requested memory",
                          "GPU reserved memory", "Non-releasable memory", "Allocations",
                          "Active allocs",       "GPU reserved segments", "Non-releasable allocs"};
  std::size_t i = 6;
  for (const char* g : groups) {
    EXPECT_EQ(lines[i++], "|" + std::string(75, '-') + "|");
    EXPECT_EQ(cells(lines[i++])[0], " " + std::string(g) + std::string(21 - std::string(g).size(), ' ') + " ");
    EXPECT_EQ(cells(lines[i++])[0], "       from large pool ");
    EXPECT_EQ(cells(lines[i++])[0], "       from small pool ");
  }
  for (const char* g : {"Oversize allocations", "Oversize GPU segments"}) {
    EXPECT_EQ(lines[i++], "|" + std::string(75, '-') + "|");
    EXPECT_EQ(cells(lines[i++])[0], " " + std::string(g) + std::string(21 - std::string(g).size(), ' ') + " ");
  }
  EXPECT_EQ(lines[i++], "|" + std::string(75, '=') + "|");
  EXPECT_NE(lines[i++].find("stitch: free cached memory and fragmentation"), std::string::npos);
  EXPECT_EQ(lines.back(), "|" + std::string(75, '=') + "|");
}

TEST(MemorySummary, NumbersMatchDeviceStats) {
  Scenario s;
  const stitch::DeviceStats st = s.alloc->stats(0);
  const std::vector<std::string> lines = lines_of(s.alloc->memory_summary(0));
  EXPECT_NE(lines[3].find("CUDA OOMs: " + std::to_string(st.num_ooms) + " "), std::string::npos);
  EXPECT_NE(lines[3].find("cudaMalloc retries: " + std::to_string(st.num_alloc_retries) + " "), std::string::npos);

  using Fmt = std::string (*)(std::int64_t, std::int64_t);
  const std::pair<const stitch::StatArray*, Fmt> groups[] = {
      {&st.allocated_bytes, summary_size}, {&st.active_bytes, summary_size}, {&st.requested_bytes, summary_size},
      {&st.reserved_bytes, summary_size},  {&st.inactive_split_bytes, summary_size}, {&st.allocation, summary_count},
      {&st.active, summary_count},         {&st.segment, summary_count},         {&st.inactive_split, summary_count},
  };
  auto check_row = [](const std::string& line, const stitch::Stat& v, const stitch::Stat& pref, Fmt f) {
    const auto c = cells(line);
    ASSERT_EQ(c.size(), 5u) << line;
    EXPECT_EQ(c[1], " " + f(v.current, pref.current) + " ") << line;
    EXPECT_EQ(c[2], " " + f(v.peak, pref.peak) + " ") << line;
    EXPECT_EQ(c[3], " " + f(v.allocated, pref.allocated) + " ") << line;
    EXPECT_EQ(c[4], " " + f(v.freed, pref.freed) + " ") << line;
  };
  std::size_t i = 7;
  for (const auto& [arr, f] : groups) {
    const stitch::StatArray& a = *arr;
    check_row(lines[i], a[stitch::kAll], a[stitch::kAll], f);
    check_row(lines[i + 1], a[stitch::kLargePool], a[stitch::kAll], f);
    check_row(lines[i + 2], a[stitch::kSmallPool], a[stitch::kAll], f);
    i += 4;
  }
  check_row(lines[i], st.oversize_allocations, st.oversize_allocations, summary_count);
  check_row(lines[i + 2], st.oversize_segments, st.oversize_segments, summary_count);

  // Spot checks against the scenario itself: 1 KiB small + 5 MiB large + 256 KiB on stream 0x10
  // allocated now; the peak was with the 3 MiB block, before the stream-0x10 blocks.
  EXPECT_EQ(cells(lines[7])[1], "   5377 KiB ");
  EXPECT_EQ(cells(lines[7])[2], "   8193 KiB ");
  EXPECT_EQ(cells(lines[27])[0], " Allocations           ");
  EXPECT_EQ(cells(lines[27])[1], "       3    ");
}

TEST(MemorySummary, FreeMemoryLinesMatchTheSnapshot) {
  Scenario s;
  stitch::Allocator& a = *s.alloc;
  const stitch::DeviceStats st = a.stats(0);
  const stitch::Snapshot snap = a.snapshot();
  const auto x = stitch::detail::summary_extras(snap.segments, 0);

  // Independent recount.
  std::size_t free_bytes = 0, pending_bytes = 0, largest = 0;
  std::map<std::uintptr_t, std::size_t> per_stream;
  for (const auto& seg : snap.segments)
    for (const auto& b : seg.blocks) {
      if (b.state == "inactive") {
        free_bytes += b.size;
        largest = std::max(largest, b.size);
        per_stream[seg.stream] += b.size;
      } else if (b.state == "active_pending_free") {
        pending_bytes += b.size;
      }
    }
  EXPECT_EQ(x.free_bytes, free_bytes);
  EXPECT_EQ(x.pending_free_bytes, pending_bytes);
  EXPECT_EQ(x.pending_free_blocks, 1u);
  EXPECT_EQ(x.largest_free_block, largest);
  ASSERT_EQ(x.per_stream.size(), per_stream.size());
  for (const auto& f : x.per_stream) EXPECT_EQ(f.bytes, per_stream[f.stream]);
  // What is reserved but not allocated is exactly the free plus the pending blocks.
  EXPECT_EQ(static_cast<std::int64_t>(free_bytes + pending_bytes),
            st.reserved_bytes[stitch::kAll].current - st.allocated_bytes[stitch::kAll].current);

  const std::string text = a.memory_summary(0);
  using stitch::detail::format_size;
  auto has = [&](const std::string& part) { return text.find(part) != std::string::npos; };
  EXPECT_TRUE(has("| Reserved but unallocated  | " + format_size(free_bytes + pending_bytes) + " (")) << text;
  EXPECT_TRUE(has("| Largest free block        | " + format_size(largest) + " ")) << text;
  EXPECT_TRUE(has("| Waiting for other streams | 1 block, " + format_size(pending_bytes) + " ")) << text;
  EXPECT_TRUE(has("| Free on default stream    | ")) << text;
  EXPECT_TRUE(has("| Free on stream 0x10       | ")) << text;
  EXPECT_TRUE(has(format_size(per_stream[0x10]) + " (largest ")) << text;
}

TEST(MemorySummary, RejectsABadDevice) {
  Scenario s;
  EXPECT_THROW((void)s.alloc->memory_summary(3), stitch::invalid_argument);
}

TEST(MemorySummary, CApiIsSnprintfLike) {
  ASSERT_EQ(stitch_configure("backend:sim,sim_capacity_mb:1024"), 0) << stitch_last_error();
  void* p = stitch_malloc(3 * MiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  const std::size_t n = stitch_memory_summary(0, nullptr, 0);
  ASSERT_GT(n, 1000u) << stitch_last_error();
  std::string full(n + 1, '\xff');
  EXPECT_EQ(stitch_memory_summary(0, full.data(), full.size()), n);
  EXPECT_EQ(full[n], '\0');
  full.resize(n);
  EXPECT_EQ(lines_of(full)[1], "|                  stitch CUDA memory summary, device ID 0                  |");
  char small[11];
  std::memset(small, 'x', sizeof small);
  EXPECT_EQ(stitch_memory_summary(0, small, sizeof small), n);
  EXPECT_EQ(std::string(small), full.substr(0, 10));
  char one = 'x';
  EXPECT_EQ(stitch_memory_summary(0, &one, 1), n);
  EXPECT_EQ(one, '\0');
  char err[16] = "unchanged";
  EXPECT_EQ(stitch_memory_summary(7, err, sizeof err), 0u);
  EXPECT_EQ(err[0], '\0');
  EXPECT_NE(std::string(stitch_last_error()).find("invalid device 7"), std::string::npos) << stitch_last_error();
  stitch_free(p, 3 * MiB, 0, nullptr);
}

}  // namespace

// tests/support/disk_cycle.hpp — one cycle of the disk tier's fault sweeps (on the simulated
// device, tests/disk_tier_test.cpp, and on backend:cuda over the strict fake driver,
// tests/fake_cuda/fake_cuda_backend_test.cpp): backed-up blocks and a backed-up KV pool with a
// pattern in every byte, a sleep, a sleeping block and a KV block freed, a wake, with whatever
// faults the caller armed; a failed sleep
// must leave every block awake with every byte and nothing of the disk tier behind, a failed
// wake must leave the tags asleep and succeed when retried, and at the end every byte is back.
// Header-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/kv_pool.hpp"
#include "support/backup_dir.hpp"

namespace stitch::test {

struct DiskSweepCounts {
  int runs = 0;
  int sleeps_failed = 0;
  int wakes_failed = 0;
  int reads_failed = 0;  ///< wakes failed by a backup's read (their message checked)
};

/// The cycle on `a` (whose backup_dir leaves most of ~3 MiB of backups, and the KV pool's 4 MiB,
/// to files). `clear`
/// disarms the faults; `nothing_held(where)` checks that the disk tier holds nothing.
inline void disk_cycle(Allocator& a, const std::function<void()>& clear,
                       const std::function<void(const std::string&)>& nothing_held, DiskSweepCounts& counts,
                       const std::string& what) {
  struct Live {
    void* ptr;
    std::size_t size;
    std::uint64_t seed;
  };
  std::vector<Live> blocks;
  std::uint64_t seed = 0x5EED;
  auto add = [&](const char* tag, std::size_t size) {
    Allocator::Region r(a, tag, /*backup=*/true);
    void* p = a.allocate(size);
    fill_every_byte(p, size, ++seed);
    blocks.push_back(Live{p, size, seed});
  };
  for (std::size_t size : {std::size_t{1536} * 1024 + 7, std::size_t{700} * 1024, std::size_t{300} * 1024})
    add("weights", size);
  add("optimizer", std::size_t{640} * 1024 + 1);
  // A KV pool of 2 buffers, its live blocks on one 2 MiB page of each.
  constexpr std::size_t kv_block = std::size_t{128} * 1024;
  KvPool pool(a, 0, 2, kv_block, 32, "kv_cache", Allocator::kRegionBackup);
  std::vector<std::int64_t> ids = pool.alloc(12);
  auto kv_at = [&](std::int64_t id, int b) { return static_cast<char*>(pool.buffer(b)) + id * kv_block; };
  auto kv_seed = [](std::int64_t id, int b) { return 0xCAFEu + static_cast<std::uint64_t>(id) * 2 + b; };
  for (std::int64_t id : ids)
    for (int b = 0; b < 2; ++b) fill_every_byte(kv_at(id, b), kv_block, kv_seed(id, b));
  auto intact = [&] {
    for (const Live& l : blocks)
      if (!every_byte_intact(l.ptr, l.size, l.seed)) return false;
    for (std::int64_t id : ids)
      for (int b = 0; b < 2; ++b)
        if (!every_byte_intact(kv_at(id, b), kv_block, kv_seed(id, b))) return false;
    return true;
  };
  auto stat = [&](const char* key) { return *a.stat(0, key); };
  ++counts.runs;
  bool asleep = false;
  std::string failure;
  try {
    a.sleep();
    asleep = true;
  } catch (const error& e) {
    failure = e.what();
  } catch (const out_of_memory& e) {
    failure = e.what();
  }
  a.validate();
  if (!asleep) {
    ++counts.sleeps_failed;
    EXPECT_NE(failure.find("nothing was put to sleep"), std::string::npos) << what << ": " << failure;
    EXPECT_TRUE(intact()) << what << ": a failed sleep lost a byte";
    EXPECT_EQ(stat("sleeping_bytes.current"), 0) << what;
    nothing_held(what + ": a failed sleep");
    clear();
    a.sleep();  // the same sleep, without the fault
  }
  // A sleeping block freed: its bytes in the file go (a hole).
  a.deallocate(blocks[1].ptr);
  blocks.erase(blocks.begin() + 1);
  pool.free(&ids.back(), 1);  // (its bytes are not read back)
  ids.pop_back();
  a.validate();
  bool woken = false;
  try {
    a.wake();
    woken = true;
  } catch (const error& e) {
    ++counts.wakes_failed;
    // A backup's read names the file and the offset, and says the wake may be retried.
    const std::string m = e.what();
    if (m.find("reading the unnamed backup file") != std::string::npos) {
      ++counts.reads_failed;
      EXPECT_TRUE(m.find("at offset") != std::string::npos && m.find("wake may be retried") != std::string::npos)
          << what << ": " << m;
    }
  }
  a.validate();
  if (!woken) {
    EXPECT_GT(stat("sleeping_bytes.current"), 0) << what << ": a failed wake leaves the tags asleep";
    clear();
    a.wake();  // retried
  }
  EXPECT_TRUE(intact()) << what << ": a byte was lost";
  nothing_held(what + ": after the wake");
  clear();
  for (const Live& l : blocks) a.deallocate(l.ptr);
  pool.free(ids.data(), ids.size());
  a.validate();
}

}  // namespace stitch::test

// Sleep's disk tier (backup_dir, core/backup_files.hpp, docs/sleep.md) on the simulated device,
// whose memory is real host memory, with real files in a fresh directory under /tmp: backups
// beyond pinned host memory (backup_host_mb) go to a file and come back byte for byte; each
// chunk is written while the next is copied out (and read while the previous is copied back);
// a freed sleeping block's file bytes go (a hole, then the file); the
// caps and the file system's room refuse a sleep with nothing changed; a fault at every file
// call and every device call of the path (short writes and reads, ENOSPC, EIO, the host, the
// copies, the waits) leaves every byte of every block intact and no file behind, a wake whose
// read fails names the file and the offset and can be retried; a crash leaves no file; a KV
// pool's backup goes to a file where the host refuses it (the sweep's cycle has a pool too); the
// directory is checked when it is configured; the
// statistic, the residency report, the snapshot and memory_summary say where backups lie.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/kv_pool.hpp"
#include "stitch/sim_backend.hpp"
#include "support/backup_dir.hpp"
#include "support/disk_cycle.hpp"
#include "support/sleep_configs.hpp"

namespace stitch {
namespace {

using test::BackupDir;
using test::every_byte_intact;
using test::fill_every_byte;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t seed;
};

/// An allocator on a fresh simulated device whose backups may go to files of a fresh directory.
class DiskTierBase {
 protected:
  void make(const std::string& conf) {
    SimBackend::Options o;
    o.capacity = 512 * MiB;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(conf + ",backup_dir:" + dir.path()), sim);
  }
  Live add(std::size_t size) {
    void* p = alloc->allocate(size);
    Live l{p, size, ++seed * 0x9E3779B97F4A7C15ULL};
    fill_every_byte(p, size, l.seed);
    return l;
  }
  std::vector<Live> tagged(const char* tag, bool backup, std::initializer_list<std::size_t> sizes) {
    Allocator::Region r(*alloc, tag, backup);
    std::vector<Live> out;
    for (std::size_t s : sizes) out.push_back(add(s));
    return out;
  }
  std::int64_t stat(const char* key) { return *alloc->stat(0, key); }
  /// Bytes of the blocks' backups (their sizes as allocated).
  std::int64_t backup_bytes(const std::vector<Live>& blocks) {
    std::int64_t n = 0;
    for (const Live& l : blocks) n += static_cast<std::int64_t>(alloc->find(l.ptr)->size);
    return n;
  }
  static bool intact(const std::vector<Live>& blocks) {
    for (const Live& l : blocks)
      if (!every_byte_intact(l.ptr, l.size, l.seed)) return false;
    return true;
  }
  /// Nothing of the disk tier is held: no file in the directory or open on it, no pinned host
  /// memory, nothing in backup_file_bytes.
  void expect_nothing_held(const std::string& where) {
    EXPECT_EQ(dir.entries(), 0u) << where;
    EXPECT_EQ(dir.open_files(), 0u) << where;
    EXPECT_EQ(sim->usage(0).files, 0u) << where;
    EXPECT_EQ(sim->usage(0).host_bytes, 0u) << where;
    EXPECT_EQ(stat("backup_file_bytes.current"), 0) << where;
  }
  /// A residency report's number after `"key": ` at or after `from` (-1 when absent).
  static long long field(const std::string& json, const std::string& key, std::size_t from = 0) {
    const std::size_t at = json.find("\"" + key + "\": ", from);
    if (at == std::string::npos) return -1;
    return std::stoll(json.substr(at + key.size() + 4));
  }

  BackupDir dir;
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
  std::uint64_t seed = 0;
};

class DiskTier : public DiskTierBase, public ::testing::TestWithParam<const char*> {};

TEST_P(DiskTier, BackupsBeyondTheHostGoToFilesAndComeBackByteForByte) {
  ASSERT_FALSE(dir.path().empty());
  make(std::string(GetParam()) + ",backup_host_mb:4");
  const auto weights = tagged("weights", true, {6 * MiB, 2 * MiB + 4097, 700 * KiB + 13});
  const auto optimizer = tagged("optimizer", true, {3 * MiB + 5});
  const auto kv = tagged("kv", false, {8 * MiB});
  const std::int64_t total = backup_bytes(weights) + backup_bytes(optimizer);

  alloc->sleep();
  alloc->validate();
  // 4 MiB of pinned host memory: the staging buffers and a first piece; the rest in files.
  const std::string res = alloc->residency(0);
  const long long host = field(res, "host_backup_bytes");
  const long long files = field(res, "backup_file_bytes");
  EXPECT_EQ(host + files, total) << res;
  EXPECT_GT(files, total / 2) << res;
  EXPECT_EQ(files, stat("backup_file_bytes.current"));
  EXPECT_EQ(stat("backup_file_bytes.peak"), files);
  EXPECT_LE(sim->usage(0).host_bytes, 4 * MiB) << "backup_host_mb holds, staging included";
  EXPECT_EQ(field(res, "backup_staging_bytes") + host, static_cast<long long>(sim->usage(0).host_bytes));
  EXPECT_GE(sim->usage(0).files, 1u);
  EXPECT_EQ(dir.open_files(), sim->usage(0).files);
  EXPECT_EQ(dir.entries(), 0u) << "unnamed files: nothing in the directory";
  EXPECT_GT(sim->call_count(SimCall::write_file), 1u);
  // Each tag says where its backup lies, and its two parts add up to it.
  for (const auto& [tag, blocks] : {std::pair{"weights", &weights}, std::pair{"optimizer", &optimizer}}) {
    const std::size_t at = res.find(std::string("\"tag\": \"") + tag + "\"");
    ASSERT_NE(at, std::string::npos) << res;
    const long long h = field(res, "host_backup_bytes", at), f = field(res, "backup_file_bytes", at);
    EXPECT_EQ(h + f, backup_bytes(*blocks)) << tag;
    const std::string place = h != 0 && f != 0 ? "both" : h != 0 ? "host" : "file";
    EXPECT_NE(res.find("\"backup\": \"" + place + "\"", at), std::string::npos) << tag << ": " << res;
  }
  // The snapshot's sleeping segments and memory_summary say it too.
  long long snap_files = 0;
  for (const SegmentSnapshot& s : alloc->snapshot().segments) snap_files += static_cast<long long>(s.backup_file_bytes);
  EXPECT_EQ(snap_files, files);
  EXPECT_NE(alloc->memory_summary(0).find("Backups in files"), std::string::npos);

  alloc->wake();
  alloc->validate();
  EXPECT_TRUE(intact(weights));
  EXPECT_TRUE(intact(optimizer));
  EXPECT_GT(sim->call_count(SimCall::read_file), 1u);
  expect_nothing_held("after the wake");
  for (const auto* v : {&weights, &optimizer, &kv})
    for (const Live& l : *v) alloc->deallocate(l.ptr);
  alloc->validate();
}

TEST_P(DiskTier, FreeingASleepingBlockDropsItsFileBytesAndTheLastOneTheFile) {
  make(std::string(GetParam()) + ",backup_host_mb:1");
  auto weights = tagged("weights", true, {4 * MiB, 4 * MiB, 64 * KiB});
  alloc->sleep();
  const std::int64_t before = stat("backup_file_bytes.current");
  const std::uint64_t disk_before = dir.disk_bytes();
  EXPECT_GT(before, static_cast<std::int64_t>(7 * MiB));
  const std::int64_t first = static_cast<std::int64_t>(alloc->find(weights[0].ptr)->size);
  alloc->deallocate(weights[0].ptr);  // asleep: its backup goes
  alloc->validate();
  EXPECT_EQ(stat("backup_file_bytes.current"), before - first);
  EXPECT_LE(dir.disk_bytes() + 3 * MiB, disk_before) << "a hole where its bytes were";
  alloc->wake();
  alloc->validate();
  EXPECT_TRUE(intact({weights[1], weights[2]}));
  alloc->sleep();
  alloc->deallocate(weights[1].ptr);
  alloc->deallocate(weights[2].ptr);
  alloc->validate();
  expect_nothing_held("every sleeping block freed");
  alloc->wake();
}

TEST_P(DiskTier, TheCapsAndTheFileSystemsRoomRefuseASleepWithNothingChanged) {
  make(std::string(GetParam()) + ",backup_host_mb:1,backup_dir_mb:2");
  const auto weights = tagged("weights", true, {4 * MiB, 2 * MiB});
  try {
    alloc->sleep();
    FAIL() << "6 MiB of backups in 1 MiB of host memory and 2 MiB of files";
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("backup_dir_mb"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was put to sleep"), std::string::npos) << m;
  }
  alloc->validate();
  EXPECT_TRUE(intact(weights));
  EXPECT_EQ(stat("sleeping_bytes.current"), 0);
  expect_nothing_held("a refused sleep");
  // More room: the same sleep succeeds.
  alloc->configure("backup_dir_mb:64");
  alloc->sleep();
  alloc->wake();
  EXPECT_TRUE(intact(weights));
  for (const Live& l : weights) alloc->deallocate(l.ptr);
  expect_nothing_held("all freed");
}

TEST(DiskTierRoom, WithoutACapTheFileSystemsFreeSpaceIsTheLimit) {
  // Backups larger than the directory's file system has free: refused before anything is
  // written. The simulated device's memory is sparse, so a block past the free space costs
  // nothing until touched (and it is not touched).
  BackupDir dir;
  struct statvfs v {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &v), 0);
  const std::size_t free_bytes = static_cast<std::size_t>(v.f_bavail) * v.f_frsize;
  if (free_bytes > (std::size_t{16} << 40))
    GTEST_SKIP() << "skipped: " << dir.path() << " has more than 16 TiB free, more than a simulated device here maps";
  const std::size_t need = (free_bytes / (64 * MiB) + 16) * (64 * MiB);  // 1 GiB or so past it
  auto sim = std::make_shared<SimBackend>(SimBackend::Options{1, need + 256 * MiB});
  Allocator a(Config::parse("backend:sim,backup_host_mb:1,backup_dir:" + dir.path()), sim);
  void* p = nullptr;
  {
    Allocator::Region r(a, "weights", true);
    p = a.allocate(need);
  }
  try {
    a.sleep();
    FAIL() << "backups past the free space";
  } catch (const out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir.path() + " has "), std::string::npos) << m;
    EXPECT_NE(m.find("free"), std::string::npos) << m;
  }
  EXPECT_EQ(sim->call_count(SimCall::write_file), 0u);
  EXPECT_EQ(sim->call_count(SimCall::open_file), 0u);
  EXPECT_EQ(sim->usage(0).host_bytes, 0u);
  a.deallocate(p);
}

TEST_P(DiskTier, WithoutBackupDirOnlyTheHostHoldsBackups) {
  SimBackend::Options o;
  o.capacity = 256 * MiB;
  sim = std::make_shared<SimBackend>(o);
  alloc = std::make_unique<Allocator>(Config::parse(std::string(GetParam()) + ",backup_host_mb:2"), sim);
  const auto weights = tagged("weights", true, {3 * MiB});
  try {
    alloc->sleep();
    FAIL() << "3 MiB in 2 MiB of host memory";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("backup_dir sends what the host cannot hold to files"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(intact(weights));
  EXPECT_EQ(sim->usage(0).host_bytes, 0u);
  EXPECT_EQ(sim->call_count(SimCall::open_file), 0u);
  alloc->deallocate(weights[0].ptr);
}

/// Holds each file write until the next chunk's copy has been queued (and each read until the
/// previous chunk's copy back has), with a bound: what it saw says whether they overlapped.
class OverlapSim : public SimBackend {
 public:
  using SimBackend::SimBackend;
  std::int64_t write_file(int device, int fd, const void* src, std::size_t bytes, std::uint64_t offset) noexcept override {
    const std::uint64_t k = writes_started++;
    // While chunk k is written, chunk k+1's copy (the (k+2)th) comes, unless k is the last.
    overlapped_writes += wait_for(SimCall::copy_to_host_async, copies_before + k + 2) ? 1 : 0;
    return SimBackend::write_file(device, fd, src, bytes, offset);
  }
  std::int64_t read_file(int device, int fd, void* dst, std::size_t bytes, std::uint64_t offset) noexcept override {
    const std::uint64_t k = reads_started++;
    // While chunk k is read, chunk k-1's copy back (the kth) comes, unless k is the first.
    overlapped_reads += k > 0 && wait_for(SimCall::copy_from_host_async, copies_back_before + k) ? 1 : 0;
    return SimBackend::read_file(device, fd, dst, bytes, offset);
  }
  std::uint64_t copies_before = 0, copies_back_before = 0;
  std::atomic<std::uint64_t> writes_started{0}, reads_started{0}, overlapped_writes{0}, overlapped_reads{0};

 private:
  bool wait_for(SimCall call, std::uint64_t count) {
    for (int i = 0; i < 2000; ++i) {  // 2 s at most: the caller may never queue it
      if (call_count(call) >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
};

TEST_P(DiskTier, EachChunkIsWrittenWhileTheNextIsCopiedAndReadWhileThePreviousIsCopiedBack) {
  SimBackend::Options o;
  o.capacity = 256 * MiB;
  auto sim_overlap = std::make_shared<OverlapSim>(o);
  sim = sim_overlap;
  // backup_host_mb:1: the staging buffers take it all (two chunks of 512 KiB), the backup goes
  // to the file whole, one copy per chunk.
  alloc = std::make_unique<Allocator>(
      Config::parse(std::string(GetParam()) + ",backup_host_mb:1,backup_dir:" + dir.path()), sim);
  const auto weights = tagged("weights", true, {8 * MiB});
  sim_overlap->copies_before = sim->call_count(SimCall::copy_to_host_async);
  alloc->sleep();
  EXPECT_EQ(sim_overlap->writes_started, 16u) << "8 MiB in chunks of 512 KiB";
  EXPECT_EQ(sim_overlap->overlapped_writes, 15u) << "every chunk but the last is written while the next is copied";
  sim_overlap->copies_back_before = sim->call_count(SimCall::copy_from_host_async);
  alloc->wake();
  EXPECT_EQ(sim_overlap->reads_started, 16u);
  EXPECT_EQ(sim_overlap->overlapped_reads, 15u) << "every chunk but the first is read while the previous is copied back";
  EXPECT_TRUE(intact(weights));
  alloc->deallocate(weights[0].ptr);
}

TEST_P(DiskTier, AWakeWhoseReadFailsNamesTheFileAndTheOffsetAndCanBeRetried) {
  make(std::string(GetParam()) + ",backup_host_mb:1");
  const auto weights = tagged("weights", true, {5 * MiB});
  alloc->sleep();
  sim->inject_fault(SimCall::read_file, 3, SimFault::io_error);
  try {
    alloc->wake();
    FAIL() << "an EIO went unreported";
  } catch (const backend_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("backup file in " + dir.path()), std::string::npos) << m;
    EXPECT_NE(m.find("at offset "), std::string::npos) << m;
    EXPECT_NE(m.find("EIO"), std::string::npos) << m;
    EXPECT_NE(m.find("tag 'weights'"), std::string::npos) << m;
    EXPECT_NE(m.find("may be retried"), std::string::npos) << m;
  }
  alloc->validate();
  EXPECT_GT(stat("sleeping_bytes.current"), 0) << "still asleep";
  EXPECT_EQ(dir.open_files(), 1u) << "with its backup";
  alloc->wake();
  EXPECT_TRUE(intact(weights));
  expect_nothing_held("after the retried wake");
  alloc->deallocate(weights[0].ptr);
}

INSTANTIATE_TEST_SUITE_P(Configs, DiskTier, test::sleep_configs(), test::sleep_config_name);

// ---- the fault sweep ---------------------------------------------------------------------------

class DiskTierSweep : public DiskTierBase, public ::testing::Test {
 protected:
  /// The cycle (support/disk_cycle.hpp) on a fresh allocator with `arm` armed; false when no
  /// fault fired (the sweep of that kind ends).
  bool cycle(const std::function<void()>& arm, test::DiskSweepCounts& counts, const std::string& what) {
    make("backend:sim,backup_host_mb:1");
    const std::uint64_t fired = sim->faults_fired();
    arm();
    test::disk_cycle(*alloc, [&] { sim->clear_faults(); }, [&](const std::string& where) { expect_nothing_held(where); },
                     counts, what);
    alloc.reset();
    return sim->faults_fired() > fired;
  }
};

TEST_F(DiskTierSweep, AFaultAtEveryCallOfTheDiskTierLosesNoByteAndLeavesNoFile) {
  test::DiskSweepCounts counts;
  int fired = 0;
  const std::pair<SimCall, SimFault> faults[] = {
      {SimCall::open_file, SimFault::no_space},      {SimCall::open_file, SimFault::io_error},
      {SimCall::write_file, SimFault::short_io},     {SimCall::write_file, SimFault::no_space},
      {SimCall::write_file, SimFault::io_error},     {SimCall::read_file, SimFault::short_io},
      {SimCall::read_file, SimFault::io_error},      {SimCall::discard_file, SimFault::io_error},
      {SimCall::allocate_host, SimFault::out_of_memory}, {SimCall::allocate_host, SimFault::error},
      {SimCall::copy_to_host_async, SimFault::error}, {SimCall::copy_from_host_async, SimFault::error},
      {SimCall::synchronize_stream, SimFault::error}};
  for (const auto& [call, fault] : faults) {
    for (std::uint64_t nth = 1; nth < 200; ++nth) {
      const std::string what = std::string(to_string(call)) + " #" + std::to_string(nth) + " fault " +
                               std::to_string(static_cast<int>(fault));
      SCOPED_TRACE(what);
      if (!cycle([&, call = call, fault = fault] { sim->inject_fault(call, nth, fault); }, counts, what)) break;
      ++fired;
      if (HasFatalFailure()) return;
    }
  }
  // Two in a row: a short write followed by ENOSPC at the next call (a disk filling up), at every
  // write, and a short read followed by EIO.
  for (const auto& [call, second] : {std::pair{SimCall::write_file, SimFault::no_space},
                                     std::pair{SimCall::read_file, SimFault::io_error}}) {
    for (std::uint64_t nth = 1; nth < 200; ++nth) {
      const std::string what = std::string(to_string(call)) + " short #" + std::to_string(nth) + " then a failure";
      SCOPED_TRACE(what);
      if (!cycle([&, call = call, second = second] {
            sim->inject_fault(call, nth, SimFault::short_io);
            sim->inject_fault(call, nth + 1, second);
          }, counts, what))
        break;
      ++fired;
      if (HasFatalFailure()) return;
    }
  }
  std::printf("disk tier fault sweep (simulated device): %d runs, %d with a fault fired, %d sleeps and %d wakes "
              "failed (%d by a backup's read), every byte intact and no file left after each\n",
              counts.runs, fired, counts.sleeps_failed, counts.wakes_failed, counts.reads_failed);
  EXPECT_GT(counts.sleeps_failed, 20);
  EXPECT_GT(counts.wakes_failed, 10);
  EXPECT_GT(counts.reads_failed, 5);
}

// ---- the process, the KV pools, the configuration ---------------------------------------------

TEST(DiskTierProcess, ACrashWhileAsleepLeavesNoFileInTheDirectory) {
  BackupDir dir;
  for (const int how : {0, SIGKILL, SIGSEGV}) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Allocator a(Config::parse("backend:sim,sim_capacity_mb:128,backup_host_mb:1,backup_dir:" + dir.path()));
      void* p = nullptr;
      {
        Allocator::Region r(a, "weights", true);
        p = a.allocate(8 * MiB);
      }
      std::memset(p, 7, 8 * MiB);
      a.sleep();
      if (how == 0) ::_exit(0);  // no destructor: the process ends with its files open
      // The default action, whatever a sanitizer installed: the kernel ends the process.
      ::signal(how, SIG_DFL);
      ::raise(how);
      ::_exit(3);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    if (how == 0) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == how);
    }
    EXPECT_EQ(dir.entries(), 0u) << "signal " << how;
  }
}

// A KV pool of 2 buffers whose live blocks cover 4 MiB of each (kv_page_mb:1: 4 pages, or 2 where
// the device's granularity is 2 MiB), every byte of each block patterned; backup_host_mb:1 leaves
// the pool's backup to a file.
class DiskTierKv : public DiskTierBase, public ::testing::Test {
 protected:
  static constexpr std::size_t kBlock = 512 * KiB;
  void make_pool() {
    make("backend:sim,kv_page_mb:1,backup_host_mb:1");
    pool = std::make_unique<KvPool>(*alloc, 0, 2, kBlock, 64, "kv", Allocator::kRegionBackup);
    ids = pool->alloc(8);
    for (std::int64_t id : ids)
      for (int b = 0; b < 2; ++b) fill_every_byte(block(id, b), kBlock, seed_of(id, b));
  }
  char* block(std::int64_t id, int b) { return static_cast<char*>(pool->buffer(b)) + id * kBlock; }
  static std::uint64_t seed_of(std::int64_t id, int b) { return 0xC0FFEEu + static_cast<std::uint64_t>(id) * 2 + b; }
  bool intact() {
    for (std::int64_t id : ids)
      for (int b = 0; b < 2; ++b)
        if (!every_byte_intact(block(id, b), kBlock, seed_of(id, b))) return false;
    return true;
  }
  void free_last() {
    pool->free(&ids.back(), 1);
    ids.pop_back();
  }
  void TearDown() override {
    if (pool != nullptr) pool->free(ids.data(), ids.size());
    pool.reset();
  }
  std::unique_ptr<KvPool> pool;
  std::vector<std::int64_t> ids;
};

TEST_F(DiskTierKv, APoolsBackupBeyondTheHostGoesToAFileAndComesBackByteForByte) {
  make_pool();
  const std::string before = alloc->residency(0);
  const long long used = field(before, "used_bytes", before.find("\"kv_pools\""));
  ASSERT_EQ(used, static_cast<long long>(2 * 4 * MiB));
  alloc->sleep(-1, "kv");
  EXPECT_EQ(stat("backup_file_bytes.current"), used);
  EXPECT_EQ(dir.entries(), 0u) << "the backup file has no name";
  EXPECT_EQ(dir.open_files(), 1u);
  const std::string asleep = alloc->residency(0);
  const std::size_t kv = asleep.find("\"kv_pools\"");
  EXPECT_EQ(field(asleep, "backup_file_bytes", kv), used) << asleep;
  EXPECT_EQ(field(asleep, "host_backup_bytes", kv), 0) << asleep;
  EXPECT_NE(asleep.find("\"backup\": \"file\"", kv), std::string::npos) << asleep;
  EXPECT_EQ(field(asleep, "backup_file_bytes"), used) << "the device's total counts the pools' files";
  alloc->validate();
  free_last();  // a block freed while asleep is not read back; its page may still hold live ones
  while (ids.size() > 4) free_last();  // the second half's pages: their bytes leave the file
  EXPECT_EQ(stat("backup_file_bytes.current"), used / 2);
  EXPECT_EQ(field(alloc->residency(0), "backup_file_bytes"), used / 2);
  alloc->validate();
  alloc->wake(-1, "kv");
  EXPECT_TRUE(intact());
  expect_nothing_held("after the wake");
  alloc->validate();
}

TEST(DiskTierKvHost, WithoutBackupDirThePoolsBackupCountsInBackupHostMbAndASleepBeyondItFails) {
  Allocator a(Config::parse("backend:sim,sim_capacity_mb:256,backup_host_mb:2"));
  KvPool pool(a, 0, 2, 64 * KiB, 64, "kv", Allocator::kRegionBackup);
  std::vector<std::int64_t> ids = pool.alloc(48);  // 2 buffers x 3 MiB of pages, backed up
  try {
    a.sleep(-1, "kv");
    FAIL() << "the KV pool's backup passes backup_host_mb";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("KV pool"), std::string::npos) << what;
    EXPECT_NE(what.find("backup_dir"), std::string::npos) << what;
    EXPECT_NE(what.find("nothing was put to sleep"), std::string::npos) << what;
  }
  a.validate();
  a.configure("backup_host_mb:16");
  a.sleep(-1, "kv");
  a.wake(-1, "kv");
  pool.free(ids.data(), ids.size());
}

TEST(DiskTierConfig, BackupDirIsEverythingUpToTheNextCommaAndPrintsBack) {
  const Config c = Config::parse("backend:sim, backup_dir: /mnt/nvme 0/a:b[1] ,backup_dir_mb:10,backup_host_mb:3");
  EXPECT_EQ(c.backup_dir, "/mnt/nvme 0/a:b[1]");
  EXPECT_EQ(c.backup_dir_bytes, 10 * MiB);
  EXPECT_EQ(c.backup_host_bytes, 3 * MiB);
  const Config again = Config::parse(c.to_string());
  EXPECT_EQ(again.backup_dir, c.backup_dir);
  EXPECT_EQ(again.to_string(), c.to_string());
  EXPECT_TRUE(Config::parse("backup_dir:/x,backup_dir:none").backup_dir.empty());
  for (const char* bad : {"backup_dir:", "backup_dir:relative/dir", "backup_dir:/a\x01z", "backup_dir:,x:1",
                          "backup_dir_mb:-1", "backup_dir_mb:1e3", "backup_host_mb:99999999999999999999"}) {
    try {
      (void)Config::parse(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const config_error& e) {
      EXPECT_NE(std::string(e.what()).find("backup_"), std::string::npos) << e.what();
    }
  }
}

TEST(DiskTierConfig, AnUnusableDirectoryIsRefusedWithItsPathAndAMissingOneCreated) {
  BackupDir dir;
  const std::string made = dir.path() + "/a/b";
  Allocator a(Config::parse("backend:sim,sim_capacity_mb:64,backup_dir:" + made));
  struct stat st {};
  ASSERT_EQ(::stat(made.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const std::string file = dir.path() + "/plain";
  std::ofstream(file) << "x";
  auto refused = [&](const std::string& path, const char* why) {
    try {
      a.configure("backup_dir:" + path);
      ADD_FAILURE() << path << " accepted";
    } catch (const config_error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'" + path + "'"), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
    }
    EXPECT_EQ(a.config().backup_dir, made) << "a refused directory changes nothing";
  };
  refused(file, "not a directory");
  refused(file + "/below", "cannot be looked up (Not a directory)");
  refused("/proc/self/stitch-no-such-dir/x", "does not exist and cannot be created");
  refused("/proc/self/fdinfo", "cannot create a file");  // a directory no file can be made in
  ::unlink(file.c_str());
  ::rmdir(made.c_str());
  ::rmdir((dir.path() + "/a").c_str());
}

}  // namespace
}  // namespace stitch

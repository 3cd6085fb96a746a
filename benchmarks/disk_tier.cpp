// benchmarks/disk_tier.cpp — sleep's disk tier (backup_dir, docs/sleep.md) on the simulated
// device, against its peers measured in the same run, rounds interleaved:
//   fs     the file system's own sequential bandwidth: pwrite and then pread of the same bytes in
//          16 MiB requests, through a file opened as the disk tier opens its own (Backend's
//          open_file: O_TMPFILE, O_DIRECT where the file system takes it), from page-aligned
//          memory, nothing else done;
//   disk   stitch_sleep of a tag whose backups go to files (backup_host_mb:32: the staging
//          buffers, two chunks of 16 MiB, take it, every byte goes to the file) and its
//          stitch_wake, wall time, and their backup phases (the first copy or file call to the
//          last: the pages' release and creation, which a GPU does in microseconds and the
//          simulated device in the kernel's page release and faults, left out);
//   host   the same sleep and wake with the backups in pinned host memory (no backup_dir).
// Every byte of the tag is written before each sleep (the simulated device's memory is host
// memory: the kernel really holds it) and checked after each wake. Prints one line per round and
// the medians: the disk tier's sleep against the file system's write, its wake against the
// read (goal: 0.8x or more), against the host-only backups, and the wake against the slower of
// its two halves (the file system's reads, the simulated device's copies into fresh pages).
//
//   disk_tier_bench [--dir DIR] [--gib N] [--rounds R]     (default /tmp, 2 GiB, 3 rounds)
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <sys/mman.h>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/sim_backend.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::size_t kBlock = 64 * MiB;    // the tag's blocks
constexpr std::size_t kRequest = 16 * MiB;  // the baseline's requests (the disk tier's chunk)

double now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

double gib_per_s(std::size_t bytes, double seconds) { return double(bytes) / double(GiB) / seconds; }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "disk_tier_bench: %s\n", what.c_str());
  std::exit(1);
}

/// The file system alone: seconds to write `bytes` sequentially, then to read them back.
std::pair<double, double> fs_pass(stitch::Backend& files, const std::string& dir, std::size_t bytes, bool* direct) {
  const int fd = files.open_file(0, dir.c_str(), direct);
  if (fd < 0) die("cannot open a file in " + dir + ": " + std::strerror(-fd));
  void* buf = ::mmap(nullptr, kRequest, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) die("mmap");
  std::memset(buf, 0x5a, kRequest);
  auto move = [&](bool write) {
    const double t0 = now();
    for (std::size_t off = 0; off < bytes; off += kRequest) {
      const std::int64_t n = write ? files.write_file(0, fd, buf, kRequest, off) : files.read_file(0, fd, buf, kRequest, off);
      if (n != static_cast<std::int64_t>(kRequest)) die(std::string(write ? "write" : "read") + " failed or was short");
    }
    return now() - t0;
  };
  const double w = move(true);
  const double r = move(false);
  files.close_file(0, fd);
  ::munmap(buf, kRequest);
  return {w, r};
}

/// The simulated device, timing the backup phase of a sleep or a wake: from its first copy or
/// file call to its last (the pages' release and creation around it left out).
class PhaseTimer : public stitch::SimBackend {
 public:
  using SimBackend::SimBackend;
  void reset() { first = last = 0; }
  [[nodiscard]] double phase() const { return last - first; }
  std::int64_t write_file(int d, int fd, const void* src, std::size_t n, std::uint64_t off) noexcept override {
    mark();
    const std::int64_t r = SimBackend::write_file(d, fd, src, n, off);
    mark();
    return r;
  }
  std::int64_t read_file(int d, int fd, void* dst, std::size_t n, std::uint64_t off) noexcept override {
    mark();
    const std::int64_t r = SimBackend::read_file(d, fd, dst, n, off);
    mark();
    return r;
  }
  void copy_to_host_async(int d, void* dst, const void* src, std::size_t n, stitch::stream_t s) override {
    mark();
    SimBackend::copy_to_host_async(d, dst, src, n, s);
    mark();
  }
  void copy_from_host_async(int d, void* dst, const void* src, std::size_t n, stitch::stream_t s) override {
    mark();
    SimBackend::copy_from_host_async(d, dst, src, n, s);
    mark();
  }

 private:
  void mark() {
    const double t = now();
    if (first == 0) first = t;
    last = t;
  }
  double first = 0, last = 0;
};

struct Tag {
  std::shared_ptr<PhaseTimer> sim;
  std::unique_ptr<stitch::Allocator> alloc;
  std::vector<void*> blocks;
  Tag(std::size_t bytes, const std::string& conf) {
    stitch::SimBackend::Options o;
    o.capacity = bytes + GiB;
    sim = std::make_shared<PhaseTimer>(o);
    alloc = std::make_unique<stitch::Allocator>(stitch::Config::parse("backend:sim" + conf), sim);
    stitch::Allocator::Region r(*alloc, "weights", /*backup=*/true);
    for (std::size_t done = 0; done < bytes; done += kBlock) blocks.push_back(alloc->allocate(kBlock));
  }
  ~Tag() {
    for (void* p : blocks) alloc->deallocate(p);
  }
  void write(unsigned char seed) {
    for (std::size_t i = 0; i < blocks.size(); ++i) std::memset(blocks[i], seed + int(i), kBlock);
  }
  bool check(unsigned char seed) const {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const auto* p = static_cast<const unsigned char*>(blocks[i]);
      const unsigned char v = static_cast<unsigned char>(seed + int(i));
      for (std::size_t off = 0; off < kBlock; off += 4096)
        if (p[off] != v || p[off + 4095] != v) return false;
    }
    return true;
  }
  struct Times {
    double sleep, wake, sleep_phase, wake_phase;
  };
  /// Seconds of one sleep and of one wake, whole and their backup phases.
  Times cycle(unsigned char seed) {
    write(seed);
    Times t{};
    sim->reset();
    const double t0 = now();
    alloc->sleep(0, "weights");
    const double t1 = now();
    t.sleep_phase = sim->phase();
    sim->reset();
    alloc->wake(0, "weights");
    const double t2 = now();
    t.wake_phase = sim->phase();
    if (!check(seed)) die("a byte was lost");
    t.sleep = t1 - t0;
    t.wake = t2 - t1;
    return t;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp";
  std::size_t gib = 2;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--gib" && i + 1 < argc) gib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else die("usage: disk_tier_bench [--dir DIR] [--gib N] [--rounds R]");
  }
  if (gib == 0 || gib > 1024 || rounds < 1) die("--gib from 1 to 1024, --rounds >= 1");
  const std::size_t bytes = gib * GiB;
  stitch::SimBackend files;  // Backend's own file calls (the simulator counts them, nothing more)
  bool direct = false;
  std::vector<double> fs_w, fs_r, disk_s, disk_w, disk_sp, disk_wp, host_s, host_w, host_sp, host_wp;
  std::printf("disk tier on the simulated device (CPU only; no GPU): %zu GiB of backups, %s, %d rounds; GiB/s, "
              "whole call (backup phase)\n", gib, dir.c_str(), rounds);
  std::printf("%-5s %9s %9s %19s %19s %19s %19s\n", "round", "fs write", "fs read", "disk sleep", "disk wake",
              "host sleep", "host wake");
  for (int r = 0; r < rounds; ++r) {
    const auto [w, rd] = fs_pass(files, dir, bytes, &direct);
    Tag::Times disk{}, host{};
    {
      Tag t(bytes, ",backup_host_mb:32,backup_dir:" + dir);
      disk = t.cycle(static_cast<unsigned char>(r));
      if (*t.alloc->stat(0, "backup_file_bytes.peak") < static_cast<std::int64_t>(bytes - 2 * MiB))
        die("the backups did not go to the file");
    }
    {
      Tag t(bytes, "");
      host = t.cycle(static_cast<unsigned char>(r + 100));
    }
    fs_w.push_back(gib_per_s(bytes, w));
    fs_r.push_back(gib_per_s(bytes, rd));
    disk_s.push_back(gib_per_s(bytes, disk.sleep));
    disk_w.push_back(gib_per_s(bytes, disk.wake));
    disk_sp.push_back(gib_per_s(bytes, disk.sleep_phase));
    disk_wp.push_back(gib_per_s(bytes, disk.wake_phase));
    host_s.push_back(gib_per_s(bytes, host.sleep));
    host_w.push_back(gib_per_s(bytes, host.wake));
    host_sp.push_back(gib_per_s(bytes, host.sleep_phase));
    host_wp.push_back(gib_per_s(bytes, host.wake_phase));
    std::printf("%-5d %9.2f %9.2f %9.2f (%7.2f) %9.2f (%7.2f) %9.2f (%7.2f) %9.2f (%7.2f)\n", r, fs_w.back(),
                fs_r.back(), disk_s.back(), disk_sp.back(), disk_w.back(), disk_wp.back(), host_s.back(),
                host_sp.back(), host_w.back(), host_wp.back());
  }
  const double sw = median(disk_sp) / median(fs_w), wr = median(disk_wp) / median(fs_r);
  std::printf("files opened %s\n", direct ? "with O_DIRECT" : "buffered (the file system refused O_DIRECT)");
  std::printf("medians, GiB/s: fs write %.2f, read %.2f; disk tier sleep %.2f whole, %.2f its backup phase "
              "(%.2fx the fs write); wake %.2f whole, %.2f its backup phase (%.2fx the fs read); host-only sleep "
              "%.2f whole (%.2f phase), wake %.2f whole (%.2f phase): the disk tier's whole calls at %.2fx and %.2fx "
              "of the host-only ones\n",
              median(fs_w), median(fs_r), median(disk_s), median(disk_sp), sw, median(disk_w), median(disk_wp), wr,
              median(host_s), median(host_sp), median(host_w), median(host_wp), median(disk_s) / median(host_s),
              median(disk_w) / median(host_w));
  std::printf("goal (backup phase at 0.8x the file system's bandwidth or more): sleep %s, wake %s\n",
              sw >= 0.8 ? "met" : "NOT met", wr >= 0.8 ? "met" : "NOT met");
  // A wake can go no faster than the slower of its two halves: the file system's reads, and the
  // simulated device's own copies into its fresh pages (CPU copies and page faults: the
  // host-only wake's backup phase). A GPU's copies run on its copy engine, beside the reads.
  const double wake_bound = std::min(median(fs_r), median(host_wp));
  std::printf("wake against the slower half (the file system's read, or the simulated device's copies into fresh "
              "pages): %.2fx of %.2f GiB/s\n",
              median(disk_wp) / wake_bound, wake_bound);
  return 0;
}

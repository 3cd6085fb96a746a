// tests/cuda/cuda_disk_test.cu — sleep's disk tier (backup_dir, docs/sleep.md) on a real GPU, the
// GPU check's disk step:
//  - WeightsGoToFilesAndComeBackEveryByte: tagged weights (1 GiB by default,
//    STITCH_GPU_DISK_GIB) filled by a kernel, put to sleep with 64 MiB of pinned host memory for
//    backups (backup_host_mb: the staging buffers and a first piece; the rest goes to a file in
//    STITCH_GPU_DISK_DIR, default /tmp), the device's memory really given back; woken, a kernel
//    counts the bytes that differ (none may). The same with the backups in pinned host memory
//    only. Beside them, in the same run, the file system's own sequential write and read of as
//    many bytes in 16 MiB requests from pinned memory, through a file opened as the tier opens
//    its own (Backend::open_file). Prints "RESULT disk {json}" (the GPU check's disk step puts it
//    in its report): sleep and wake in GB/s against the file system's bandwidth (goal: 0.8x or
//    more, reported, never asserted) and against host-only backups.
// Skips without a device, without virtual memory management, or without room on the device or
// the file system. Helpers: cuda_test_util.cuh.
#include <stdlib.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_util.cuh"

namespace {

using namespace stitch_cuda_test;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& under) {
    std::string name = under + "/stitch-gpu-disk-XXXXXX";
    if (::mkdtemp(name.data()) != nullptr) path = name;
  }
  ~TempDir() {
    if (!path.empty()) ::rmdir(path.c_str());  // (empty: the backup files have no name)
  }
};

/// The file system alone: seconds to write `bytes` sequentially from pinned memory, then to read
/// them back, in 16 MiB requests.
bool fs_pass(stitch::Backend& backend, const std::string& dir, std::size_t bytes, double* write_s, double* read_s,
             bool* direct) {
  constexpr std::size_t kRequest = 16 * kMiB;
  const int fd = backend.open_file(0, dir.c_str(), direct);
  if (fd < 0) return false;
  void* buf = nullptr;
  cuda_check(cudaHostAlloc(&buf, kRequest, cudaHostAllocDefault), "cudaHostAlloc");
  std::memset(buf, 0x5a, kRequest);
  bool ok = true;
  for (const bool write : {true, false}) {
    const auto t0 = Clock::now();
    for (std::size_t off = 0; ok && off < bytes; off += kRequest)
      ok = (write ? backend.write_file(0, fd, buf, kRequest, off) : backend.read_file(0, fd, buf, kRequest, off)) ==
           static_cast<std::int64_t>(kRequest);
    *(write ? write_s : read_s) = seconds_since(t0);
  }
  backend.close_file(0, fd);
  (void)cudaFreeHost(buf);
  return ok;
}

TEST(CudaDisk, WeightsGoToFilesAndComeBackEveryByte) {
  REQUIRE_CUDA_DEVICE();
  CUDA_OK(cudaSetDevice(0));
  const char* gib_env = std::getenv("STITCH_GPU_DISK_GIB");
  const std::size_t gib = gib_env != nullptr ? std::strtoull(gib_env, nullptr, 10) : 1;
  const std::size_t bytes = (gib == 0 ? 1 : gib) << 30;
  const char* under = std::getenv("STITCH_GPU_DISK_DIR");
  TempDir dir(under != nullptr && *under != '\0' ? under : "/tmp");
  ASSERT_FALSE(dir.path.empty()) << "cannot make a directory for the backups";
  struct statvfs v {};
  if (::statvfs(dir.path.c_str(), &v) == 0 && static_cast<std::size_t>(v.f_bavail) * v.f_frsize < 2 * bytes + kMiB)
    GTEST_SKIP() << "skipped: " << dir.path << " has too little free space for " << 2 * bytes << " bytes";
  std::size_t free_mem = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_mem, &total));
  if (free_mem < bytes + 512 * kMiB) GTEST_SKIP() << "skipped: the device has " << free_mem << " bytes free";

  Streams st(1);
  cudaStream_t s = st.s[0];
  MismatchCounter counter;
  constexpr std::size_t kBlock = 256 * kMiB;
  stitch::Allocator alloc(stitch::Config::parse("backend:cuda,backup_host_mb:64,backup_dir:" + dir.path));
  if (const std::string why = vmm_missing(alloc); !why.empty()) GTEST_SKIP() << why;
  std::vector<void*> blocks;
  {
    stitch::Allocator::Region weights(alloc, "weights", /*backup=*/true);
    for (std::size_t done = 0; done < bytes; done += kBlock) blocks.push_back(alloc.allocate(kBlock, s, 0));
  }
  struct Times {
    double sleep_s = 0, wake_s = 0;
    std::int64_t in_files = 0;
  };
  auto cycle = [&](std::uint32_t seed, Times* t) {
    for (std::size_t i = 0; i < blocks.size(); ++i) launch_fill(blocks[i], kBlock, seed + std::uint32_t(i), s);
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const std::size_t free_before = settled_free_memory(s, counter);
    auto t0 = Clock::now();
    alloc.sleep(0, "weights");
    t->sleep_s = seconds_since(t0);
    t->in_files = stat(alloc, "backup_file_bytes.current");
    EXPECT_GE(settled_free_memory(s, counter), free_before + bytes - 64 * kMiB) << "the pages went back";
    t0 = Clock::now();
    alloc.wake(0, "weights");
    t->wake_s = seconds_since(t0);
    std::uint64_t bad = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) bad += counter.count(blocks[i], kBlock, seed + std::uint32_t(i), s);
    EXPECT_EQ(bad, 0u) << "bytes that differ after the wake";
  };
  Times disk, host;
  double fs_write = 0, fs_read = 0;
  bool direct = false;
  ASSERT_TRUE(fs_pass(alloc.backend(), dir.path, bytes, &fs_write, &fs_read, &direct)) << "the file system alone";
  cycle(11, &disk);
  EXPECT_GE(disk.in_files, static_cast<std::int64_t>(bytes - 64 * kMiB)) << "the backups went to the file";
  EXPECT_EQ(stat(alloc, "backup_file_bytes.current"), 0);
  alloc.configure("backup_dir:none,backup_host_mb:0");  // host-only, the peer
  cycle(23, &host);
  EXPECT_EQ(host.in_files, 0);
  for (void* p : blocks) alloc.deallocate(p);
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf(
      "RESULT disk {\"bytes\": %zu, \"direct\": %s, \"fs_write_GBps\": %.2f, \"fs_read_GBps\": %.2f, "
      "\"sleep_GBps\": %.2f, \"wake_GBps\": %.2f, \"sleep_vs_fs_write\": %.3f, \"wake_vs_fs_read\": %.3f, "
      "\"host_sleep_GBps\": %.2f, \"host_wake_GBps\": %.2f, \"file_bytes\": %lld}\n",
      bytes, direct ? "true" : "false", gb / fs_write, gb / fs_read, gb / disk.sleep_s, gb / disk.wake_s,
      fs_write / disk.sleep_s, fs_read / disk.wake_s, gb / host.sleep_s, gb / host.wake_s,
      static_cast<long long>(disk.in_files));
}

}  // namespace

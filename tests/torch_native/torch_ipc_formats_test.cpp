// tests/torch_native/torch_ipc_formats_test.cpp — CUDA IPC between libstitch_torch and PyTorch's
// own allocator, both ways, on backend:cuda over the strict fake driver: stitch's shareIpcHandle
// writes PyTorch 2.15's handles ('e' for expandable memory, 'c' for a cudaMalloc'd segment) that
// PyTorch's receiving algorithm maps (tests/torch_native/pytorch_side.c plays PyTorch, in another
// process), and getIpcDevPtr maps handles PyTorch writes ('e' of versions 3 and 2, 'c', also
// opened again before its last close ran). Every exchange checks the bytes on both sides, and the
// driver's contract holds throughout.
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/ipc_handle.hpp"
#include "stitch/stitch.h"
#include "stitch/torch_native.hpp"

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
constexpr std::size_t MiB = std::size_t{1} << 20;

struct TestContext final : stitch::torch_native::DeviceContext {
  int current_device() override { return 0; }
  void* current_stream(int) override { return nullptr; }  // the legacy default stream
};

std::string hex(const std::string& bytes) {
  std::string out;
  char b[3];
  for (unsigned char c : bytes) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}
std::string unhex(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i + 1 < text.size(); i += 2) out += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
  return out;
}

/// pytorch_side run with `args`; its stdin and stdout are pipes.
struct Side {
  pid_t pid = -1;
  FILE* in = nullptr;   // its stdin
  FILE* out = nullptr;  // its stdout
  explicit Side(std::vector<std::string> args) {
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) return;
    pid = fork();
    if (pid == 0) {
      dup2(to[0], 0);
      dup2(from[1], 1);
      close(to[1]);
      close(from[0]);
      std::vector<char*> argv{const_cast<char*>(PYTORCH_SIDE_PATH)};
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(PYTORCH_SIDE_PATH, argv.data());
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    in = fdopen(to[1], "w");
    out = fdopen(from[0], "r");
  }
  int wait() {
    if (in != nullptr) fclose(in);
    if (out != nullptr) fclose(out);
    in = out = nullptr;
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

unsigned long long violations() {
  void* lib = dlopen(std::getenv("STITCH_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
  auto count = lib != nullptr ? reinterpret_cast<unsigned long long (*)()>(dlsym(lib, "stitch_fake_cuda_violations")) : nullptr;
  return count != nullptr ? count() : 0;
}

class TorchIpcFormats : public ::testing::Test {
 protected:
  void SetUp() override {
    alloc_ = stitch::torch_native::make_allocator(std::make_shared<TestContext>());
    alloc_->init(1);
  }
  void TearDown() override {
    stitch::process_allocator().empty_cache(-1);
    EXPECT_EQ(stitch::process_allocator().stats(0).allocated_bytes[0].current, 0) << "a test leaked";
    EXPECT_EQ(violations(), 0u) << "the driver's contract was broken";
  }

  /// Shares `bytes` filled with 94 through PyTorch's receiver, which writes 33; returns the handle.
  std::string share_with_pytorch(std::size_t bytes) {
    c10::DataPtr neighbour = alloc_->allocate(1 * MiB);
    c10::DataPtr block = alloc_->allocate(bytes);
    std::memset(block.get(), 94, bytes);
    const cca::ShareableHandle h = alloc_->shareIpcHandle(block.get());
    Side side({"receive", hex(h.handle), std::to_string(h.offset), std::to_string(bytes), "94", "33"});
    EXPECT_EQ(side.wait(), 0) << "PyTorch's receiver failed";
    auto* p = static_cast<unsigned char*>(block.get());
    EXPECT_EQ(p[0], 33);
    EXPECT_EQ(p[bytes - 1], 33);  // PyTorch's bytes, in stitch's block
    return h.handle;
  }

  /// The handle and block offset PyTorch's side printed (its export); empty when none came.
  static std::pair<std::string, std::size_t> exported(Side& side) {
    char line[16384] = {};
    char text[16384] = {};
    std::size_t offset = 0;
    if (fgets(line, sizeof line, side.out) == nullptr || std::sscanf(line, "%16383s %zu", text, &offset) != 2)
      return {};
    return {unhex(text), offset};
  }

  /// Maps what PyTorch exports (`args`) with getIpcDevPtr, checks its 77s, writes 12.
  void map_from_pytorch(std::vector<std::string> args) {
    Side side(std::move(args));
    const auto [handle, offset] = exported(side);
    ASSERT_FALSE(handle.empty()) << "PyTorch's side exported nothing";
    {
      std::shared_ptr<void> base = alloc_->getIpcDevPtr(handle);
      EXPECT_EQ(alloc_->getIpcDevPtr(handle).get(), base.get());  // one mapping while in use
      auto* p = static_cast<unsigned char*>(base.get()) + offset;
      const std::size_t bytes = 4 * MiB - offset;
      bool all = true;
      for (std::size_t i = 0; i < bytes; ++i) all &= p[i] == 77;
      EXPECT_TRUE(all) << "PyTorch's bytes are not in the mapping";
      std::memset(p, 12, bytes);
    }  // unmapped here
    std::fprintf(side.in, "check 12\n");
    std::fflush(side.in);
    EXPECT_EQ(side.wait(), 0) << "PyTorch's process does not see stitch's writes";
  }

  std::shared_ptr<cca::CUDAAllocator> alloc_;
};

TEST_F(TorchIpcFormats, ExpandableBlockGoesToPyTorchAsTypeE) {
  const std::string h = share_with_pytorch(5 * MiB + 512);
  ASSERT_GE(h.size(), 2u + 32u);
  EXPECT_EQ(h[0], 3);  // SHAREABLE_HANDLE_VERSION
  EXPECT_EQ(h[1], 'e');
  std::int32_t pid = 0, type = 0;
  std::uint64_t segment = 0, count = 0;
  std::memcpy(&pid, h.data() + 2, 4);
  std::memcpy(&segment, h.data() + 2 + 8, 8);
  std::memcpy(&count, h.data() + 2 + 16, 8);
  std::memcpy(&type, h.data() + 2 + 24, 4);
  EXPECT_EQ(pid, getpid());
  EXPECT_EQ(type, 1);  // POSIX_FD
  EXPECT_GE(segment * count, 5 * MiB + 512);
  EXPECT_EQ(h.size(), 2 + 32 + count * 4);
}

TEST_F(TorchIpcFormats, CudaMallocBlockGoesToPyTorchAsTypeC) {
  ASSERT_EQ(stitch_configure("expandable_segments:False"), 0) << stitch_last_error();
  const std::string h = share_with_pytorch(5 * MiB + 512);
  EXPECT_EQ(h.size(), 2u + 64u);
  EXPECT_EQ(h[1], 'c');
  ASSERT_EQ(stitch_configure("expandable_segments:True"), 0) << stitch_last_error();
}

TEST_F(TorchIpcFormats, PyTorchExpandableHandleOfVersion3IsMapped) { map_from_pytorch({"export-e", "3", "77"}); }

TEST_F(TorchIpcFormats, PyTorchExpandableHandleOfVersion2IsMapped) { map_from_pytorch({"export-e", "2", "77"}); }

TEST_F(TorchIpcFormats, PyTorchCudaMallocHandleIsMapped) { map_from_pytorch({"export-c", "77"}); }

TEST_F(TorchIpcFormats, ALegacyHandleOpenedAgainBeforeItsCloseStaysMappedUntilTheLastClose) {
  // The driver maps a legacy handle opened twice at one address and counts the opens. So when
  // getIpcDevPtr's cached mapping has expired but its deleter has not closed it yet, a new
  // getIpcDevPtr of the handle opens it again at the same address: that open needs its own close,
  // and the old deleter's close must not unmap it.
  Side side({"export-c", "77"});
  const auto [handle, offset] = exported(side);
  ASSERT_FALSE(handle.empty()) << "PyTorch's side exported nothing";
  const auto imp = stitch::ipc::parse_torch(handle, 0);
  ASSERT_TRUE(imp.has_value());
  stitch::Allocator& a = stitch::process_allocator();
  const auto calls = [](const char* ep) {
    void* lib = dlopen(std::getenv("STITCH_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
    auto count = lib != nullptr ? reinterpret_cast<unsigned long long (*)(const char*)>(dlsym(lib, "stitch_fake_cuda_calls")) : nullptr;
    return count != nullptr ? count(ep) : 0ull;
  };
  const unsigned long long opens = calls("cuIpcOpenMemHandle"), closes = calls("cuIpcCloseMemHandle");
  // The sequence the race makes, in order: open, open again, the first close, the second.
  auto* first = static_cast<unsigned char*>(a.import_block(imp->text, 0));
  auto* second = static_cast<unsigned char*>(a.import_block(imp->text, 0));
  EXPECT_EQ(first, second) << "the driver maps a legacy handle at one address";
  a.close_block(first);
  EXPECT_EQ(second[offset], 77) << "still mapped for the second open";
  a.close_block(second);
  EXPECT_THROW(a.close_block(second), stitch::invalid_argument) << "every open is closed";
  // Through getIpcDevPtr, from two threads taking and dropping the mapping: every open closed
  // once, and no close fails.
  std::atomic<int> bad{0};
  const std::string shared = handle;
  const std::size_t at = offset;  // (copies: a lambda captures them)
  auto churn = [&] {
    for (int i = 0; i < 300; ++i) {
      std::shared_ptr<void> p = alloc_->getIpcDevPtr(shared);
      if (static_cast<unsigned char*>(p.get())[at] != 77) ++bad;
    }
  };
  std::thread t1(churn), t2(churn);
  t1.join();
  t2.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(calls("cuIpcOpenMemHandle") - opens, calls("cuIpcCloseMemHandle") - closes)
      << "an open of the handle was never closed (or closed twice)";
  std::fprintf(side.in, "check 77\n");
  std::fflush(side.in);
  EXPECT_EQ(side.wait(), 0);
}

TEST_F(TorchIpcFormats, MalformedHandlesFailClearly) {
  EXPECT_THROW((void)alloc_->getIpcDevPtr(std::string("\x03x") + std::string(40, 'a')), c10::Error);
  EXPECT_THROW((void)alloc_->getIpcDevPtr(std::string("\x09" "e")), c10::Error);
  EXPECT_THROW((void)alloc_->getIpcDevPtr(std::string("\x03" "e") + std::string(10, '\0')), c10::Error);
  EXPECT_THROW((void)alloc_->getIpcDevPtr(std::string("\x03" "c") + std::string(63, '\0')), c10::Error);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();  // test discovery: nothing runs
  if (std::getenv("STITCH_CUDA_DRIVER") == nullptr) {
    std::fprintf(stderr, "set STITCH_CUDA_DRIVER to the fake driver (libstitch_fake_cuda.so)\n");
    return 2;
  }
  if (stitch_configure("backend:cuda,expandable_segments:True") != 0) {
    std::fprintf(stderr, "stitch_configure: %s\n", stitch_last_error());
    return 1;
  }
  return RUN_ALL_TESTS();
}

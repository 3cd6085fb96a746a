// The IPC handle parsers (stitch/ipc_handle.hpp) and the importers on the simulated device, with
// hostile handles: what the writers write parses back to the same text; wrapping offsets, sizes
// and pieces, negative and oversized fields, trailing bytes, piece counts the bytes cannot hold,
// pieces past the exporter's memfd, descriptors that are not backend:sim's memory and other back
// ends' text are each refused with a reason, and a refused import maps nothing and leaves no
// descriptor open. (Two processes: tests/ipc/ipc_hostile.c.)
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/ipc_handle.hpp"
#include "stitch/sim_backend.hpp"
#include "support/process_state.hpp"

namespace stitch {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
const std::size_t kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

std::string refusal_of_block(const std::string& text) {
  std::string why;
  EXPECT_FALSE(ipc::parse(text, &why).has_value()) << text;
  EXPECT_FALSE(why.empty()) << text;
  return why;
}

TEST(IpcHandle, WhatFormatWritesParsesBackToTheSameText) {
  for (const ipc::BlockHandle& h : {ipc::BlockHandle{0, 0, 0, "sim:1:3:0+4096"},
                                    ipc::BlockHandle{7, 12345, 678, "cuda-fd:99:2097152/5"},
                                    ipc::BlockHandle{2147483647, SIZE_MAX - 5, 5, "x"}}) {
    const std::string text = ipc::format(h);
    std::string why;
    const auto back = ipc::parse(text, &why);
    ASSERT_TRUE(back.has_value()) << text << ": " << why;
    EXPECT_EQ(ipc::format(*back), text);
  }
}

TEST(IpcHandle, HostileBlockHandlesAreRefusedWithAReason) {
  const std::string tail = ":sim:1:3:0+4096";
  // Offsets and sizes that wrap, negative and oversized devices, signs, spaces, leading zeros.
  EXPECT_NE(refusal_of_block("stitch1:0:18446744073709551615:2" + tail).find("wrap"), std::string::npos);
  EXPECT_NE(refusal_of_block("stitch1:0:2:18446744073709551615" + tail).find("wrap"), std::string::npos);
  refusal_of_block("stitch1:0:18446744073709551616:0" + tail);  // past 2^64
  EXPECT_NE(refusal_of_block("stitch1:-1:0:16" + tail).find("device"), std::string::npos);
  refusal_of_block("stitch1:2147483648:0:16" + tail);  // past INT_MAX
  refusal_of_block("stitch1:+1:0:16" + tail);
  refusal_of_block("stitch1: 1:0:16" + tail);
  refusal_of_block("stitch1:01:0:16" + tail);
  refusal_of_block("stitch1:0:-0:16" + tail);
  refusal_of_block("stitch1:0:0x10:16" + tail);
  refusal_of_block("stitch1:0:0:16:");          // no share
  refusal_of_block("stitch1:0:0:16");           // no share at all
  refusal_of_block(std::string("stitch1:0:0:16:sim:1:3:0+4096\0x", 31));  // a NUL inside
  refusal_of_block("stitch1:0:0:16:sim:1:3:0+4096 ");  // a trailing space
  refusal_of_block("stitch2:0:0:16" + tail);
  refusal_of_block("");
  refusal_of_block("hello");
}

TEST(IpcHandle, SimSharesAreWholePagesThatDoNotWrap) {
  std::string why;
  const auto ok = ipc::decode_sim("sim:12:3:0+8192,16384+4096", 4096, &why);
  ASSERT_TRUE(ok.has_value()) << why;
  EXPECT_EQ(ok->pid, 12);
  EXPECT_EQ(ok->fd, 3);
  EXPECT_EQ(ok->total, 12288u);
  EXPECT_EQ(ipc::encode_sim(*ok), "sim:12:3:0+8192,16384+4096");
  for (const char* bad : {
           "sim:12:3:0+8192,0+18446744073709547520",    // lengths that wrap (the issue's)
           "sim:12:3:18446744073709547520+8192",         // an end that wraps
           "sim:12:3:0+4096,",                           // a trailing comma
           "sim:12:3:,0+4096",                           // an empty piece
           "sim:12:3:0+4096,,4096+4096",                 // two commas
           "sim:12:3:",                                  // no piece
           "sim:12:3:0+0",                               // an empty piece
           "sim:12:3:100+4096",                          // not page aligned
           "sim:12:3:0+100",                             // not whole pages
           "sim:0:3:0+4096",                             // pid 0
           "sim:-1:3:0+4096",                            // a negative pid
           "sim:2147483648:3:0+4096",                    // past pid_t
           "sim:12:-3:0+4096",                           // a negative descriptor
           "sim:12:2147483648:0+4096",                   // past int
           "sim:12:3:0+4096x",                           // trailing bytes
           "sim:12:3:0-4096",                            // no '+'
           "cuda-fd:12:4096/3",                          // another back end's text
       }) {
    why.clear();
    EXPECT_FALSE(ipc::decode_sim(bad, 4096, &why).has_value()) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  // The sum of the pieces wraps while each piece alone does not.
  const std::string half = std::to_string((SIZE_MAX / 2 + 1) / 4096 * 4096);
  EXPECT_FALSE(ipc::decode_sim("sim:1:3:0+" + half + ",0+" + half + ",0+" + half, 4096, &why).has_value());
  EXPECT_NE(why.find("wrap"), std::string::npos) << why;
}

TEST(IpcHandle, CudaSharesAreCheckedFieldByField) {
  const std::string hex(128, 'a');
  std::string why;
  for (const std::string& good : {"cuda-ipc:0:" + hex, "cuda-ipc:2097152:" + hex, std::string("cuda-fd:7:2097152/5,4194304/6"),
                                  "cuda-fabric:2097152/" + hex + ",2097152/" + hex}) {
    const auto s = ipc::decode_cuda(good, &why);
    ASSERT_TRUE(s.has_value()) << good << ": " << why;
    EXPECT_EQ(ipc::encode(*s), good);
  }
  for (const std::string& bad : {
           "cuda-ipc:0:" + hex.substr(1),                    // 127 digits
           "cuda-ipc:0:" + hex + "0",                        // 129 digits: trailing
           "cuda-ipc:0:" + std::string(128, 'A'),            // upper case is not what to_hex writes
           "cuda-ipc:-1:" + hex,                             // a negative size
           std::string("cuda-fd:0:2097152/5"),               // pid 0
           std::string("cuda-fd:-7:2097152/5"),              // a negative pid
           std::string("cuda-fd:7:2097152/-5"),              // a negative descriptor
           std::string("cuda-fd:7:2097152/5,"),              // a trailing comma
           std::string("cuda-fd:7:"),                        // no piece
           std::string("cuda-fd:7:0/5"),                     // an empty piece
           std::string("cuda-fd:7:18446744073709551615/5,2097152/6"),  // a sum that wraps
           std::string("cuda-fd:7:2097152/5x"),              // trailing bytes
           "cuda-fabric:2097152/" + hex.substr(2),           // a short fabric handle
           std::string("sim:1:3:0+4096"),                    // another back end's text
       }) {
    why.clear();
    EXPECT_FALSE(ipc::decode_cuda(bad, &why).has_value()) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
}

/// PyTorch's 'e' handle: version, type, header, then `n` descriptors (or raw `extra` bytes).
std::string torch_e(std::int32_t pid, std::uint64_t segment, std::uint64_t handles, std::int32_t type,
                    const std::vector<std::int32_t>& fds, int version = 3) {
  std::string out{static_cast<char>(version), 'e'};
  ipc::torch::ShareHeader h{pid, segment, handles, type};
  out.append(reinterpret_cast<const char*>(&h), version >= 3 ? sizeof h : ipc::torch::kHeaderV2);
  for (std::int32_t fd : fds) ipc::torch::put(out, fd);
  return out;
}

TEST(IpcHandle, TorchHandlesRoundTripAndHostileOnesAreRefused) {
  std::string why;
  // What torch_handle writes for each kind parses back to an equivalent import.
  const std::string fd_text = ipc::format({0, 0, 0, "cuda-fd:77:2097152/5,2097152/6"});
  const auto e = ipc::parse_torch(ipc::torch_handle(fd_text), 0, &why);
  ASSERT_TRUE(e.has_value()) << why;
  EXPECT_EQ(e->text, fd_text);
  const std::string sim_text = ipc::format({0, 4096, 100, "sim:1:3:0+8192"});
  const auto st = ipc::parse_torch(ipc::torch_handle(sim_text), 0, &why);
  ASSERT_TRUE(st.has_value()) << why;
  EXPECT_EQ(st->text, sim_text);
  EXPECT_EQ(st->block_offset, 4096u);
  const std::string legacy = ipc::format({0, 0, 0, "cuda-ipc:0:" + std::string(128, '0')});
  ASSERT_TRUE(ipc::parse_torch(ipc::torch_handle(legacy), 0, &why).has_value()) << why;
  ASSERT_TRUE(ipc::parse_torch(torch_e(77, 2 * MiB, 2, 1, {5, 6}, 2), 0, &why).has_value()) << why;

  auto refused = [&](const std::string& handle, const char* what) {
    why.clear();
    EXPECT_FALSE(ipc::parse_torch(handle, 0, &why).has_value()) << what;
    EXPECT_FALSE(why.empty()) << what;
  };
  // The issue's: 2^62 descriptors claimed by a 34-byte handle (num_handles * 4 wraps to 0).
  refused(torch_e(77, 2 * MiB, std::uint64_t{1} << 62, 1, {}), "a count whose product wraps");
  refused(torch_e(77, 2 * MiB, (std::uint64_t{1} << 62) + 1, 1, {5}), "a count whose product wraps to the bytes");
  refused(torch_e(77, 2 * MiB, 3, 1, {5, 6}), "more handles than bytes");
  refused(torch_e(77, 2 * MiB, 1, 1, {5, 6}), "bytes trail the handles");
  refused(torch_e(77, 2 * MiB, 0, 1, {}), "no handles");
  refused(torch_e(77, 0, 1, 1, {5}), "an empty segment");
  refused(torch_e(77, UINT64_MAX / 2 + 1, 2, 1, {5, 6}), "a segment size times the count wraps");
  refused(torch_e(-1, 2 * MiB, 1, 1, {5}), "a negative pid");
  refused(torch_e(0, 2 * MiB, 1, 1, {5}), "pid 0");
  refused(torch_e(77, 2 * MiB, 1, 1, {-5}), "a negative descriptor");
  refused(torch_e(77, 2 * MiB, 1, 3, {5}), "an unknown handle type");
  refused(torch_e(77, 2 * MiB, 1, 1, {5}).substr(0, 20), "a cut header");
  refused(std::string("\x03" "c") + std::string(63, 'x'), "a short 'c'");
  refused(std::string("\x03" "c") + std::string(65, 'x'), "a long 'c'");
  refused(std::string("\x03" "s") + "stitch1:0:18446744073709551615:2:sim:1:3:0+4096", "'s' with a wrapping offset");
  refused(std::string("\x03" "x") + "abc", "an unknown type");
  refused(std::string("\x04" "e"), "an unknown version");
  refused(std::string("\x00" "e", 2), "version 0");
  refused("", "empty");
  why.clear();
  EXPECT_FALSE(ipc::parse_torch(ipc::torch_handle(fd_text), -1, &why).has_value());
  EXPECT_NE(why.find("negative"), std::string::npos) << why;
}

// ---- the importers on the simulated device ----------------------------------------------------------

using test::mappings;
using test::open_descriptors;

class IpcImport : public ::testing::Test {
 protected:
  void SetUp() override {
    SimBackend::Options o;
    o.capacity = 64 * MiB;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse("backend:sim,expandable_segments:True"), sim);
    block = alloc->allocate(3 * MiB);
    std::memset(block, 0x5A, 3 * MiB);
    handle = alloc->export_block(block);
    const auto h = ipc::parse(handle);
    ASSERT_TRUE(h.has_value());
    const auto s = ipc::decode_sim(h->share, kPage);
    ASSERT_TRUE(s.has_value());
    share = *s;
  }
  void TearDown() override { alloc->deallocate(block); }
  /// Imports `text`, expecting an error that mentions `says`; nothing mapped or opened.
  void refused(const std::string& text, const char* says) {
    const std::size_t fds = open_descriptors(), maps = mappings();
    try {
      void* p = alloc->import_block(text, 0);
      ADD_FAILURE() << "imported " << text << " at " << p;
      alloc->close_block(p);
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << text << "\n" << e.what();
    }
    EXPECT_EQ(open_descriptors(), fds) << "a refused import left a descriptor open: " << text;
    EXPECT_EQ(mappings(), maps) << "a refused import left a mapping: " << text;
  }
  std::string with_share(const ipc::SimShare& s, std::size_t offset = 0, std::size_t size = 0) const {
    return ipc::format({0, offset, size, ipc::encode_sim(s)});
  }
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
  void* block = nullptr;
  std::string handle;
  ipc::SimShare share;
};

TEST_F(IpcImport, TheTrueHandleMapsTheSameBytes) {
  auto* p = static_cast<unsigned char*>(alloc->import_block(handle, 0));
  ASSERT_NE(p, nullptr);
  EXPECT_NE(p, block);
  EXPECT_EQ(p[0], 0x5A);
  EXPECT_EQ(p[3 * MiB - 1], 0x5A);
  p[5] = 1;
  EXPECT_EQ(static_cast<unsigned char*>(block)[5], 1);
  alloc->close_block(p);
}

TEST_F(IpcImport, HostileHandlesAreRefusedAndLeaveNothingBehind) {
  // The block outside the mapping, by wrapping and by plain excess.
  refused(with_share(share, SIZE_MAX, 2), "wrap");
  refused(with_share(share, share.total, 1), "outside");
  refused(with_share(share, 0, share.total + 1), "outside");
  refused(with_share(share, share.total - kPage, 2 * kPage), "outside");
  // Pieces past the end of the exporter's memfd (a SIGBUS at the first touch otherwise).
  ipc::SimShare past = share;
  past.pieces.back().offset = std::size_t{1} << 40;
  refused(with_share(past), "runs past the exporter's device memory");
  past = share;
  past.pieces.push_back({share.pieces.back().offset, std::size_t{1} << 40});
  refused(with_share(past), "runs past");
  // Descriptors that are not backend:sim's device memory: stdin, a regular file, none at all.
  ipc::SimShare other = share;
  other.fd = 0;
  refused(with_share(other), "is not backend:sim's device memory");
  FILE* file = std::tmpfile();  // a regular file, as large as the pieces
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(::ftruncate(::fileno(file), static_cast<off_t>(64 * MiB)), 0);
  other.fd = ::fileno(file);
  refused(with_share(other), "is not backend:sim's device memory");
  std::fclose(file);
  const int memfd = ::memfd_create("not-stitch", MFD_CLOEXEC);  // a memfd of someone else's
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::ftruncate(memfd, static_cast<off_t>(64 * MiB)), 0);
  other.fd = memfd;
  refused(with_share(other), "is not backend:sim's device memory");
  ::close(memfd);
  other.fd = 1000000;
  refused(with_share(other), "no such descriptor");
  other = share;
  other.pid = 2147483646;  // no such process
  refused(with_share(other), "exporting process ended");
  // Malformed text, other back ends' text, a negative device.
  refused("stitch1:0:0:16:sim:1:3:0+8192,0+18446744073709547520", "wrap");
  refused("stitch1:0:0:16:cuda-fd:1:2097152/3", "not a handle of backend:sim");
  refused("stitch1:-1:0:16:" + ipc::encode_sim(share), "device");
  refused(std::string("\x03" "e garbage"), "not a handle stitch_ipc_export wrote");
  EXPECT_THROW((void)alloc->import_block(handle, -1), invalid_argument);
  EXPECT_THROW((void)alloc->import_block(handle, 1), invalid_argument);
  // And the true handle still maps.
  void* p = alloc->import_block(handle, 0);
  EXPECT_EQ(static_cast<unsigned char*>(p)[100], 0x5A);
  alloc->close_block(p);
}

TEST_F(IpcImport, TheSizeQueryPinsAndExportsNothing) {
  void* other = alloc->allocate(MiB);
  const std::size_t need = alloc->export_size(other);
  EXPECT_GT(need, 0u);
  // Not pinned: the block's tag may sleep (an exported block refuses that).
  alloc->deallocate(other);
  {
    Allocator::Region r(*alloc, "q");
    other = alloc->allocate(MiB);
  }
  (void)alloc->export_size(other);
  EXPECT_NO_THROW(alloc->sleep(0, "q")) << "the size query pinned the block";
  alloc->wake(0, "q");
  // A handle that would not fit is refused before the pin, too.
  EXPECT_THROW((void)alloc->export_block(other, 8), invalid_argument);
  EXPECT_NO_THROW(alloc->sleep(0, "q")) << "a refused export pinned the block";
  alloc->wake(0, "q");
  const std::string text = alloc->export_block(other, need + 1);
  EXPECT_LE(text.size(), need);
  EXPECT_THROW(alloc->sleep(0, "q"), error) << "an exported block is pinned";
  alloc->deallocate(other);
}

}  // namespace
}  // namespace stitch

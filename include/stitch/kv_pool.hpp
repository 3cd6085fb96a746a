// stitch/kv_pool.hpp — an elastic paged KV cache on stitch's pages (docs/kv.md): `buffers`
// virtual ranges (K and V of every layer) of max_blocks * block_bytes each, with physical pages
// mapped only under the blocks in use, drawn from the same device budget as the caching
// allocator's memory. Block i lives at buffer(b) + i * block_bytes in every buffer b.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/export.hpp"

namespace stitch {

class STITCH_EXPORT KvPool {
 public:
  /// A pool on `device` of `allocator`, its memory tagged `tag` ("kv" when empty): the tag sleeps
  /// and wakes with Allocator::sleep / wake. `flags`: Allocator::kRegionBackup keeps live blocks
  /// over a sleep. Throws invalid_argument for bad sizes, backend_error where the device has no
  /// virtual-memory API.
  KvPool(Allocator& allocator, int device, int buffers, std::size_t block_bytes, std::size_t max_blocks,
         std::string_view tag = "kv", unsigned flags = 0);
  /// Destroys the pool if it has no live block (else it stays until the allocator goes).
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  /// Base address of buffer `buffer`.
  [[nodiscard]] void* buffer(int buffer) const;
  /// `n` block ids, lowest free first, into `ids`; maps the pages they need (no sync). All or
  /// nothing: out_of_memory for the limit or the device (after the out-of-memory ladder),
  /// stitch::error while the tag is asleep.
  void alloc(std::size_t n, std::int64_t* ids);
  [[nodiscard]] std::vector<std::int64_t> alloc(std::size_t n);
  /// Frees `n` ids: never waits, never unmaps. invalid_argument (nothing freed) for a bad id.
  void free(const std::int64_t* ids, std::size_t n);
  /// Bytes of pages under live blocks it may hold (0: no limit).
  void set_limit(std::size_t bytes);
  /// Blocks allocatable now, within the limit and the device's room.
  [[nodiscard]] std::size_t available() const;
  /// Unmaps every page without a live block (after one device synchronization).
  void trim();
  /// Unmaps everything and releases the ranges; invalid_argument while blocks are live.
  void destroy();

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] int buffers() const noexcept { return buffers_; }
  [[nodiscard]] std::size_t block_bytes() const noexcept { return block_bytes_; }
  [[nodiscard]] std::size_t max_blocks() const noexcept { return max_blocks_; }
  [[nodiscard]] int id() const noexcept { return id_; }

 private:
  Allocator& allocator_;
  int device_;
  int id_ = 0;
  int buffers_;
  std::size_t block_bytes_;
  std::size_t max_blocks_;
  bool destroyed_ = false;
};

}  // namespace stitch

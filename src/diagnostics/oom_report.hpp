// diagnostics/oom_report.hpp — the out-of-memory message: PyTorch's first line, then stitch's
// verdict on why the request failed and what would help.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stitch::detail {

/// A live allocation named in the report.
struct LiveBlockFact {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  std::vector<std::string> frames;  ///< from the recorder, when stacks were recorded
};

/// What the allocator knew when a request failed (after its whole retry ladder).
struct OomFacts {
  int device = 0;
  std::size_t requested = 0;       ///< bytes the caller asked for
  std::size_t rounded = 0;         ///< after rounding: what a free block would need to hold
  std::size_t alloc_size = 0;      ///< bytes the allocator tried to get from the device
  bool device_info_known = true;
  std::size_t device_total = 0;
  std::size_t device_free = 0;
  std::optional<std::size_t> allowed;  ///< memory-fraction cap, if any
  std::size_t reserved = 0;        ///< held by this allocator
  std::size_t allocated = 0;       ///< handed out by this allocator
  std::size_t largest_free_block = 0;  ///< over every stream and pool
  bool expandable = false;         ///< expandable segments already on

  // Free cached memory, where it is.
  std::size_t free_same = 0;           ///< on the request's stream and pool
  std::size_t free_blocks_same = 0;    ///< how many blocks that is
  std::size_t largest_free_same = 0;
  std::size_t free_other_streams = 0;  ///< same pool, other streams
  std::size_t free_other_pool = 0;     ///< the other pool (small vs large), any stream
  /// Free blocks on the request's stream and pool by size: < 1 MiB, 1-10 MiB, 10-100 MiB,
  /// >= 100 MiB; each (count, bytes).
  std::array<std::pair<std::size_t, std::size_t>, 4> scatter{};
  std::vector<LiveBlockFact> largest_live;  ///< the biggest live blocks, largest first
  // Spill (docs/spill.md): the setting, and what could move to host pages now.
  int spill = 0;                    ///< 0 off, 1 tags, 2 all
  std::size_t spilled = 0;          ///< host pages mapped now
  std::size_t spillable_tags = 0;   ///< live memory of spillable tags that could move
  std::size_t spillable_all = 0;    ///< that and untagged live memory that could move
  std::size_t live_on_host = 0;     ///< bytes of live blocks on host pages (part of `allocated`)
  std::size_t asleep = 0;           ///< bytes of live blocks asleep (part of `allocated`)
  std::size_t kv = 0;               ///< KV pools' pages (part of `reserved`, not of `allocated`)
};

/// The live memory on the device: allocations less their bytes on host pages and asleep, plus
/// the pages KV pools hold (what a request cannot take, whatever the allocator's layout).
inline std::size_t device_live(const OomFacts& f) noexcept {
  return f.allocated - std::min(f.allocated, f.live_on_host + f.asleep) + f.kv;
}

/// Why a request failed.
enum class OomVerdict {
  too_much_live_data,  ///< (a) live data plus the request exceed what the device allows
  fragmentation,       ///< (b) enough is free on this stream and pool, but not in one piece
  held_elsewhere,      ///< (c) the memory is cached on other streams/pools or used by others
  device_full          ///< none of the above: the device simply has no room left
};

const char* to_string(OomVerdict verdict) noexcept;

/// "1.50 GiB", "512 bytes": PyTorch's format_size.
std::string format_size(std::size_t bytes);

/// Decides which case a failure is.
OomVerdict classify_oom(const OomFacts& facts);

/// What this allocator may hold in total: the device's total minus what other users hold
/// (stored in `others`), capped by the memory fraction. Needs device_info_known.
std::size_t usable_bytes(const OomFacts& facts, std::size_t* others);

/// Whether an OOM with these facts gets a what-if check (replay/what_if.hpp): `enabled`
/// (oom_what_if), the device's memory known, and the request not provably too big for any
/// configuration (live data plus the request within what the allocator may use).
bool what_if_wanted(const OomFacts& facts, bool enabled);

/// The request can be served by no configuration: what is live plus the request already exceed
/// what this allocator may use.
bool provably_too_big(const OomFacts& facts);

/// Requests from this size on are reported as "more than 1EB" and never checked.
inline constexpr std::size_t kAbsurdRequest = std::size_t{1} << 60;

/// The full report: PyTorch's first line, then the verdict with its evidence, the what-if
/// paragraph `what_if` (replay/what_if.hpp; "" for none), and the largest live blocks.
std::string format_oom(const OomFacts& facts, const std::string& what_if = {});

}  // namespace stitch::detail

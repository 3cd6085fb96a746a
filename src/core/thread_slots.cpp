// core/thread_slots.cpp — the registry of a device's thread slots and each thread's lookup of
// its own.
#include "core/thread_slots.hpp"

#include "core/region_stack.hpp"

#include <utility>

namespace stitch::detail {
namespace {

std::atomic<std::uint64_t> g_next_id{1};

/// The slots this thread holds, one per device it freed memory on (kept alive here and in the
/// device's registry: whichever goes last frees the slot).
struct Held {
  std::vector<std::pair<std::uint64_t, std::shared_ptr<ThreadSlot>>> slots;
  /// The thread ends: its extents are anyone's to settle now (ImmediateReuse::settle_parked_on).
  ~Held() {
    for (auto& [owner, slot] : slots) slot->orphaned.store(true, std::memory_order_release);
  }
};
thread_local Held t_held;

}  // namespace

thread_local ThreadSlots::Cached ThreadSlots::cached_ __attribute__((tls_model("initial-exec")));

ThreadSlots::ThreadSlots() : id_(g_next_id.fetch_add(1, std::memory_order_relaxed)) {}

ThreadSlot* ThreadSlots::find_mine() const noexcept {
  // While a region is open the thread takes the locked path (which routes tagged requests), and
  // its cache stays empty (begin_region emptied it), so that the cache hit never reads regions.
  if (t_open_regions != 0) return nullptr;
  for (const auto& [owner, slot] : t_held.slots) {
    if (owner == id_) {
      cached_ = Cached{id_, slot.get()};
      return slot.get();
    }
  }
  return nullptr;
}

ThreadSlot* ThreadSlots::mine_or_create() {
  if (ThreadSlot* s = mine()) return s;
  // Forget the slots of threads that ended (empty, held by the registry alone) and this
  // thread's slots of devices that are gone (held by the thread alone).
  std::erase_if(slots_, [](const std::shared_ptr<ThreadSlot>& s) {
    return s.use_count() == 1 && !s->holds();
  });
  std::erase_if(t_held.slots, [](const auto& held) { return held.second.use_count() == 1; });
  auto slot = std::make_shared<ThreadSlot>();
  slots_.reserve(slots_.size() + 1);
  t_held.slots.reserve(t_held.slots.size() + 1);  // both reserved: the pushes cannot throw
  slots_.push_back(slot);
  t_held.slots.emplace_back(id_, slot);
  cached_ = Cached{id_, slot.get()};
  return slot.get();
}

}  // namespace stitch::detail

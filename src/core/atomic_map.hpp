// core/atomic_map.hpp — a hash map from a pointer-sized key to a pointer, read without any lock
// while writers that hold other locks change it: the device's live table (block address ->
// Block) and its stream table (stream -> StreamShard).
//
// Open addressing with linear probing. A key, once in a slot, stays there until a rebuild: erasing
// only clears the value (the key lies dormant), and entering a key again finds its dormant slot
// and writes the value, with no read-modify-write. Only a key's owner writes its slot (the lock of
// the key's stream shard guards it: a block address belongs to one segment, and a segment changes
// owner only under the device lock), so writers that hold different locks (two streams' shards)
// change the map at once and never move another's entry; only a key's first slot is claimed, by
// compare-and-swap on an empty one. find() takes no lock: it sees every entry published before it
// was called (by the happens-before of the caller's own synchronisation), and, while a rebuild
// moves entries, may miss one or return another key's value, so a caller that acts on a result
// checks it under the lock that owns it (and asks again under the device lock before it
// concludes a key is absent). Only rebuild() moves entries and drops dormant keys, and only under
// the device lock with every writer excluded: in place, or into a larger array, the old one kept
// until the map goes (readers may still be in it; the arrays only double, so all of them together
// are under twice the newest).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace stitch::detail {

/// One entry of an AtomicMap<V>.
template <typename V>
struct AtomicSlot {
  std::atomic<std::uintptr_t> key{~std::uintptr_t{0}};
  std::atomic<V*> value{nullptr};
};

template <typename V>
class AtomicMap {
 public:
  using Key = std::uintptr_t;
  /// A slot no key has used since the last rebuild (probes stop here).
  static constexpr Key kEmpty = ~Key{0};
  /// A claim looks at most this many slots from a key's home; a probe of more than a quarter of
  /// it marks the map crowded (the owner rebuilds it at its next chance).
  static constexpr std::size_t kProbeLimit = 64;

  using Slot = AtomicSlot<V>;
  /// Told where a value now lies, for a caller that keeps its slot (a rebuild moves entries).
  using Placed = void (*)(V* value, Slot* slot) noexcept;

  explicit AtomicMap(std::size_t capacity, Placed placed = nullptr) : placed_(placed) {
    arrays_.push_back(make_array(capacity));
    current_ = arrays_.back().get();
  }
  AtomicMap(const AtomicMap&) = delete;
  AtomicMap& operator=(const AtomicMap&) = delete;

  static Key key_of(const void* p) noexcept { return reinterpret_cast<Key>(p); }

  /// The value of `key`, or nullptr (absent, or erased). No lock; see the top of the file for
  /// what a result means.
  [[nodiscard, gnu::always_inline]] V* find(Key key) const noexcept {
    const Array* a = current_.load(std::memory_order_acquire);
    const std::size_t mask = a->mask;
    for (std::size_t i = home(*a, key), n = 0; n <= mask; i = (i + 1) & mask, ++n) {
      const Key k = a->slots[i].key.load(std::memory_order_acquire);
      if (k == key) return a->slots[i].value.load(std::memory_order_acquire);
      if (k == kEmpty) return nullptr;
    }
    return nullptr;
  }

  /// The slot of `key` (absent or erased; the caller holds the lock that owns it): its dormant
  /// slot, or an empty one claimed for it. nullptr when neither lies within kProbeLimit of its
  /// home (the map is crowded: nothing changed). The value is set by publish().
  Slot* claim(Key key) noexcept {
    Array* a = current_.load(std::memory_order_acquire);
    const std::size_t mask = a->mask;
    for (std::size_t i = home(*a, key), n = 0; n < kProbeLimit && n <= mask; i = (i + 1) & mask, ++n) {
      Key k = a->slots[i].key.load(std::memory_order_relaxed);
      if (k == key) return &a->slots[i];  // dormant: its own slot, no other writer
      if (k == kEmpty) {
        if (a->slots[i].key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
          if (n > kProbeLimit / 4) crowded_.store(true, std::memory_order_relaxed);
          return &a->slots[i];
        }
        if (k == key) return &a->slots[i];  // (cannot happen: the key is the caller's)
      }
    }
    crowded_.store(true, std::memory_order_relaxed);
    return nullptr;
  }
  /// claim() with every writer excluded: the map is rebuilt, larger if need be, until there is
  /// room. Throws std::bad_alloc with nothing changed.
  Slot* claim_excluding_writers(Key key) {
    Slot* slot = claim(key);
    for (bool grow = false; slot == nullptr; grow = true) {
      rebuild(grow);
      slot = claim(key);
    }
    return slot;
  }
  /// Sets the value of a claimed slot (nullptr: erased, its key dormant). The caller holds the
  /// lock that owns the key.
  static void publish(Slot* slot, V* value) noexcept {
    slot->value.store(value, std::memory_order_release);
  }
  /// Erases `key` (the caller holds the lock that owns it): its slot stays, dormant. False if it
  /// is absent.
  bool erase(Key key) noexcept {
    Array* a = current_.load(std::memory_order_acquire);
    const std::size_t mask = a->mask;
    for (std::size_t i = home(*a, key), n = 0; n <= mask; i = (i + 1) & mask, ++n) {
      const Key k = a->slots[i].key.load(std::memory_order_relaxed);
      if (k == key) {
        const bool live = a->slots[i].value.load(std::memory_order_relaxed) != nullptr;
        a->slots[i].value.store(nullptr, std::memory_order_release);
        return live;
      }
      if (k == kEmpty) return false;
    }
    return false;
  }

  /// Whether a claim probed far (or failed): rebuild() at the next chance.
  [[nodiscard]] bool crowded() const noexcept { return crowded_.load(std::memory_order_relaxed); }

  /// Rebuilds the map without dormant keys, with room for four times its entries (`grow`: at least
  /// twice its size): in place, or in a larger array. Only with every writer excluded. Throws
  /// std::bad_alloc with nothing changed.
  void rebuild(bool grow = false) {
    Array* a = current_.load(std::memory_order_relaxed);
    std::vector<std::pair<Key, V*>> entries;
    entries.reserve(count());
    for_each([&](Key k, V* v) { entries.emplace_back(k, v); });
    std::size_t capacity = (a->mask + 1) * (grow ? 2 : 1);
    while (capacity < 4 * entries.size()) capacity *= 2;
    if (capacity > a->mask + 1) {
      arrays_.reserve(arrays_.size() + 1);
      std::unique_ptr<Array> bigger = make_array(capacity);
      for (const auto& [k, v] : entries) place(*bigger, k, v, placed_);
      arrays_.push_back(std::move(bigger));
      current_.store(arrays_.back().get(), std::memory_order_release);
    } else {
      for (std::size_t i = 0; i <= a->mask; ++i) {
        a->slots[i].key.store(kEmpty, std::memory_order_relaxed);
        a->slots[i].value.store(nullptr, std::memory_order_relaxed);
      }
      for (const auto& [k, v] : entries) place(*a, k, v, placed_);
    }
    crowded_.store(false, std::memory_order_relaxed);
  }

  /// The number of entries, dormant keys aside (with every writer excluded).
  [[nodiscard]] std::size_t count() const noexcept {
    std::size_t n = 0;
    for_each([&](Key, V*) { ++n; });
    return n;
  }
  /// Calls fn(key, value) for every entry, dormant keys aside (with every writer excluded).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    const Array* a = current_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i <= a->mask; ++i) {
      const Key k = a->slots[i].key.load(std::memory_order_relaxed);
      V* v = a->slots[i].value.load(std::memory_order_relaxed);
      if (k != kEmpty && v != nullptr) fn(k, v);
    }
  }

 private:
  struct Array {
    std::size_t mask;    ///< capacity - 1 (a power of two)
    unsigned shift;      ///< 64 - log2(capacity): home() keeps the product's top bits
    std::unique_ptr<Slot[]> slots;
  };

  static std::unique_ptr<Array> make_array(std::size_t capacity) {
    capacity = std::bit_ceil(std::max<std::size_t>(capacity, 2));  // (a shift below 64)
    auto a = std::make_unique<Array>();
    a->mask = capacity - 1;
    a->shift = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    a->slots = std::make_unique<Slot[]>(capacity);
    return a;
  }
  /// The slot `key` is looked for from (Fibonacci hashing: the product's top bits depend on every
  /// bit of the key, so block addresses, 512-byte aligned and near each other, spread out).
  static std::size_t home(const Array& a, Key key) noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> a.shift);
  }
  /// Enters (k, v) in the first empty slot from k's home (no writer runs): value, then key.
  static void place(Array& a, Key k, V* v, Placed placed) noexcept {
    std::size_t i = home(a, k);
    while (a.slots[i].key.load(std::memory_order_relaxed) != kEmpty) i = (i + 1) & a.mask;
    a.slots[i].value.store(v, std::memory_order_relaxed);
    a.slots[i].key.store(k, std::memory_order_release);
    if (placed != nullptr) placed(v, &a.slots[i]);
  }

  const Placed placed_;
  std::atomic<Array*> current_{nullptr};
  std::atomic<bool> crowded_{false};
  std::vector<std::unique_ptr<Array>> arrays_;  ///< the current one last; older ones stay readable
};

}  // namespace stitch::detail

// core/atomic_map.hpp — a hash map from a pointer-sized key to a pointer, read without any lock
// while writers that hold other locks change it: the device's live table (block address ->
// Block) and its stream table (stream -> StreamShard).
//
// Open addressing with linear probing. A writer claims a slot by compare-and-swap on its key and
// publishes the value after; it erases by writing a tombstone, so a writer never moves another
// writer's entry and writers that hold different locks (two streams' shards) can change the map
// at once. find() takes no lock: it sees every entry published before it was called (by the
// happens-before of the caller's own synchronisation), and, while a rebuild moves entries, may
// miss one or return another key's value, so a caller that acts on a result checks it under the
// lock that owns it (and asks again under the device lock before it concludes a key is absent).
// Only rebuild() moves entries, and only under the device lock with every writer excluded: in
// place, or into a larger array, the old one kept until the map goes (readers may still be in it;
// the arrays only double, so all of them together are under twice the newest).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace stitch::detail {

template <typename V>
class AtomicMap {
 public:
  using Key = std::uintptr_t;
  /// A slot no key ever used (probes stop here) and a slot whose key was erased.
  static constexpr Key kEmpty = ~Key{0};
  static constexpr Key kErased = ~Key{0} - 1;
  /// A claim looks at most this many slots from a key's home; a probe of more than a quarter of
  /// it marks the map crowded (the owner rebuilds it at its next chance).
  static constexpr std::size_t kProbeLimit = 64;

  struct Slot {
    std::atomic<Key> key{kEmpty};
    std::atomic<V*> value{nullptr};
  };

  explicit AtomicMap(std::size_t capacity) { arrays_.push_back(make_array(capacity)); current_ = arrays_.back().get(); }
  AtomicMap(const AtomicMap&) = delete;
  AtomicMap& operator=(const AtomicMap&) = delete;

  static Key key_of(const void* p) noexcept { return reinterpret_cast<Key>(p); }

  /// The value of `key`, or nullptr. No lock; see the top of the file for what a result means.
  [[nodiscard]] V* find(Key key) const noexcept {
    const Array* a = current_.load(std::memory_order_acquire);
    const std::size_t mask = a->mask;
    for (std::size_t i = home(key) & mask, n = 0; n <= mask; i = (i + 1) & mask, ++n) {
      const Key k = a->slots[i].key.load(std::memory_order_acquire);
      if (k == key) return a->slots[i].value.load(std::memory_order_acquire);
      if (k == kEmpty) return nullptr;
    }
    return nullptr;
  }

  /// Claims a slot for `key` (absent; the caller holds the lock that owns it) and returns it, or
  /// nullptr when no slot within kProbeLimit of its home is free (the map is crowded: nothing
  /// changed). The value is set by publish().
  Slot* claim(Key key) noexcept {
    Array* a = current_.load(std::memory_order_acquire);
    const std::size_t mask = a->mask;
    for (std::size_t i = home(key) & mask, n = 0; n < kProbeLimit && n <= mask; i = (i + 1) & mask, ++n) {
      Key k = a->slots[i].key.load(std::memory_order_relaxed);
      if ((k == kEmpty || k == kErased) &&
          a->slots[i].key.compare_exchange_strong(k, key, std::memory_order_acq_rel)) {
        if (n > kProbeLimit / 4) crowded_.store(true, std::memory_order_relaxed);
        return &a->slots[i];
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
  static void publish(Slot* slot, V* value) noexcept {
    slot->value.store(value, std::memory_order_release);
  }
  /// Gives back a slot claimed for nothing.
  static void abandon(Slot* slot) noexcept { slot->key.store(kErased, std::memory_order_release); }

  /// Erases `key` (the caller holds the lock that owns it); false if it is absent.
  bool erase(Key key) noexcept {
    Array* a = current_.load(std::memory_order_acquire);
    const std::size_t mask = a->mask;
    for (std::size_t i = home(key) & mask, n = 0; n <= mask; i = (i + 1) & mask, ++n) {
      const Key k = a->slots[i].key.load(std::memory_order_relaxed);
      if (k == key) {
        a->slots[i].key.store(kErased, std::memory_order_release);
        return true;
      }
      if (k == kEmpty) return false;
    }
    return false;
  }

  /// Whether a claim probed far (or failed): rebuild() at the next chance.
  [[nodiscard]] bool crowded() const noexcept { return crowded_.load(std::memory_order_relaxed); }

  /// Rebuilds the map without tombstones, with room for four times its entries (`grow`: at least
  /// twice its size): in place, or in a larger array. Only with every writer excluded. Throws
  /// std::bad_alloc with nothing changed.
  void rebuild(bool grow = false) {
    Array* a = current_.load(std::memory_order_relaxed);
    std::vector<std::pair<Key, V*>> entries;
    entries.reserve(count());
    for (std::size_t i = 0; i <= a->mask; ++i) {
      const Key k = a->slots[i].key.load(std::memory_order_relaxed);
      if (k != kEmpty && k != kErased)
        entries.emplace_back(k, a->slots[i].value.load(std::memory_order_relaxed));
    }
    std::size_t capacity = (a->mask + 1) * (grow ? 2 : 1);
    while (capacity < 4 * entries.size()) capacity *= 2;
    if (capacity > a->mask + 1) {
      arrays_.reserve(arrays_.size() + 1);
      std::unique_ptr<Array> bigger = make_array(capacity);
      for (const auto& [k, v] : entries) place(*bigger, k, v);
      arrays_.push_back(std::move(bigger));
      current_.store(arrays_.back().get(), std::memory_order_release);
    } else {
      for (std::size_t i = 0; i <= a->mask; ++i)
        a->slots[i].key.store(kEmpty, std::memory_order_relaxed);
      for (const auto& [k, v] : entries) place(*a, k, v);
    }
    crowded_.store(false, std::memory_order_relaxed);
  }

  /// The number of entries (with every writer excluded).
  [[nodiscard]] std::size_t count() const noexcept {
    std::size_t n = 0;
    for_each([&](Key, V*) { ++n; });
    return n;
  }
  /// Calls fn(key, value) for every entry (with every writer excluded).
  template <typename Fn>
  void for_each(Fn&& fn) const {
    const Array* a = current_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i <= a->mask; ++i) {
      const Key k = a->slots[i].key.load(std::memory_order_relaxed);
      if (k != kEmpty && k != kErased) fn(k, a->slots[i].value.load(std::memory_order_relaxed));
    }
  }

 private:
  struct Array {
    std::size_t mask;
    std::unique_ptr<Slot[]> slots;
  };

  static std::unique_ptr<Array> make_array(std::size_t capacity) {
    auto a = std::make_unique<Array>();
    a->mask = capacity - 1;
    a->slots = std::make_unique<Slot[]>(capacity);
    return a;
  }
  static std::size_t home(Key key) noexcept {
    // Block addresses are 512-byte aligned: mix the bits so neighbouring blocks spread out.
    std::uint64_t x = key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<std::size_t>(x);
  }
  /// Enters (k, v) in the first empty slot from k's home (no writer runs): value, then key.
  static void place(Array& a, Key k, V* v) noexcept {
    std::size_t i = home(k) & a.mask;
    while (a.slots[i].key.load(std::memory_order_relaxed) != kEmpty) i = (i + 1) & a.mask;
    a.slots[i].value.store(v, std::memory_order_relaxed);
    a.slots[i].key.store(k, std::memory_order_release);
  }

  std::atomic<Array*> current_{nullptr};
  std::atomic<bool> crowded_{false};
  std::vector<std::unique_ptr<Array>> arrays_;  ///< the current one last; older ones stay readable
};

}  // namespace stitch::detail

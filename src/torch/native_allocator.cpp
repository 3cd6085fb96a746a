// torch/native_allocator.cpp — stitch as PyTorch's CUDAAllocator (include/stitch/torch_native.hpp):
// every method of c10::cuda::CUDACachingAllocator::CUDAAllocator answered from the process's
// stitch allocator. Requests, frees and statistics go straight to stitch::Allocator; the
// trace-related methods to the TraceBook (torch/trace_book.hpp); private pools keep PyTorch's use
// counts here (torch/pool_uses.hpp); conversions live in torch/convert.hpp.
#include "stitch/torch_native.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/ipc_handle.hpp"
#include "torch/convert.hpp"
#include "torch/pool_uses.hpp"
#include "torch/trace_book.hpp"

namespace stitch::torch_native {

namespace cca = c10::cuda::CUDACachingAllocator;
using detail::TraceBook;
using Level = c10::CachingDeviceAllocator::RecordContext;

namespace {

/// c10::cuda's current device and stream (the default DeviceContext).
class CudaContext final : public DeviceContext {
 public:
  int current_device() override { return c10::cuda::current_device(); }
  void* current_stream(int device) override {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  }
};

/// What every allocator of the process shares: the process's stitch allocator and PyTorch's
/// trace book over it (the core has one observer).
struct Shared {
  Allocator& allocator;
  TraceBook book;
  explicit Shared(Allocator& a) : allocator(a), book(a) {}
};

Shared& shared() {
  static Shared* s = new Shared(process_allocator());  // never destroyed: frees may come at exit
  return *s;
}

/// A free the deleter could not do: PyTorch's own allocator does not end the process there, so
/// neither does stitch. A warning with the error; a live block is leaked and counted in
/// num_failed_frees on its device (where the allocator still answers: not in a forked child); a
/// pointer that is no live block was counted in num_invalid_frees already.
void failed_free(void* ptr, const char* what) noexcept {
  try {
    const bool leaked = shared().allocator.count_failed_free(ptr);
    TORCH_WARN("stitch: freeing ", ptr, " failed (", what, ")",
               leaked ? "; the block is leaked (num_failed_frees)" : "");
  } catch (...) {  // (no memory for the warning: the block is leaked all the same)
  }
}

/// The DataPtr deleter and raw_delete: frees through the process's allocator (with the free's
/// context when the history keeps one). It runs in destructors, so it never throws.
void free_block(void* ptr) noexcept {
  try {
    Shared& s = shared();
    if (s.book.keeps(Level::ALL)) [[unlikely]] {
      TraceBook::Pending pending(s.book.gather(Level::ALL));
      s.allocator.deallocate(ptr);
    } else {
      s.allocator.deallocate(ptr);
    }
  } catch (const std::exception& e) {
    failed_free(ptr, e.what());
  } catch (...) {
    failed_free(ptr, "an unknown error");
  }
}

/// The cudaStream_t of `stream`. An external stream's id is its handle (c10's encoding: an even,
/// non-zero id), read without asking CUDA; the others come from c10's stream pools.
cudaStream_t raw_stream(const c10::cuda::CUDAStream& stream) {
  const c10::StreamId id = stream.id();
  if (id != 0 && (id & 1) == 0) return reinterpret_cast<cudaStream_t>(id);
  return stream.stream();
}

bool is_cuda_backend(Allocator& a) { return std::strcmp(a.backend().name(), "cuda") == 0; }

/// A private pool's checkpoint (getCheckpointState): its segments' blocks in address order.
struct PoolState final : cca::AllocatorState {
  struct Block {
    std::uintptr_t ptr;
    std::size_t size;
    std::size_t requested;
    bool allocated;
    void* stream;
  };
  c10::MempoolId_t id{0, 0};
  std::vector<std::vector<Block>> segments;
};

class NativeAllocator final : public cca::CUDAAllocator {
 public:
  explicit NativeAllocator(std::shared_ptr<DeviceContext> context)
      : context_(std::move(context)), shared_(shared()), a_(shared_.allocator) {}

  // ---- requests ---------------------------------------------------------------------------
  c10::DataPtr allocate(size_t n) override {
    const int device = context_->current_device();
    void* stream = context_->current_stream(device);
    void* p = malloc(n, device, stream);
    return {p, p, &free_block, c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const int device = context_->current_device();
    return malloc(nbytes, device, context_->current_stream(device));
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) return nullptr;
    return malloc(nbytes, context_->current_device(), stream);
  }
  void raw_delete(void* ptr) override {
    if (ptr != nullptr) free_block(ptr);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (is_cuda_backend(a_)) {
      C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
    } else {
      const int device = context_->current_device();
      a_.backend().copy(device, dest, src, count, nullptr);
      a_.backend().synchronize_stream(device, nullptr);
    }
  }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr || ptr.get_deleter() != &free_block) return;  // not ours
    try {
      a_.record_stream(ptr.get(), raw_stream(stream));
    } catch (const error& e) {
      TORCH_CHECK(false, "stitch: ", e.what());
    }
  }

  // ---- devices and the cache --------------------------------------------------------------
  void init(int device_count) override {
    std::lock_guard lock(mu_);
    device_count_.store(std::max(device_count_.load(), std::min(device_count, a_.device_count())));
  }
  bool initialized() override { return device_count_.load() > 0; }
  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }
  /// Every device's cache ({0, 0}); for one pool, what PyTorch's does: a pool's memory goes back
  /// once the pool is released and free, which stitch does as soon as it can, and a pool in use
  /// keeps its memory, so nothing else is given back.
  void emptyCache(c10::MempoolId_t mempool_id) override {
    if (mempool_id == c10::MempoolId_t{0, 0}) a_.empty_cache(-1);
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device(device);
    const MemoryInfo info = a_.backend().memory_info(device);
    return {info.free, info.total};
  }
  double getMemoryFraction(c10::DeviceIndex device) override {
    check_initialized(device);
    return a_.memory_fraction(device);
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(0 <= fraction && fraction <= 1, "invalid fraction:", fraction, ". Please set within [0, 1].");
    check_initialized(device);
    a_.set_memory_fraction(fraction, device);
  }
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    check_device(device);
    *largestBlock = std::max(*largestBlock, a_.largest_request(device));
  }
  void* getBaseAllocation(void* ptr, size_t* size) override {
    // As PyTorch's: `ptr` must start a live block. Unlike PyTorch's, a block in an expandable
    // range has a base too: the mapped run that holds it.
    TORCH_CHECK(a_.find(ptr).has_value(), "invalid device pointer: ", ptr);
    const auto segment = a_.segment_of(ptr);
    TORCH_CHECK(segment.has_value(), "invalid device pointer: ", ptr);
    if (size != nullptr) *size = segment->second;
    return segment->first;
  }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override {
    check_initialized(device);
    std::map<std::pair<std::uintptr_t, bool>, std::size_t> sizes;  // mapped bytes by stream, pool
    for (const SegmentSnapshot& s : a_.segments(device))
      if (s.is_expandable && s.stream != 0) sizes[{s.stream, s.segment_type == "small"}] += s.total_size;
    std::vector<cca::StreamSegmentSize> out;
    for (const auto& [key, bytes] : sizes)
      out.emplace_back(reinterpret_cast<cudaStream_t>(key.first), key.second, bytes);
    return out;
  }
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    check_device(dev);
    check_device(dev_to_access);
    if (!is_cuda_backend(a_)) return;  // the simulated device's memory is one host memory
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      C10_CUDA_CHECK(err);
    }
  }
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (!is_cuda_backend(a_)) {
      try {
        a_.backend().copy(dstDevice, dst, src, count, stream);
      } catch (const error&) {
        return cudaErrorInvalidValue;
      }
      return cudaSuccess;
    }
    if (p2p_enabled || dstDevice == srcDevice)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // ---- statistics -------------------------------------------------------------------------
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device(device);
    c10::CachingDeviceAllocator::DeviceStats stats = detail::to_torch(a_.stats(device));
    if (pools_.any()) {
      for (const SegmentSnapshot& s : a_.segments(device)) {
        if (s.pool_id == c10::MempoolId_t{0, 0}) continue;
        auto& by_pool = stats.reserved_bytes_by_private_pools[s.pool_id];
        const auto bytes = static_cast<std::int64_t>(s.total_size);
        by_pool[0].current += bytes;
        by_pool[s.segment_type == "small" ? 1 : 2].current += bytes;
      }
      for (auto& [id, arr] : stats.reserved_bytes_by_private_pools)
        for (auto& st : arr) st.peak = st.allocated = st.current;
    }
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device(device);
    a_.reset_accumulated_stats(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device);
    a_.reset_peak_stats(device);
  }

  // ---- snapshots and history --------------------------------------------------------------
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override {
    cca::SnapshotInfo out;
    const Snapshot snap = a_.snapshot();  // records the `snapshot` event, as PyTorch's does
    out.segments = detail::to_torch(snap.segments, mempool_id, shared_.book);
    std::sort(out.segments.begin(), out.segments.end(),
              [](const auto& x, const auto& y) { return x.address < y.address; });
    if (include_traces)
      for (int d = 0; d < a_.device_count(); ++d) out.device_traces.push_back(shared_.book.history(d));
    out.config_metadata = detail::to_torch(a_.config());
    return out;
  }
  void recordHistory(bool enabled, c10::CachingDeviceAllocator::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, Level when, bool clearHistory,
                     const std::vector<std::string>& skip_actions) override {
    TORCH_CHECK(when == Level::NEVER || context_recorder);
    shared_.book.record_history(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                                skip_actions);
  }
  bool isHistoryEnabled() override { return shared_.book.history_enabled(); }
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    return shared_.book.context_of(reinterpret_cast<std::uintptr_t>(ptr));
  }
  void attachAllocatorTraceTracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker) override {
    shared_.book.attach_tracker(std::move(tracker));
  }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard lock(mu_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override {
    // stitch never rejects a request before asking the device (PyTorch's
    // throw_on_cudamalloc_oom): kept, and never called.
    std::lock_guard lock(mu_);
    rejection_observers_.push_back(std::move(observer));
  }

  // ---- private pools: CUDA graphs and MemPools --------------------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    check_device(device);
    guard([&] { pools_.begin(device, id, std::move(filter)); });
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device);
    guard([&] { pools_.end(device, id); });
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device);
    guard([&] { pools_.release(device, id); });
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device);
    return pools_.use_count(device, id);
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    check_device(device);
    TORCH_CHECK(allocator == nullptr || allocator.get() == this || allocator->name() == name(),
                "stitch: a MemPool over another allocator (", allocator ? allocator->name() : "",
                ") cannot live inside stitch's: its memory would not be stitch's to reuse, move or "
                "report. Create the MemPool without an allocator to get a stitch pool.");
    guard([&] { pools_.create_or_incref(device, id); });
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) override {
    check_device(device);
    guard([&] { pools_.set_use_on_oom(device, id, use_on_oom); });
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device);
    guard([&] { pools_.set_no_split(device, id); });
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void*>& expected) override {
    check_device(device);
    std::size_t allocated = 0;
    for (const SegmentSnapshot& s : pool_segments(device, id, "Could not find pool of id")) {
      for (const BlockSnapshot& b : s.blocks) {
        if (b.state != "active_allocated") continue;
        if (expected.count(reinterpret_cast<void*>(b.address)) == 0) return false;
        ++allocated;
      }
    }
    return allocated == expected.size();
  }
  // cudagraph trees: a pool's blocks saved, and put back where they were.
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device);
    auto state = std::make_shared<PoolState>();
    state->id = id;
    for (const SegmentSnapshot& s : pool_segments(device, id, "Could not find pool of id")) {
      auto& blocks = state->segments.emplace_back();
      for (const BlockSnapshot& b : s.blocks) {
        TORCH_CHECK(b.state != "active_pending_free", "Events should have synchronized when checkpointing block");
        if (b.state == "unmapped") continue;
        blocks.push_back({b.address, b.size, b.requested_size, b.state == "active_allocated",
                          reinterpret_cast<void*>(s.stream)});
      }
    }
    return state;
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> as) override {
    check_device(device);
    auto state = std::dynamic_pointer_cast<PoolState>(as);
    TORCH_CHECK(state, "Expected PrivatePoolState");
    const c10::MempoolId_t id = state->id;
    cca::CheckpointDelta delta;
    // 1. Every block the pool holds now is freed (the caller strips the deleters of their
    // storages), once none waits for events.
    const std::vector<SegmentSnapshot> now = pool_segments(device, id, "Could not find private pool id");
    for (const SegmentSnapshot& s : now)
      for (const BlockSnapshot& b : s.blocks)
        TORCH_CHECK(b.state != "active_pending_free", "Events should have synchronized when setting checkpointed block");
    for (const SegmentSnapshot& s : now) {
      for (const BlockSnapshot& b : s.blocks) {
        if (b.state != "active_allocated") continue;
        void* p = reinterpret_cast<void*>(b.address);
        guard([&] { a_.deallocate(p); });
        delta.ptrs_freed.push_back(p);
      }
    }
    // 2. The checkpoint's allocated blocks, at their addresses and sizes.
    for (const auto& segment : state->segments) {
      for (const auto& b : segment) {
        if (!b.allocated) continue;
        void* want = reinterpret_cast<void*>(b.ptr);
        void* p = nullptr;
        guard([&] { p = a_.allocate_at(want, b.requested, b.stream, device, b.size); });
        TORCH_CHECK(p == want, " could not find ", want);
        delta.dataptrs_allocd.emplace_back(p, p, &free_block,
                                           c10::Device(c10::DeviceType::CUDA, device));
      }
    }
    return delta;
  }
  c10::DataPtr allocateWithAddress(size_t size, void* addr) override {
    TORCH_CHECK(reinterpret_cast<std::uintptr_t>(addr) % 512 == 0,
                "mallocWithAddress: addr must be aligned to kMinBlockSize (", 512, " bytes), got ", addr);
    const int device = context_->current_device();
    check_initialized(device);
    const c10::Device where(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    if (size == 0) return {nullptr, nullptr, &free_block, where};
    void* p = nullptr;
    guard([&] { p = a_.allocate_at(addr, size, context_->current_stream(device), device); });
    TORCH_CHECK(p != nullptr, "Could not allocate CUDA storage at exact address ", addr);
    return {p, p, &free_block, where};
  }

  // ---- IPC ----------------------------------------------------------------------------------
  // PyTorch's handles (stitch/ipc_handle.hpp): 'c' and 'e' as PyTorch's own allocator writes and
  // reads them, stitch's 's' where they cannot say it; `offset` is the block's place in the
  // memory getIpcDevPtr maps, as PyTorch's receiver adds it.
  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    std::string text;
    try {
      text = a_.export_block(ptr);
    } catch (const error& e) {
      TORCH_CHECK(false, "stitch: ", e.what());
    }
    const std::optional<ipc::BlockHandle> block = ipc::parse(text);
    TORCH_CHECK(block.has_value(), "stitch: malformed IPC handle");
    return {static_cast<ptrdiff_t>(block->offset), ipc::torch_handle(text)};
  }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    std::lock_guard lock(ipc_->mu);
    auto it = ipc_->imported.find(handle);
    if (it != ipc_->imported.end()) {
      if (auto alive = it->second.lock()) return alive;
    }
    std::string why;
    const std::optional<ipc::torch::Import> parsed = ipc::parse_torch(handle, context_->current_device(), &why);
    TORCH_CHECK(parsed.has_value(), "stitch: ", why);
    const ipc::torch::Import& imp = *parsed;
    void* ptr = nullptr;
    try {
      ptr = a_.import_block(imp.text, context_->current_device());
    } catch (const error& e) {
      TORCH_CHECK(false, "stitch: ", e.what());
    }
    void* base = static_cast<char*>(ptr) - imp.block_offset;
    // The deleter may run after this allocator is gone: it holds the cache, and the process's
    // allocator lives as long as the process.
    std::shared_ptr<void> sp(base, [cache = ipc_, a = &a_, handle, ptr](void*) {
      {
        std::lock_guard lock(cache->mu);
        auto it = cache->imported.find(handle);
        if (it != cache->imported.end() && it->second.expired()) cache->imported.erase(it);
      }
      try {
        a->close_block(ptr);
      } catch (const std::exception& e) {  // (a deleter must not throw: the mapping stays)
        try {
          TORCH_WARN("stitch: closing the IPC mapping at ", ptr, " failed (", e.what(), ")");
        } catch (...) {
        }
      } catch (...) {
      }
    });
    ipc_->imported[handle] = sp;
    return sp;
  }

  std::string name() override { return "stitch"; }

 private:
  /// PyTorch's "did you call init?" rule: a device below the count init() was given.
  void check_device(int device) const {
    TORCH_CHECK(0 <= device && device < device_count_.load(std::memory_order_relaxed),
                "Invalid device argument ", device, ": did you call init?");
  }
  /// The segments of private pool `id` on `device`; PyTorch's error `unknown` when the pool is
  /// neither in use nor holding memory.
  std::vector<SegmentSnapshot> pool_segments(int device, c10::MempoolId_t id, const char* unknown) {
    std::vector<SegmentSnapshot> out;
    for (SegmentSnapshot& s : a_.segments(device))
      if (s.pool_id == id) out.push_back(std::move(s));
    TORCH_CHECK(!out.empty() || pools_.use_count(device, id) > 0, unknown);
    return out;
  }
  /// The "not initialized" rule of PyTorch's requests, memory fraction and segment sizes.
  void check_initialized(int device) const {
    TORCH_CHECK(0 <= device && device < device_count_.load(std::memory_order_relaxed),
                "Allocator not initialized for device ", device, ": did you call init?");
  }
  /// Runs `fn`, turning stitch's errors into PyTorch's.
  template <typename Fn>
  static void guard(Fn&& fn) {
    try {
      fn();
    } catch (const error& e) {
      TORCH_CHECK(false, "stitch: ", e.what());
    }
  }
  void* malloc(size_t n, int device, void* stream) {
    TORCH_INTERNAL_ASSERT(0 <= device && device < device_count_.load(std::memory_order_relaxed),
                          "Allocator not initialized for device ", device, ": did you call init?");
    try {
      if (shared_.book.keeps(Level::STATE)) [[unlikely]] {
        TraceBook::Pending pending(shared_.book.gather(Level::STATE));
        return a_.allocate(n, stream, device);
      }
      return a_.allocate(n, stream, device);
    } catch (const out_of_memory& e) {
      // PyTorch's fallback to the pools marked setUseOnOOM, then the error.
      if (void* p = pools_.allocate_on_oom(device, n, stream)) return p;
      out_of_memory_error(device, n, e.what());
    } catch (const error& e) {
      TORCH_CHECK(false, "stitch: ", e.what());
    }
  }
  /// The OutOfMemoryObservers, then c10::OutOfMemoryError (torch.OutOfMemoryError) with the report.
  /// As PyTorch's, an observer is told the device, the size of the segment the request needed
  /// (2 MiB up to 1 MiB, 20 MiB below 10 MiB, else 2 MiB multiples), what the device allows
  /// (its capacity, or the memory fraction's share) and what it has free.
  [[noreturn]] void out_of_memory_error(int device, size_t n, const std::string& report) {
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard lock(mu_);
      observers = oom_observers_;
    }
    if (!observers.empty()) {
      constexpr size_t kMiB = size_t{1} << 20;
      const size_t segment = n <= kMiB ? 2 * kMiB : n < 10 * kMiB ? 20 * kMiB : (n + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
      const MemoryInfo info = a_.backend().memory_info(device);
      const double fraction = a_.memory_fraction(device);
      const size_t allowed = fraction < 1.0 ? static_cast<size_t>(fraction * static_cast<double>(info.total)) : info.total;
      for (const auto& o : observers) o(device, segment, allowed, info.free);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, report);
  }

  std::shared_ptr<DeviceContext> context_;
  Shared& shared_;
  stitch::Allocator& a_;
  std::mutex mu_;  ///< device_count_ and the observers
  std::atomic<int> device_count_{0};
  std::atomic<bool> enabled_{true};
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cca::OomRejectionObserver> rejection_observers_;
  detail::PoolUses pools_{a_};
  /// getIpcDevPtr's mappings by handle, as PyTorch's cache: one mapping per handle while in use.
  struct IpcCache {
    std::mutex mu;
    std::unordered_map<std::string, std::weak_ptr<void>> imported;
  };
  std::shared_ptr<IpcCache> ipc_ = std::make_shared<IpcCache>();
};

}  // namespace

std::shared_ptr<cca::CUDAAllocator> make_allocator(std::shared_ptr<DeviceContext> context) {
  if (context == nullptr) context = std::make_shared<CudaContext>();
  return std::make_shared<NativeAllocator>(std::move(context));
}

}  // namespace stitch::torch_native

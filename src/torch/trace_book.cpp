// torch/trace_book.cpp — PyTorch's trackers and history over stitch's trace events.
#include "torch/trace_book.hpp"

#include <c10/util/Exception.h>

#include <utility>

namespace stitch::torch_native::detail {

namespace {

using Action = cda::TraceEntry::Action;

/// The calling thread's pending context (set by Pending around a request).
thread_local std::shared_ptr<c10::GatheredContext> t_pending;

Action action_of(TraceAction a) {
  switch (a) {
    case TraceAction::alloc: return Action::ALLOC;
    case TraceAction::free_requested: return Action::FREE_REQUESTED;
    case TraceAction::free_completed: return Action::FREE_COMPLETED;
    case TraceAction::segment_alloc: return Action::SEGMENT_ALLOC;
    case TraceAction::segment_free: return Action::SEGMENT_FREE;
    case TraceAction::segment_map: return Action::SEGMENT_MAP;
    case TraceAction::segment_unmap: return Action::SEGMENT_UNMAP;
    case TraceAction::oom: return Action::OOM;
    case TraceAction::snapshot: return Action::SNAPSHOT;
  }
  return Action::SNAPSHOT;
}

/// What a tracker is told: ProcessGroupNCCL registers memory on SEGMENT_ALLOC and deregisters
/// on SEGMENT_FREE only, so a range mapped into an expandable range (growth, a stitch, pages
/// moved) is a segment allocated, and a range unmapped a segment freed.
Action tracker_action(Action a) {
  if (a == Action::SEGMENT_MAP) return Action::SEGMENT_ALLOC;
  if (a == Action::SEGMENT_UNMAP) return Action::SEGMENT_FREE;
  return a;
}

}  // namespace

TraceBook::Pending::Pending(std::shared_ptr<c10::GatheredContext> context) {
  t_pending = std::move(context);
}

TraceBook::Pending::~Pending() { t_pending.reset(); }

TraceBook::~TraceBook() {
  try {
    allocator_.set_trace_observer(nullptr);
  } catch (...) {
  }
}

void TraceBook::record_history(bool enabled, cda::CreateContextFn recorder, std::size_t max_entries,
                               cda::RecordContext when, bool clear,
                               const std::vector<std::string>& skip) {
  std::unordered_set<int> skip_actions;
  for (const std::string& s : skip) skip_actions.insert(static_cast<int>(cda::parseTraceEntryAction(s)));
  {
    std::lock_guard lock(mu_);
    enabled_ = enabled;
    recorder_ = recorder;
    when_ = enabled ? when : cda::RecordContext::NEVER;
    max_entries_ = max_entries == 0 ? 1 : max_entries;
    skip_ = std::move(skip_actions);
    if (!enabled || clear) {
      for (auto& h : history_) h.clear();
    }
    for (auto& h : history_)
      while (h.size() > max_entries_) h.pop_front();
    if (when_ < cda::RecordContext::STATE) {
      live_.clear();
      segments_.clear();
    }
    when_fast_.store(recorder_ != nullptr ? static_cast<int>(when_) : 0, std::memory_order_relaxed);
  }
  update_observer();
}

bool TraceBook::history_enabled() const {
  std::lock_guard lock(mu_);
  return enabled_;
}

void TraceBook::attach_tracker(cda::AllocatorTraceTracker tracker) {
  {
    std::lock_guard lock(mu_);
    auto next = std::make_shared<std::vector<cda::AllocatorTraceTracker>>(*trackers_);
    next->push_back(std::move(tracker));
    trackers_ = std::move(next);
  }
  update_observer();
}

void TraceBook::update_observer() {
  std::lock_guard serial(observer_mu_);
  bool want = false;
  {
    std::lock_guard lock(mu_);
    want = enabled_ || !trackers_->empty();
    if (want == observing_) return;
    observing_ = want;
  }
  if (want) {
    allocator_.set_trace_observer([this](int device, const TraceEntry& e) { on_event(device, e); });
  } else {
    allocator_.set_trace_observer(nullptr);
  }
}

std::shared_ptr<c10::GatheredContext> TraceBook::gather(cda::RecordContext level) const {
  if (!keeps(level)) return nullptr;
  cda::CreateContextFn recorder = nullptr;
  {
    std::lock_guard lock(mu_);
    if (when_ < level || recorder_ == nullptr) return nullptr;
    recorder = recorder_;
  }
  return recorder();
}

void TraceBook::on_event(int device, const TraceEntry& e) {
  const Action action = action_of(e.action);
  const std::shared_ptr<c10::GatheredContext>& pending = t_pending;
  std::shared_ptr<const std::vector<cda::AllocatorTraceTracker>> trackers;
  cda::TraceEntry te(action, static_cast<c10::DeviceIndex>(device), e.addr, e.size,
                     reinterpret_cast<void*>(e.stream), {0, 0}, c10::getApproximateTime());
  {
    std::lock_guard lock(mu_);
    trackers = trackers_;
    // PyTorch's contexts: an allocation's (gathered from STATE on) goes to its block, to its
    // entry and its segment's from ALLOC on; a free's own from ALL on, else its block's.
    const bool free_action = action == Action::FREE_REQUESTED || action == Action::FREE_COMPLETED;
    std::shared_ptr<c10::GatheredContext> context = pending;
    if (free_action && (when_ < cda::RecordContext::ALL || !context)) {
      auto it = live_.find(e.addr);
      context = it == live_.end() ? nullptr : it->second;
    }
    if (when_ >= cda::RecordContext::ALLOC) te.context_ = context;
    if (pending && when_ >= cda::RecordContext::STATE) {
      if (action == Action::ALLOC) live_[e.addr] = pending;
      if (action == Action::SEGMENT_ALLOC || action == Action::SEGMENT_MAP) segments_.emplace(e.addr, pending);
    }
    if (action == Action::FREE_COMPLETED) live_.erase(e.addr);
    if (action == Action::SEGMENT_FREE || action == Action::SEGMENT_UNMAP) segments_.erase(e.addr);
    if (enabled_ && skip_.count(static_cast<int>(action)) == 0) {
      if (history_.size() <= static_cast<std::size_t>(device)) history_.resize(static_cast<std::size_t>(device) + 1);
      auto& h = history_[static_cast<std::size_t>(device)];
      h.push_back(te);
      while (h.size() > max_entries_) h.pop_front();
    }
  }
  if (!trackers->empty()) {
    te.action_ = tracker_action(action);
    for (const auto& t : *trackers) t(te);
  }
}

std::vector<cda::TraceEntry> TraceBook::history(int device) const {
  std::vector<cda::TraceEntry> out;
  {
    std::lock_guard lock(mu_);
    if (static_cast<std::size_t>(device) < history_.size())
      out.assign(history_[static_cast<std::size_t>(device)].begin(), history_[static_cast<std::size_t>(device)].end());
  }
  auto to_ns = clock_.makeConverter();
  for (auto& te : out) te.time_.t_ = to_ns(te.time_.approx_t_) / 1000;
  return out;
}

std::shared_ptr<c10::GatheredContext> TraceBook::context_of(std::uintptr_t addr) const {
  std::lock_guard lock(mu_);
  auto it = live_.find(addr);
  return it == live_.end() ? nullptr : it->second;
}

std::shared_ptr<c10::GatheredContext> TraceBook::segment_context(std::uintptr_t addr) const {
  std::lock_guard lock(mu_);
  auto it = segments_.find(addr);
  return it == segments_.end() ? nullptr : it->second;
}

}  // namespace stitch::torch_native::detail

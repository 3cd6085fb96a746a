// tools/tracegen/device_run.cpp — a generated program recorded on a device of a given size.
#include "tools/tracegen/device_run.hpp"

#include <fmt/format.h>

#include <memory>
#include <new>
#include <unordered_map>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "tools/tracegen/synthetic_addresses.hpp"

namespace stitch::tracegen {

namespace {
stream_t as_stream(std::uintptr_t s) { return reinterpret_cast<stream_t>(s); }
}  // namespace

Snapshot record_on_device(const Snapshot& program, const DeviceRun& run) {
  const std::vector<TraceEntry>& events = program.device_traces.at(0);
  SimBackend::Options so;
  so.capacity = run.memory;
  so.copy_data = false;
  auto sim = std::make_shared<SimBackend>(so);
  void* context = run.context != 0 ? sim->allocate(0, run.context) : nullptr;
  if (run.context != 0 && context == nullptr) throw error("tracegen: the device is smaller than its context");
  std::string conf = fmt::format("backend:sim,record_history:True,max_entries:{},oom_what_if:False",
                                 4 * events.size() + 64);
  if (!run.alloc_conf.empty()) conf += "," + run.alloc_conf;
  Snapshot snap;
  {
    Allocator a(Config::parse(conf), std::make_shared<detail::SyntheticAddresses>(sim));
    std::unordered_map<std::uintptr_t, void*> live;
    std::vector<const TraceEntry*> allocs;  // the program's allocations, in order (frames)
    const TraceEntry* failed = nullptr;
    for (const TraceEntry& e : events) {
      if (e.action == TraceAction::alloc) {
        try {
          live[e.addr] = a.allocate(e.size, as_stream(e.stream));
          allocs.push_back(&e);
        } catch (const std::bad_alloc&) {
          failed = &e;  // the program dies of it here
          break;
        }
      } else if (e.action == TraceAction::free_completed) {
        auto it = live.find(e.addr);
        if (it == live.end()) continue;
        a.deallocate(it->second);
        live.erase(it);
      }
    }
    snap = a.snapshot();
    // The program's frames on the allocator's entries (its k-th alloc is the program's k-th), no
    // time stamps: the file is the same on every run.
    std::size_t k = 0;
    for (TraceEntry& t : snap.device_traces.at(0)) {
      t.time_us = 0;
      if (t.action == TraceAction::alloc && k < allocs.size()) t.frames = allocs[k++]->frames;
      if (t.action == TraceAction::oom && failed != nullptr) t.frames = failed->frames;
    }
  }
  if (context != nullptr) sim->deallocate(0, context, run.context);
  snap.settings = run.alloc_conf;
  snap.has_settings = true;  // the file says what the run used (allocator_settings)
  return snap;
}

stitch::detail::SnapshotMeta device_run_meta(std::string_view pattern, std::uint64_t seed, const Options& options,
                                             const DeviceRun& run) {
  stitch::detail::SnapshotMeta meta = snapshot_meta(pattern, seed, options);
  meta.config += fmt::format(",device_memory_mb:{},context_mb:{}", run.memory >> 20, run.context >> 20);
  if (!run.alloc_conf.empty()) meta.config += ",alloc_conf:" + run.alloc_conf;
  return meta;
}

}  // namespace stitch::tracegen

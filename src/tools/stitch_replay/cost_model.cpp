// tools/stitch_replay/cost_model.cpp — the call costs: published defaults, cost files, the estimate.
#include "tools/stitch_replay/cost_model.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::replay_cli {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A minimal reader for the cost file: {"name": number | {"per_call_us": n, "per_mib_us": n}}.
class CostReader {
 public:
  CostReader(std::string_view text, std::string_view name) : t_(text), name_(name) {}

  void read(CostModel& model) {
    expect('{');
    if (peek() == '}') {
      ++i_;
      return;
    }
    while (true) {
      const std::string key = string();
      expect(':');
      CostCall call = CostCall::count_;
      for (std::size_t c = 0; c < kCostCalls; ++c)
        if (key == cost_name(static_cast<CostCall>(c))) call = static_cast<CostCall>(c);
      if (call == CostCall::count_) fail(fmt::format("unknown call '{}'", key));
      CallCost& cost = model.costs[static_cast<std::size_t>(call)];
      if (peek() == '{') {
        ++i_;
        while (true) {
          const std::string field = string();
          expect(':');
          const double v = number();
          if (field == "per_call_us") cost.per_call_us = v;
          else if (field == "per_mib_us") cost.per_mib_us = v;
          else fail(fmt::format("unknown field '{}' of '{}'", field, key));
          if (peek() == ',') {
            ++i_;
            continue;
          }
          expect('}');
          break;
        }
      } else {
        cost = CallCost{number(), 0.0};
      }
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      break;
    }
    if (peek() != '\0') fail("text after the object");
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw error(fmt::format("{}: offset {}: {}", name_, i_, why));
  }
  char peek() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
    return i_ < t_.size() ? t_[i_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++i_;
  }
  std::string string() {
    expect('"');
    const std::size_t end = t_.find('"', i_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(t_.substr(i_, end - i_));
    i_ = end + 1;
    return s;
  }
  double number() {
    peek();
    const std::string rest(t_.substr(i_, 64));
    char* end = nullptr;
    const double v = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str() || !(v >= 0.0)) fail("expected a non-negative number");
    i_ += static_cast<std::size_t>(end - rest.c_str());
    return v;
  }

  std::string_view t_;
  std::string_view name_;
  std::size_t i_ = 0;
};

}  // namespace

const char* cost_name(CostCall call) noexcept {
  switch (call) {
    case CostCall::cuda_malloc: return "cudaMalloc";
    case CostCall::cuda_free: return "cudaFree";
    case CostCall::mem_create: return "cuMemCreate";
    case CostCall::mem_release: return "cuMemRelease";
    case CostCall::mem_map: return "cuMemMap";
    case CostCall::mem_set_access: return "cuMemSetAccess";
    case CostCall::mem_unmap: return "cuMemUnmap";
    case CostCall::address_reserve: return "cuMemAddressReserve";
    case CostCall::address_free: return "cuMemAddressFree";
    case CostCall::stream_synchronize: return "cudaStreamSynchronize";
    case CostCall::device_copy: return "cuMemcpyDtoDAsync";
    case CostCall::host_copy: return "cuMemcpyDtoH/HtoD";
    case CostCall::device_synchronize: return "cuCtxSynchronize";
    case CostCall::bus_copy: return "cuMemcpyAsync(spill)";
    case CostCall::count_: break;
  }
  return "?";
}

CallCounts CallCounts::of(const SimBackend& sim) {
  CallCounts c;
  auto put = [&](CostCall call, SimCall kind) {
    c.calls[static_cast<std::size_t>(call)] = sim.call_count(kind);
    c.bytes[static_cast<std::size_t>(call)] = sim.call_bytes(kind);
  };
  put(CostCall::cuda_malloc, SimCall::allocate);
  put(CostCall::cuda_free, SimCall::deallocate);
  put(CostCall::mem_create, SimCall::create_physical);
  put(CostCall::mem_release, SimCall::release_physical);
  put(CostCall::mem_map, SimCall::map);
  put(CostCall::mem_set_access, SimCall::set_access);
  put(CostCall::mem_unmap, SimCall::unmap);
  put(CostCall::address_reserve, SimCall::reserve);
  put(CostCall::address_free, SimCall::release_reservation);
  put(CostCall::stream_synchronize, SimCall::synchronize_stream);
  put(CostCall::device_copy, SimCall::copy);
  put(CostCall::host_copy, SimCall::copy_to_host);
  c.calls[static_cast<std::size_t>(CostCall::host_copy)] += sim.call_count(SimCall::copy_from_host);
  c.bytes[static_cast<std::size_t>(CostCall::host_copy)] += sim.call_bytes(SimCall::copy_from_host);
  put(CostCall::device_synchronize, SimCall::synchronize_device);
  // Spill's copies cross the bus: charged as such, not as device copies.
  const auto [bus, bus_bytes] = sim.bus_copies();
  c.calls[static_cast<std::size_t>(CostCall::bus_copy)] = bus;
  c.bytes[static_cast<std::size_t>(CostCall::bus_copy)] = bus_bytes;
  c.calls[static_cast<std::size_t>(CostCall::device_copy)] -= bus;
  c.bytes[static_cast<std::size_t>(CostCall::device_copy)] -= bus_bytes;
  return c;
}

CostModel CostModel::published() {
  CostModel m;
  m.source = "published";
  auto set = [&](CostCall call, double us) { m.costs[static_cast<std::size_t>(call)] = CallCost{us, 0.0}; };
  set(CostCall::cuda_malloc, 50.0);
  set(CostCall::cuda_free, 10.0);
  set(CostCall::mem_create, 193.3);
  set(CostCall::mem_release, 5.0);
  set(CostCall::mem_map, 1.45);
  set(CostCall::mem_set_access, 36.0);
  set(CostCall::mem_unmap, 25.6);
  set(CostCall::address_reserve, 19.0);
  set(CostCall::address_free, 19.0);
  set(CostCall::stream_synchronize, 10.0);
  // Copies by bandwidth: on the device about 1 ms per 2 GiB (H200), through pageable host
  // memory about 12.5 GB/s; a device sync with nothing queued as a stream's.
  m.costs[static_cast<std::size_t>(CostCall::device_copy)] = CallCost{5.0, 1000.0 / 2048.0};
  m.costs[static_cast<std::size_t>(CostCall::host_copy)] = CallCost{10.0, 80.0};
  // Spill copies between device and host pages: PCIe Gen5 x16, about 50 GB/s (20 µs per MiB);
  // NVLink-C2C (Grace Hopper) is several times faster: give a cost file for it.
  m.costs[static_cast<std::size_t>(CostCall::bus_copy)] = CallCost{10.0, 20.0};
  set(CostCall::device_synchronize, 10.0);
  return m;
}

CostModel CostModel::from_json(std::string_view text, std::string_view name) {
  CostModel m = published();
  CostReader(text, name).read(m);
  m.source = std::string(name);
  return m;
}

CostModel CostModel::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(fmt::format("{}: cannot open file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

double CostModel::estimate_us(const CallCounts& counts) const noexcept {
  double us = 0.0;
  for (std::size_t i = 0; i < kCostCalls; ++i)
    us += static_cast<double>(counts.calls[i]) * costs[i].per_call_us +
          static_cast<double>(counts.bytes[i]) / kMiB * costs[i].per_mib_us;
  return us;
}

}  // namespace stitch::replay_cli

// backends/sim/sim_backend.cpp — SimBackend, a simulated GPU made of real host memory (Linux).
//
// This file owns everything behind stitch::SimBackend: one sparse memfd per device, carved by a
// free-range allocator into plain allocations (MAP_SHARED mappings of their range) and physical
// handles; the virtual-memory model (PROT_NONE reservations, MAP_FIXED mappings of handles); the
// capacity accounting; the stream/event model with held streams; fault injection; and memory
// another process maps (export_memory / import_memory: /proc/<pid>/fd/<fd> of the memfd).
#include "stitch/sim_backend.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stitch/errors.hpp"
#include "stitch/ipc_handle.hpp"

namespace stitch {

namespace {

constexpr std::size_t kCallKinds = static_cast<std::size_t>(SimCall::count_);

std::size_t index_of(SimCall call) {
  const auto i = static_cast<std::size_t>(call);
  if (i >= kCallKinds) {
    throw invalid_argument("sim: invalid SimCall value " + std::to_string(static_cast<int>(call)));
  }
  return i;
}

bool is_power_of_two(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

void* ptr(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

std::string hex(std::uintptr_t a) {
  char buf[2 + 2 * sizeof(std::uintptr_t) + 1];
  std::snprintf(buf, sizeof buf, "0x%jx", static_cast<std::uintmax_t>(a));
  return buf;
}

/// "sim: <call> (device N): " — the prefix of every message about a device call.
std::string prefix(const char* call, int device) {
  return std::string("sim: ") + call + " (device " + std::to_string(device) + "): ";
}

/// `bytes` rounded up to whole host pages (memfd offsets of mappings are page multiples).
std::size_t host_pages(std::size_t bytes) {
  static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

/// "<syscall> failed: <message of err>" (thread-safe, unlike strerror()).
std::string errno_text(const char* syscall, int err) {
  return std::string(syscall) + " failed: " + std::generic_category().message(err);
}

/// Physical memory: a range of the device's memfd.
struct Physical {
  std::size_t offset = 0;
  std::size_t bytes = 0;
  std::size_t mappings = 0;  ///< live map() calls of this handle
  bool released = false;     ///< release_physical() was called; freed when mappings reaches 0
  bool host = false;         ///< host pages (create_host_physical): charged to the host budget
};

/// One map() call.
struct Mapping {
  std::size_t bytes = 0;
  phys_handle_t handle = 0;
};

struct Event {
  int device = 0;
  bool recorded = false;
  bool captured = false;  ///< recorded on a capturing stream: a node of the graph, not work
  stream_t stream = nullptr;
  std::uint64_t seq = 0;  ///< position of the record in its stream
};

struct Stream {
  std::uint64_t submitted = 0;  ///< records made on the stream
  std::uint64_t completed = 0;  ///< records whose work has completed
  bool held = false;
  int capture_device = -1;   ///< capturing a graph on this device (begin_capture), or -1
  bool invalidated = false;  ///< the capture broke CUDA's rules: end_capture reports it
};

struct Fault {
  SimCall call;
  std::uint64_t at;  ///< value of the call counter at which it fires
  SimFault fault;
};

/// One simulated device. Owns its host mappings and its memfd; the destructor releases them.
struct Device {
  int fd = -1;
  std::size_t file_size = 0;  ///< current size of the memfd
  std::size_t capacity = 0;
  std::size_t used = 0;
  std::map<std::uintptr_t, std::size_t> allocations;   ///< plain allocations: address -> bytes
  std::map<std::uintptr_t, std::size_t> plain_offsets;  ///< plain allocations: address -> memfd offset
  std::map<std::uintptr_t, std::size_t> reservations;  ///< reserved ranges: address -> bytes
  std::map<std::uintptr_t, Mapping> mappings;          ///< mapped ranges, inside reservations
  std::map<phys_handle_t, Physical> physical;          ///< live physical handles
  std::map<std::size_t, std::size_t> free_ranges;      ///< free memfd ranges: offset -> bytes
  std::map<std::uintptr_t, std::size_t> imports;       ///< import_memory() ranges: address -> bytes
  std::size_t events = 0;
  std::size_t* host_pages = nullptr;  ///< the simulator's count of host-page bytes (all devices)

  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() {
    for (const auto& [a, bytes] : allocations) ::munmap(ptr(a), bytes);
    for (const auto& [a, bytes] : imports) ::munmap(ptr(a), bytes);
    // Every mapping lies inside a reservation, so this removes the mappings too.
    for (const auto& [a, bytes] : reservations) ::munmap(ptr(a), bytes);
    if (fd >= 0) ::close(fd);
  }

  [[nodiscard]] bool fits(std::size_t bytes) const {
    return used <= capacity && bytes <= capacity - used;
  }

  /// Carves `bytes` out of the memfd (best fit; grows the sparse file when nothing fits).
  /// Throws backend_error if the file cannot grow, having changed nothing.
  std::size_t carve(std::size_t bytes) {
    auto best = free_ranges.end();
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
      if (it->second >= bytes && (best == free_ranges.end() || it->second < best->second)) {
        best = it;
      }
    }
    if (best != free_ranges.end()) {
      const auto [offset, length] = *best;
      free_ranges.erase(best);
      if (length > bytes) free_ranges.emplace(offset + bytes, length - bytes);
      return offset;
    }
    // Nothing fits (fragmentation or a raised capacity): extend the file, reusing a free tail.
    std::size_t offset = file_size;
    auto last = free_ranges.empty() ? free_ranges.end() : std::prev(free_ranges.end());
    if (last != free_ranges.end() && last->first + last->second == file_size) offset = last->first;
    const std::size_t new_size = offset + bytes;
    if (new_size < offset) throw backend_error("sim: create_physical: memfd size overflow");
    if (::ftruncate(fd, static_cast<off_t>(new_size)) != 0) {
      const int err = errno;
      throw backend_error("sim: create_physical: growing the device memfd: " +
                          errno_text("ftruncate", err));
    }
    if (last != free_ranges.end() && offset == last->first) free_ranges.erase(last);
    file_size = new_size;
    return offset;
  }

  /// Returns a memfd range to the free list (coalescing) and its pages to the host.
  void give_back(std::size_t offset, std::size_t bytes) {
    // Best effort: if the hole cannot be punched the pages merely stay resident.
    (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                      static_cast<off_t>(bytes));
    auto next = free_ranges.lower_bound(offset);
    if (next != free_ranges.end() && offset + bytes == next->first) {
      bytes += next->second;
      next = free_ranges.erase(next);
    }
    if (next != free_ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += bytes;
        return;
      }
    }
    free_ranges.emplace(offset, bytes);
  }

  /// Frees a physical handle's memory (it must be released and unmapped).
  void free_physical(std::map<phys_handle_t, Physical>::iterator it) {
    const Physical p = it->second;
    physical.erase(it);
    if (p.host) {
      *host_pages -= p.bytes;
    } else {
      used -= p.bytes;
    }
    give_back(p.offset, p.bytes);
  }

  /// The reservation containing [a, a + bytes), or end().
  std::map<std::uintptr_t, std::size_t>::const_iterator reservation_of(std::uintptr_t a,
                                                                        std::size_t bytes) const {
    auto it = reservations.upper_bound(a);
    if (it == reservations.begin()) return reservations.end();
    --it;
    const std::size_t into = a - it->first;
    if (into >= it->second || bytes > it->second - into) return reservations.end();
    return it;
  }

  /// Whether [a, a + bytes) is device memory one can read and write: inside a plain allocation,
  /// or covered by adjacent mappings.
  [[nodiscard]] bool accessible(std::uintptr_t a, std::size_t bytes) const {
    auto alloc = allocations.upper_bound(a);
    if (alloc != allocations.begin()) {
      --alloc;
      if (a - alloc->first < alloc->second && bytes <= alloc->second - (a - alloc->first)) return true;
    }
    auto it = mappings.upper_bound(a);
    if (it == mappings.begin()) return false;
    --it;
    std::uintptr_t at = a;
    const std::uintptr_t end = a + bytes;
    while (it != mappings.end() && it->first <= at && at < it->first + it->second.bytes) {
      at = it->first + it->second.bytes;
      if (at >= end) return true;
      ++it;
    }
    return false;
  }

  /// Whether any of [a, a + bytes) lies on host pages (create_host_physical) mapped here.
  [[nodiscard]] bool on_host(std::uintptr_t a, std::size_t bytes) const {
    auto it = mappings.upper_bound(a);
    if (it != mappings.begin()) --it;
    for (; it != mappings.end() && it->first < a + bytes; ++it) {
      if (it->first + it->second.bytes <= a) continue;
      const auto p = physical.find(it->second.handle);
      if (p != physical.end() && p->second.host) return true;
    }
    return false;
  }

  /// Whether any mapping intersects [a, a + bytes).
  [[nodiscard]] bool mapped_in(std::uintptr_t a, std::size_t bytes) const {
    auto it = mappings.lower_bound(a);
    if (it != mappings.end() && it->first - a < bytes) return true;
    if (it != mappings.begin()) {
      --it;
      if (a - it->first < it->second.bytes) return true;
    }
    return false;
  }
};

}  // namespace

const char* to_string(SimCall call) noexcept {
  switch (call) {
    case SimCall::allocate: return "allocate";
    case SimCall::deallocate: return "deallocate";
    case SimCall::reserve: return "reserve";
    case SimCall::release_reservation: return "release_reservation";
    case SimCall::create_physical: return "create_physical";
    case SimCall::release_physical: return "release_physical";
    case SimCall::map: return "map";
    case SimCall::unmap: return "unmap";
    case SimCall::create_event: return "create_event";
    case SimCall::destroy_event: return "destroy_event";
    case SimCall::record_event: return "record_event";
    case SimCall::query_event: return "query_event";
    case SimCall::synchronize_event: return "synchronize_event";
    case SimCall::synchronize_stream: return "synchronize_stream";
    case SimCall::set_access: return "set_access";
    case SimCall::copy: return "copy";
    case SimCall::copy_to_host: return "copy_to_host";
    case SimCall::copy_from_host: return "copy_from_host";
    case SimCall::synchronize_device: return "synchronize_device";
    case SimCall::allocate_host: return "allocate_host";
    case SimCall::deallocate_host: return "deallocate_host";
    case SimCall::copy_to_host_async: return "copy_to_host_async";
    case SimCall::copy_from_host_async: return "copy_from_host_async";
    case SimCall::create_host_physical: return "create_host_physical";
    case SimCall::open_file: return "open_file";
    case SimCall::write_file: return "write_file";
    case SimCall::read_file: return "read_file";
    case SimCall::discard_file: return "discard_file";
    case SimCall::close_file: return "close_file";
    case SimCall::count_: return "count_";
  }
  return "unknown";
}

struct SimBackend::Impl {
  mutable std::mutex mutex;
  Options options;
  std::vector<std::unique_ptr<Device>> devices;
  std::unordered_map<event_t, std::unique_ptr<Event>> events;
  std::unordered_map<stream_t, Stream> streams;
  std::array<std::uint64_t, kCallKinds> calls{};
  std::array<std::uint64_t, kCallKinds> call_bytes{};  ///< bytes the calls of each kind asked for
  std::uint64_t bus_copies = 0, bus_copy_bytes = 0;  ///< copies with a side on host pages (spill)
  std::vector<Fault> faults;
  std::uint64_t fired = 0;
  std::uint64_t forced = 0;
  std::uint64_t invalidations = 0;  ///< captures invalidated
  std::map<std::uintptr_t, std::size_t> host_blocks;  ///< pinned host memory: address -> bytes
  std::size_t host_bytes = 0;
  std::size_t host_pages = 0;  ///< bytes of create_host_physical, live
  /// The file calls' own lock (their counts, their faults and the open files): a file call never
  /// waits for a copy that holds `mutex` (the disk tier writes one chunk while it copies the next).
  mutable std::mutex file_mutex;
  std::vector<Fault> file_faults;
  std::uint64_t file_fired = 0;
  std::size_t files = 0;       ///< files of open_file, open
  /// Whether the host budget (sim_host_mb) has room for `bytes` more.
  [[nodiscard]] bool host_fits(std::size_t bytes) const {
    const std::size_t cap = options.host_capacity;
    const std::size_t in_use = host_bytes + host_pages;
    return cap == 0 || (in_use <= cap && bytes <= cap - in_use);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    for (const auto& [a, bytes] : host_blocks) ::munmap(ptr(a), bytes);
  }

  // CUDA's capture rules: what is not permitted on a capturing stream (or, for returning memory,
  // while any stream of the device captures) invalidates the capture and fails.
  [[noreturn]] void capture_violation(Stream& s, const char* call, int device, const char* what) {
    if (!s.invalidated) ++invalidations;
    s.invalidated = true;
    throw backend_error(prefix(call, device) + what +
                        " is not permitted while a stream is capturing a graph "
                        "(cudaErrorStreamCaptureUnsupported); the capture is invalidated");
  }
  void forbid_while_capturing(int device, const char* call) {
    for (auto& [handle, s] : streams)
      if (s.capture_device == device) capture_violation(s, call, device, "returning device memory");
  }
  phys_handle_t last_handle = 0;

  explicit Impl(Options o) : options(o) {
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    if (options.devices < 1) {
      throw backend_error("sim: sim_devices must be at least 1, not " +
                          std::to_string(options.devices));
    }
    if (!is_power_of_two(options.granularity) || options.granularity < page) {
      throw backend_error("sim: granularity " + std::to_string(options.granularity) +
                          " is not a power of two of at least the page size (" +
                          std::to_string(page) + ")");
    }
    const std::size_t hg = options.host_granularity;
    if (hg != 0 && (!is_power_of_two(hg) || hg < page)) {
      throw backend_error("sim: host granularity " + std::to_string(hg) +
                          " is not a power of two of at least the page size (" + std::to_string(page) + ")");
    }
    const std::size_t g = options.granularity;
    for (int i = 0; i < options.devices; ++i) {
      auto d = std::make_unique<Device>();
      const std::string fd_name = "stitch-sim-device" + std::to_string(i);
      d->fd = ::memfd_create(fd_name.c_str(), MFD_CLOEXEC);
      if (d->fd < 0) {
        const int err = errno;
        throw backend_error("sim: device " + std::to_string(i) + ": " +
                            errno_text("memfd_create", err));
      }
      d->capacity = options.capacity;
      d->host_pages = &host_pages;
      // Sparse: costs nothing until pages are touched. Rounded so offsets stay granular.
      d->file_size = options.capacity / g * g + (options.capacity % g ? g : 0);
      if (::ftruncate(d->fd, static_cast<off_t>(d->file_size)) != 0) {
        const int err = errno;
        throw backend_error("sim: device " + std::to_string(i) + ": " +
                            errno_text("ftruncate", err));
      }
      if (d->file_size > 0) d->free_ranges.emplace(0, d->file_size);
      devices.push_back(std::move(d));
    }
  }

  /// Enters a copy between host and device memory (counted, faults injected): checks that the
  /// device side is mapped device memory. False when there is nothing to copy.
  bool enter_host_copy(SimCall call, int device_index, const void* dst, const void* src,
                       std::size_t bytes, bool device_is_dst) {
    (void)enter(call, bytes);
    const char* name = to_string(call);
    Device& d = device(device_index, name);
    if (bytes == 0) return false;
    const std::uintptr_t at = addr(device_is_dst ? dst : src);
    if (!d.accessible(at, bytes))
      throw backend_error(prefix(name, device_index) + (device_is_dst ? "destination [" : "source [") +
                          hex(at) + ", +" + std::to_string(bytes) + ") is not mapped device memory");
    return true;
  }

  /// cuMemcpyDtoH / HtoD: the device side must be mapped device memory; the host side is the
  /// caller's. Synchronous: done when it returns.
  void host_copy(SimCall call, int device_index, void* dst, const void* src, std::size_t bytes,
                 bool device_is_dst) {
    std::lock_guard lock(mutex);
    if (!enter_host_copy(call, device_index, dst, src, bytes, device_is_dst)) return;
    if (options.copy_data) std::memcpy(dst, src, bytes);
  }

  /// cuMemcpyDtoHAsync / HtoDAsync: as host_copy, the host side inside memory of
  /// allocate_host, queued on `stream` (the bytes move at once; done unless the stream is held).
  void host_copy_async(SimCall call, int device_index, void* dst, const void* src,
                       std::size_t bytes, bool device_is_dst, stream_t stream) {
    std::lock_guard lock(mutex);
    if (!enter_host_copy(call, device_index, dst, src, bytes, device_is_dst)) return;
    const char* name = to_string(call);
    const std::uintptr_t host = addr(device_is_dst ? src : dst);
    auto it = host_blocks.upper_bound(host);
    if (it == host_blocks.begin() || host + bytes > std::prev(it)->first + std::prev(it)->second)
      throw backend_error(prefix(name, device_index) + "host memory [" + hex(host) + ", +" +
                          std::to_string(bytes) + ") is not memory of allocate_host");
    Stream& st = streams[stream];
    if (st.capture_device >= 0) capture_violation(st, name, device_index, "a host copy");
    ++st.submitted;
    if (!st.held) st.completed = st.submitted;
    if (options.copy_data) std::memcpy(dst, src, bytes);
  }

  Device& device(int index, const char* call) {
    if (index < 0 || index >= static_cast<int>(devices.size())) {
      throw backend_error(std::string("sim: ") + call + ": invalid device " +
                          std::to_string(index) + " (the simulator has " +
                          std::to_string(devices.size()) + " device(s))");
    }
    return *devices[static_cast<std::size_t>(index)];
  }

  /// Counts a call and fires a fault armed for it. Returns true when the call must report
  /// out-of-memory; throws backend_error for an error fault. Called before anything else.
  bool enter(SimCall call, std::size_t bytes = 0) {
    const std::uint64_t n = ++calls[index_of(call)];
    call_bytes[index_of(call)] += bytes;
    auto armed = [&](const Fault& f) { return f.call == call && f.at == n; };
    auto it = std::find_if(faults.begin(), faults.end(), armed);
    if (it == faults.end()) return false;
    const SimFault fault = it->fault;
    std::erase_if(faults, armed);
    ++fired;
    const bool can_oom = call == SimCall::allocate || call == SimCall::reserve ||
                         call == SimCall::create_physical || call == SimCall::map ||
                         call == SimCall::allocate_host || call == SimCall::create_host_physical;
    if (fault == SimFault::out_of_memory && can_oom) return true;
    throw backend_error(std::string("sim: injected fault in ") + to_string(call));
  }

  /// Counts a file call and returns the fault armed for it, if any (file calls never throw).
  /// The caller holds file_mutex (file calls' counts and faults are under it, not `mutex`).
  std::optional<SimFault> enter_file(SimCall call, std::size_t bytes = 0) noexcept {
    const std::uint64_t n = ++calls[index_of_file(call)];
    call_bytes[index_of_file(call)] += bytes;
    auto armed = [&](const Fault& f) { return f.call == call && f.at == n; };
    auto it = std::find_if(file_faults.begin(), file_faults.end(), armed);
    if (it == file_faults.end()) return std::nullopt;
    const SimFault fault = it->fault;
    std::erase_if(file_faults, armed);
    ++file_fired;
    return fault;
  }
  static std::size_t index_of_file(SimCall call) noexcept { return static_cast<std::size_t>(call); }
  static bool file_call(SimCall call) noexcept {
    return call == SimCall::open_file || call == SimCall::write_file || call == SimCall::read_file ||
           call == SimCall::discard_file || call == SimCall::close_file;
  }

  /// Maps one piece at `va` (map_run's checks and mmap), counting nothing.
  void map_piece(Device& d, int device, char* va, const MapPiece& piece) {
    const phys_handle_t handle = piece.handle;
    const std::size_t bytes = piece.bytes;
    auto h = d.physical.find(handle);
    if (h == d.physical.end() || h->second.released) {
      throw backend_error(prefix("map", device) + "handle " + std::to_string(handle) +
                          (h == d.physical.end() ? " is not a live physical handle"
                                                 : " was released"));
    }
    if (bytes == 0 || bytes > h->second.bytes) {
      throw backend_error(prefix("map", device) + "handle " + std::to_string(handle) + " has " +
                          std::to_string(h->second.bytes) + " bytes, not " +
                          std::to_string(bytes));
    }
    if (bytes % options.granularity != 0) {
      throw backend_error(prefix("map", device) + "size " + std::to_string(bytes) +
                          " is not a multiple of the granularity");
    }
    const std::uintptr_t a = addr(va);
    if (a % options.granularity != 0) {
      throw backend_error(prefix("map", device) + hex(a) + " is not aligned to the granularity");
    }
    if (d.reservation_of(a, bytes) == d.reservations.end()) {
      throw backend_error(prefix("map", device) + "[" + hex(a) + ", +" + std::to_string(bytes) +
                          ") is not inside a reservation");
    }
    if (d.mapped_in(a, bytes)) {
      throw backend_error(prefix("map", device) + "[" + hex(a) + ", +" + std::to_string(bytes) +
                          ") overlaps a mapped range");
    }
    void* p = ::mmap(va, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, d.fd,
                     static_cast<off_t>(h->second.offset));
    if (p == MAP_FAILED) {
      const int err = errno;
      throw backend_error(prefix("map", device) + errno_text("mmap", err));
    }
    d.mappings.emplace(a, Mapping{bytes, handle});
    ++h->second.mappings;
  }

  /// Unmaps [a, a + bytes), which must be exactly a run of adjacent mappings starting at `a`.
  void unmap_range(Device& d, int device, std::uintptr_t a, std::size_t bytes) {
    auto first = d.mappings.find(a);
    auto last = first;
    std::size_t covered = 0;
    while (last != d.mappings.end() && last->first == a + covered && covered < bytes) {
      covered += last->second.bytes;
      ++last;
    }
    if (bytes == 0 || first == d.mappings.end() || covered != bytes) {
      throw backend_error(prefix("unmap", device) + "[" + hex(a) + ", +" +
                          std::to_string(bytes) + ") is not exactly covered by mapped ranges");
    }
    // Put a fresh inaccessible range in place, so that the reservation stays intact.
    void* p = ::mmap(reinterpret_cast<void*>(a), bytes, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      throw backend_error(prefix("unmap", device) + errno_text("mmap", err));
    }
    for (auto it = first; it != last;) {
      auto h = d.physical.find(it->second.handle);
      it = d.mappings.erase(it);
      if (h != d.physical.end() && --h->second.mappings == 0 && h->second.released) {
        d.free_physical(h);
      }
    }
  }

  Event& event(event_t e, int device, const char* call) {
    auto it = events.find(e);
    if (it == events.end()) {
      throw backend_error(prefix(call, device) + hex(addr(e)) + " is not a live event");
    }
    if (it->second->device != device) {
      throw backend_error(prefix(call, device) + "event " + hex(addr(e)) +
                          " was created on device " + std::to_string(it->second->device));
    }
    return *it->second;
  }
};

SimBackend::SimBackend() : SimBackend(Options{}) {}

SimBackend::SimBackend(Options options) : impl_(std::make_unique<Impl>(options)) {}

SimBackend::~SimBackend() = default;

int SimBackend::device_count() { return static_cast<int>(impl_->devices.size()); }

MemoryInfo SimBackend::memory_info(int device) {
  std::lock_guard lock(impl_->mutex);
  const Device& d = impl_->device(device, "memory_info");
  return MemoryInfo{d.used < d.capacity ? d.capacity - d.used : 0, d.capacity};
}

std::size_t SimBackend::granularity(int device) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->device(device, "granularity");
  return impl_->options.granularity;
}

bool SimBackend::supports_virtual_memory(int device) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->device(device, "supports_virtual_memory");
  return true;
}

// ---- plain device memory ----------------------------------------------------------------------

void* SimBackend::allocate(int device, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->enter(SimCall::allocate, bytes)) return nullptr;
  Device& d = impl_->device(device, "allocate");
  if (bytes == 0) throw backend_error(prefix("allocate", device) + "size 0");
  if (!d.fits(bytes)) return nullptr;
  // The address as an anonymous mapping would have it (so replays see the addresses they always
  // saw), its memory from the device's memfd (at a host-page offset), so that another process can
  // map it (export_memory).
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) return nullptr;
    throw backend_error(prefix("allocate", device) + errno_text("mmap", err));
  }
  const std::size_t span = host_pages(bytes);
  std::size_t offset = 0;
  try {
    offset = d.carve(span);
  } catch (...) {
    ::munmap(p, bytes);
    throw;
  }
  if (::mmap(p, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, d.fd, static_cast<off_t>(offset)) ==
      MAP_FAILED) {
    const int err = errno;
    ::munmap(p, bytes);
    d.give_back(offset, span);
    if (err == ENOMEM) return nullptr;
    throw backend_error(prefix("allocate", device) + errno_text("mmap", err));
  }
  d.allocations.emplace(addr(p), bytes);
  d.plain_offsets.emplace(addr(p), offset);
  d.used += bytes;
  return p;
}

void SimBackend::deallocate(int device, void* p, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::deallocate);
  Device& d = impl_->device(device, "deallocate");
  if (p == nullptr) return;  // like cudaFree(nullptr)
  impl_->forbid_while_capturing(device, "deallocate");
  auto it = d.allocations.find(addr(p));
  if (it == d.allocations.end()) {
    for (std::size_t i = 0; i < impl_->devices.size(); ++i) {
      if (impl_->devices[i]->allocations.contains(addr(p))) {
        throw backend_error(prefix("deallocate", device) + hex(addr(p)) +
                            " was allocated on device " + std::to_string(i));
      }
    }
    throw backend_error(prefix("deallocate", device) + hex(addr(p)) +
                        " is not a live allocation");
  }
  if (it->second != bytes) {
    throw backend_error(prefix("deallocate", device) + hex(addr(p)) + " was allocated with " +
                        std::to_string(it->second) + " bytes, not " + std::to_string(bytes));
  }
  if (::munmap(p, bytes) != 0) {
    const int err = errno;
    throw backend_error(prefix("deallocate", device) + errno_text("munmap", err));
  }
  d.allocations.erase(it);
  d.used -= bytes;
  const auto off = d.plain_offsets.find(addr(p));
  d.give_back(off->second, host_pages(bytes));
  d.plain_offsets.erase(off);
}

// ---- virtual memory ---------------------------------------------------------------------------

void* SimBackend::reserve(int device, std::size_t bytes, std::size_t alignment) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->enter(SimCall::reserve)) return nullptr;
  Device& d = impl_->device(device, "reserve");
  const std::size_t g = impl_->options.granularity;
  if (bytes == 0 || bytes % g != 0) {
    throw backend_error(prefix("reserve", device) + "size " + std::to_string(bytes) +
                        " is not a positive multiple of the granularity " + std::to_string(g));
  }
  if (alignment != 0 && !is_power_of_two(alignment)) {
    throw backend_error(prefix("reserve", device) + "alignment " + std::to_string(alignment) +
                        " is not a power of two");
  }
  const std::size_t align = std::max(alignment, g);
  if (bytes > SIZE_MAX - align) return nullptr;
  // Over-reserve by `align`, then trim both ends so that the range starts aligned.
  const std::size_t total = bytes + align;
  void* raw = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                     0);
  if (raw == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) return nullptr;
    throw backend_error(prefix("reserve", device) + errno_text("mmap", err));
  }
  const std::uintptr_t base = (addr(raw) + align - 1) & ~(static_cast<std::uintptr_t>(align) - 1);
  const std::size_t head = base - addr(raw);
  const std::size_t tail = total - head - bytes;
  if (head > 0) ::munmap(raw, head);
  if (tail > 0) ::munmap(ptr(base + bytes), tail);
  d.reservations.emplace(base, bytes);
  return ptr(base);
}

void SimBackend::release_reservation(int device, void* va, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::release_reservation);
  Device& d = impl_->device(device, "release_reservation");
  const char* call = "release_reservation";
  auto it = d.reservations.find(addr(va));
  if (it == d.reservations.end()) {
    throw backend_error(prefix(call, device) + hex(addr(va)) + " is not a live reservation");
  }
  if (it->second != bytes) {
    throw backend_error(prefix(call, device) + "reservation " + hex(addr(va)) + " has " +
                        std::to_string(it->second) + " bytes, not " + std::to_string(bytes));
  }
  if (d.mapped_in(addr(va), bytes)) {
    throw backend_error(prefix(call, device) + "reservation " + hex(addr(va)) +
                        " still has mapped ranges");
  }
  if (::munmap(va, bytes) != 0) {
    const int err = errno;
    throw backend_error(prefix(call, device) + errno_text("munmap", err));
  }
  d.reservations.erase(it);
}

phys_handle_t SimBackend::create_physical(int device, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->enter(SimCall::create_physical, bytes)) return 0;
  Device& d = impl_->device(device, "create_physical");
  const std::size_t g = impl_->options.granularity;
  if (bytes == 0 || bytes % g != 0) {
    throw backend_error(prefix("create_physical", device) + "size " + std::to_string(bytes) +
                        " is not a positive multiple of the granularity " + std::to_string(g));
  }
  if (!d.fits(bytes)) return 0;
  const std::size_t offset = d.carve(bytes);
  const phys_handle_t handle = ++impl_->last_handle;
  d.physical.emplace(handle, Physical{offset, bytes, 0, false});
  d.used += bytes;
  return handle;
}

void SimBackend::release_physical(int device, phys_handle_t handle) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::release_physical);
  Device& d = impl_->device(device, "release_physical");
  auto it = d.physical.find(handle);
  if (it == d.physical.end() || it->second.released) {
    throw backend_error(prefix("release_physical", device) + "handle " + std::to_string(handle) +
                        (it == d.physical.end() ? " is not a live physical handle"
                                                : " was already released"));
  }
  it->second.released = true;
  if (it->second.mappings == 0) d.free_physical(it);
}

bool SimBackend::map_run(int device, void* va, const MapPiece* pieces, std::size_t count) {
  std::lock_guard lock(impl_->mutex);
  Device& d = impl_->device(device, "map");
  // All or nothing: on any failure the pieces mapped so far are unmapped again.
  std::size_t mapped = 0;  // bytes
  auto undo = [&] {
    if (mapped > 0) impl_->unmap_range(d, device, addr(va), mapped);
  };
  try {
    if (count == 0) throw backend_error(prefix("map", device) + "no pieces");
    for (std::size_t k = 0; k < count; ++k) {
      if (impl_->enter(SimCall::map, pieces[k].bytes)) {
        undo();
        return false;  // injected: out of memory while mapping (cuMemMap can report it)
      }
      impl_->map_piece(d, device, static_cast<char*>(va) + mapped, pieces[k]);
      mapped += pieces[k].bytes;
    }
    (void)impl_->enter(SimCall::set_access, mapped);
  } catch (...) {
    undo();
    throw;
  }
  return true;
}

void SimBackend::unmap(int device, void* va, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::unmap, bytes);
  Device& d = impl_->device(device, "unmap");
  impl_->forbid_while_capturing(device, "unmap");
  impl_->unmap_range(d, device, addr(va), bytes);
}

// ---- events and streams -----------------------------------------------------------------------

event_t SimBackend::create_event(int device) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::create_event);
  Device& d = impl_->device(device, "create_event");
  auto e = std::make_unique<Event>();
  e->device = device;
  event_t handle = e.get();
  impl_->events.emplace(handle, std::move(e));
  ++d.events;
  return handle;
}

void SimBackend::destroy_event(int device, event_t event) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::destroy_event);
  Device& d = impl_->device(device, "destroy_event");
  (void)impl_->event(event, device, "destroy_event");
  impl_->events.erase(event);
  --d.events;
}

void SimBackend::record_event(int device, event_t event, stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::record_event);
  (void)impl_->device(device, "record_event");
  Event& e = impl_->event(event, device, "record_event");
  Stream& s = impl_->streams[stream];
  e.stream = stream;
  e.captured = s.capture_device >= 0;
  if (e.captured) {  // a node of the graph being captured: no work on the stream
    e.recorded = false;
    return;
  }
  e.recorded = true;
  e.seq = ++s.submitted;
  if (!s.held) s.completed = s.submitted;
}

bool SimBackend::query_event(int device, event_t event) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::query_event);
  (void)impl_->device(device, "query_event");
  const Event& e = impl_->event(event, device, "query_event");
  if (e.captured) {
    Stream& s = impl_->streams[e.stream];
    if (s.capture_device >= 0) impl_->capture_violation(s, "query_event", device, "querying an event it captured");
  }
  if (!e.recorded) return true;
  auto s = impl_->streams.find(e.stream);
  return s == impl_->streams.end() || s->second.completed >= e.seq;
}

void SimBackend::synchronize_event(int device, event_t event) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::synchronize_event);
  (void)impl_->device(device, "synchronize_event");
  const Event& e = impl_->event(event, device, "synchronize_event");
  if (e.captured) {
    Stream& s = impl_->streams[e.stream];
    if (s.capture_device >= 0)
      impl_->capture_violation(s, "synchronize_event", device, "waiting for an event it captured");
  }
  if (!e.recorded) return;
  Stream& s = impl_->streams[e.stream];
  if (s.completed < e.seq) {
    // The stream is held: waiting would never end, so let time pass up to the event.
    s.completed = e.seq;
    ++impl_->forced;
  }
}

void SimBackend::synchronize_stream(int device, stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::synchronize_stream);
  (void)impl_->device(device, "synchronize_stream");
  auto it = impl_->streams.find(stream);
  if (it == impl_->streams.end()) return;
  Stream& s = it->second;
  if (s.capture_device >= 0)
    impl_->capture_violation(s, "synchronize_stream", device, "synchronizing the stream");
  if (s.completed < s.submitted) {
    s.completed = s.submitted;  // held: complete everything submitted so far; stays held
    ++impl_->forced;
  }
}

void SimBackend::copy(int device, void* dst, const void* src, std::size_t bytes, stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::copy, bytes);
  Device& d = impl_->device(device, "copy");
  if (bytes == 0) return;
  for (const auto& [what, p] : {std::pair{"source", addr(src)}, std::pair{"destination", addr(dst)}})
    if (!d.accessible(p, bytes))
      throw backend_error(prefix("copy", device) + what + " [" + hex(p) + ", +" +
                          std::to_string(bytes) + ") is not mapped device memory");
  const std::uintptr_t s = addr(src), t = addr(dst);
  if (s < t + bytes && t < s + bytes)
    throw backend_error(prefix("copy", device) + "the source and destination overlap");
  if (d.on_host(s, bytes) || d.on_host(t, bytes)) {
    ++impl_->bus_copies;
    impl_->bus_copy_bytes += bytes;
  }
  Stream& st = impl_->streams[stream];
  if (st.capture_device >= 0)
    impl_->capture_violation(st, "copy", device, "a copy (not modelled in a capture)");
  // The work of the stream: done at once unless the stream is held (the bytes move at once;
  // nothing may read them before a sync, which the caller does).
  ++st.submitted;
  if (!st.held) st.completed = st.submitted;
  if (impl_->options.copy_data) std::memcpy(dst, src, bytes);
}

void SimBackend::copy_to_host(int device, void* dst, const void* src, std::size_t bytes) {
  impl_->host_copy(SimCall::copy_to_host, device, dst, src, bytes, /*device_is_dst=*/false);
}

void SimBackend::copy_from_host(int device, void* dst, const void* src, std::size_t bytes) {
  impl_->host_copy(SimCall::copy_from_host, device, dst, src, bytes, /*device_is_dst=*/true);
}

void* SimBackend::allocate_host(int device, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->enter(SimCall::allocate_host, bytes)) return nullptr;
  (void)impl_->device(device, "allocate_host");
  if (bytes == 0) throw backend_error(prefix("allocate_host", device) + "0 bytes");
  if (!impl_->host_fits(bytes)) return nullptr;  // sim_host_mb
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  impl_->host_blocks.emplace(addr(p), bytes);
  impl_->host_bytes += bytes;
  return p;
}

bool SimBackend::protect_read_only(int device, void* va, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::set_access, bytes);
  Device& d = impl_->device(device, "protect_read_only");
  if (!d.accessible(addr(va), bytes))
    throw backend_error(prefix("protect_read_only", device) + "[" + hex(addr(va)) + ", +" + std::to_string(bytes) +
                        ") is not mapped device memory");
  if (::mprotect(va, bytes, PROT_READ) != 0)
    throw backend_error(prefix("protect_read_only", device) + "mprotect failed");
  return true;
}

std::size_t SimBackend::host_granularity(int device) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->device(device, "host_granularity");
  return impl_->options.host_granularity != 0 ? impl_->options.host_granularity : impl_->options.granularity;
}

phys_handle_t SimBackend::create_host_physical(int device, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->enter(SimCall::create_host_physical, bytes)) return 0;
  Device& d = impl_->device(device, "create_host_physical");
  const std::size_t g = impl_->options.host_granularity != 0 ? impl_->options.host_granularity : impl_->options.granularity;
  if (bytes == 0 || bytes % g != 0) {
    throw backend_error(prefix("create_host_physical", device) + "size " + std::to_string(bytes) +
                        " is not a positive multiple of the host granularity " + std::to_string(g));
  }
  if (!impl_->host_fits(bytes)) return 0;  // sim_host_mb
  // Host pages live in the device's memfd too (one file maps them all), charged to the host.
  const std::size_t offset = d.carve(bytes);
  const phys_handle_t handle = ++impl_->last_handle;
  d.physical.emplace(handle, Physical{offset, bytes, 0, false, true});
  impl_->host_pages += bytes;
  return handle;
}

void SimBackend::deallocate_host(int device, void* p, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::deallocate_host);
  (void)impl_->device(device, "deallocate_host");
  auto it = impl_->host_blocks.find(addr(p));
  if (it == impl_->host_blocks.end() || it->second != bytes)
    throw backend_error(prefix("deallocate_host", device) + hex(addr(p)) + " (" +
                        std::to_string(bytes) + " bytes) is not memory of allocate_host");
  ::munmap(p, bytes);
  impl_->host_bytes -= bytes;
  impl_->host_blocks.erase(it);
}

void SimBackend::copy_to_host_async(int device, void* dst, const void* src, std::size_t bytes,
                                    stream_t stream) {
  impl_->host_copy_async(SimCall::copy_to_host_async, device, dst, src, bytes,
                         /*device_is_dst=*/false, stream);
}

void SimBackend::copy_from_host_async(int device, void* dst, const void* src, std::size_t bytes,
                                      stream_t stream) {
  impl_->host_copy_async(SimCall::copy_from_host_async, device, dst, src, bytes,
                         /*device_is_dst=*/true, stream);
}

void SimBackend::synchronize_device(int device) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->enter(SimCall::synchronize_device);
  (void)impl_->device(device, "synchronize_device");
  // Every stream (the simulator's streams are not per device): capturing ones break, as
  // cuCtxSynchronize does to a capture; held ones complete what was submitted and stay held.
  for (auto& [handle, st] : impl_->streams)
    if (st.capture_device == device)
      impl_->capture_violation(st, "synchronize_device", device, "synchronizing the device");
  for (auto& [handle, st] : impl_->streams) {
    if (st.completed < st.submitted) {
      st.completed = st.submitted;
      ++impl_->forced;
    }
  }
}

// ---- test controls ----------------------------------------------------------------------------

void SimBackend::hold_stream(stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  impl_->streams[stream].held = true;
}

void SimBackend::release_stream(stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  Stream& s = impl_->streams[stream];
  s.completed = s.submitted;
  s.held = false;
}

void SimBackend::begin_capture(int device, stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->device(device, "begin_capture");
  Stream& s = impl_->streams[stream];
  if (s.capture_device >= 0) throw invalid_argument("sim: begin_capture: the stream is already capturing");
  s.capture_device = device;
  s.invalidated = false;
}

bool SimBackend::end_capture(stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  Stream& s = impl_->streams[stream];
  if (s.capture_device < 0) throw invalid_argument("sim: end_capture: the stream is not capturing");
  s.capture_device = -1;
  return !s.invalidated;
}

namespace {

/// What an injected fault does to a file call that is not a short one: its -errno.
std::int64_t file_errno(SimFault fault) noexcept {
  return fault == SimFault::out_of_memory || fault == SimFault::no_space ? -ENOSPC : -EIO;
}

/// A short read or write: half of `bytes`, rounded down to 4 KiB where that leaves any.
std::size_t short_part(std::size_t bytes) noexcept {
  const std::size_t half = bytes / 2;
  const std::size_t aligned = half / Backend::kFileAlignment * Backend::kFileAlignment;
  return aligned != 0 ? aligned : half;
}

}  // namespace

int SimBackend::open_file(int device, const char* dir, bool* direct) noexcept {
  std::optional<SimFault> fault;
  {
    std::lock_guard lock(impl_->file_mutex);
    fault = impl_->enter_file(SimCall::open_file);
    if (device < 0 || device >= static_cast<int>(impl_->devices.size())) return -EINVAL;
  }
  if (direct != nullptr) *direct = false;
  if (fault) return static_cast<int>(file_errno(*fault));
  const int fd = Backend::open_file(device, dir, direct);
  if (fd >= 0) {
    std::lock_guard lock(impl_->file_mutex);
    ++impl_->files;
  }
  return fd;
}

std::int64_t SimBackend::write_file(int device, int fd, const void* src, std::size_t bytes,
                                    std::uint64_t offset) noexcept {
  return file_io(SimCall::write_file, device, fd, const_cast<void*>(src), bytes, offset);
}

std::int64_t SimBackend::read_file(int device, int fd, void* dst, std::size_t bytes,
                                   std::uint64_t offset) noexcept {
  return file_io(SimCall::read_file, device, fd, dst, bytes, offset);
}

std::int64_t SimBackend::file_io(SimCall call, int device, int fd, void* buf, std::size_t bytes,
                                 std::uint64_t offset) noexcept {
  std::optional<SimFault> fault;
  {
    std::lock_guard lock(impl_->file_mutex);
    fault = impl_->enter_file(call, bytes);
  }
  if (fault && *fault != SimFault::short_io) return file_errno(*fault);
  const std::size_t n = fault ? short_part(bytes) : bytes;
  return call == SimCall::write_file ? Backend::write_file(device, fd, buf, n, offset)
                                     : Backend::read_file(device, fd, buf, n, offset);
}

int SimBackend::discard_file(int device, int fd, std::uint64_t offset, std::uint64_t bytes) noexcept {
  std::optional<SimFault> fault;
  {
    std::lock_guard lock(impl_->file_mutex);
    fault = impl_->enter_file(SimCall::discard_file, static_cast<std::size_t>(bytes));
  }
  if (fault) return static_cast<int>(file_errno(*fault));
  return Backend::discard_file(device, fd, offset, bytes);
}

void SimBackend::close_file(int device, int fd) noexcept {
  {
    std::lock_guard lock(impl_->file_mutex);
    ++impl_->calls[static_cast<std::size_t>(SimCall::close_file)];  // (no fault fires here)
    if (fd >= 0 && impl_->files > 0) --impl_->files;
  }
  Backend::close_file(device, fd);
}

bool SimBackend::is_capturing(int device, stream_t stream) {
  std::lock_guard lock(impl_->mutex);
  (void)impl_->device(device, "is_capturing");
  auto it = impl_->streams.find(stream);
  return it != impl_->streams.end() && it->second.capture_device >= 0;
}

std::uint64_t SimBackend::capture_invalidations() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->invalidations;
}

std::uint64_t SimBackend::forced_completions() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->forced;
}

void SimBackend::inject_fault(SimCall call, std::uint64_t nth, SimFault fault) {
  std::lock_guard lock(impl_->mutex);
  const std::size_t i = index_of(call);
  if (nth == 0) throw invalid_argument("sim: inject_fault: nth counts from 1");
  if (fault != SimFault::out_of_memory && fault != SimFault::error) {
    const bool file_call = call == SimCall::open_file || call == SimCall::write_file ||
                           call == SimCall::read_file || call == SimCall::discard_file;
    const bool file_fault = fault == SimFault::short_io || fault == SimFault::no_space || fault == SimFault::io_error;
    if (!file_fault) throw invalid_argument("sim: inject_fault: invalid SimFault value");
    if (!file_call)
      throw invalid_argument(std::string("sim: inject_fault: short_io, no_space and io_error are for the file "
                                         "calls, not ") + to_string(call));
  }
  if (Impl::file_call(call)) {
    std::lock_guard files(impl_->file_mutex);
    impl_->file_faults.push_back(Fault{call, impl_->calls[i] + nth, fault});
    return;
  }
  impl_->faults.push_back(Fault{call, impl_->calls[i] + nth, fault});
}

void SimBackend::clear_faults() {
  std::lock_guard lock(impl_->mutex);
  impl_->faults.clear();
  std::lock_guard files(impl_->file_mutex);
  impl_->file_faults.clear();
}

std::uint64_t SimBackend::call_count(SimCall call) const {
  std::lock_guard lock(impl_->mutex);
  std::lock_guard files(impl_->file_mutex);
  return impl_->calls[index_of(call)];
}

std::pair<std::uint64_t, std::uint64_t> SimBackend::bus_copies() const {
  std::lock_guard lock(impl_->mutex);
  return {impl_->bus_copies, impl_->bus_copy_bytes};
}

std::uint64_t SimBackend::call_bytes(SimCall call) const {
  std::lock_guard lock(impl_->mutex);
  std::lock_guard files(impl_->file_mutex);
  return impl_->call_bytes[index_of(call)];
}

std::uint64_t SimBackend::faults_fired() const {
  std::lock_guard lock(impl_->mutex);
  std::lock_guard files(impl_->file_mutex);
  return impl_->fired + impl_->file_fired;
}

SimUsage SimBackend::usage(int device) const {
  std::lock_guard lock(impl_->mutex);
  const Device& d = impl_->device(device, "usage");
  SimUsage u;
  u.capacity = d.capacity;
  u.used = d.used;
  u.allocations = d.allocations.size();
  u.physical_handles = d.physical.size();
  u.reservations = d.reservations.size();
  u.mappings = d.mappings.size();
  u.events = d.events;
  u.host_bytes = impl_->host_bytes;
  u.host_allocations = impl_->host_blocks.size();
  u.host_pages = impl_->host_pages;
  {
    std::lock_guard files(impl_->file_mutex);
    u.files = impl_->files;
  }
  return u;
}

void SimBackend::set_capacity(int device, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  impl_->device(device, "set_capacity").capacity = bytes;
}

// ---- memory another process maps ------------------------------------------------------------

std::string SimBackend::export_memory(int device, const void* va, std::size_t bytes, std::size_t* offset) {
  std::lock_guard lock(impl_->mutex);
  Device& d = impl_->device(device, "export_memory");
  const std::string head = "sim:" + std::to_string(::getpid()) + ":" + std::to_string(d.fd) + ":";
  // A plain allocation: its pages from the host page that holds `va` on.
  auto plain = d.allocations.upper_bound(addr(va));
  if (plain != d.allocations.begin() && addr(va) < std::prev(plain)->first + std::prev(plain)->second) {
    --plain;
    if (addr(va) + bytes > plain->first + plain->second)
      throw backend_error(prefix("export_memory", device) + "[" + hex(addr(va)) + ", +" + std::to_string(bytes) +
                          ") runs past its allocation");
    const std::size_t page = host_pages(1);
    const std::size_t at = d.plain_offsets.at(plain->first) + (addr(va) - plain->first);
    const std::size_t start = at / page * page;
    *offset = at - start;
    return head + std::to_string(start) + "+" + std::to_string(host_pages(*offset + bytes));
  }
  // Mapped memory of the virtual-memory calls: whole granules.
  const std::size_t granule = impl_->options.granularity;
  const std::uintptr_t a = addr(va) / granule * granule;
  *offset = addr(va) - a;
  bytes = (*offset + bytes + granule - 1) / granule * granule;
  std::string pieces;
  std::uintptr_t at = a;
  auto it = d.mappings.upper_bound(a);
  if (it != d.mappings.begin()) --it;
  while (at < a + bytes) {
    if (it == d.mappings.end() || it->first > at || at >= it->first + it->second.bytes) {
      throw backend_error(prefix("export_memory", device) + "[" + hex(at) +
                          ") is not mapped memory of this device");
    }
    const Physical& p = d.physical.at(it->second.handle);
    const std::size_t skip = at - it->first;
    const std::size_t len = std::min<std::size_t>(it->second.bytes - skip, a + bytes - at);
    pieces += (pieces.empty() ? "" : ",") + std::to_string(p.offset + skip) + "+" + std::to_string(len);
    at += len;
    ++it;
  }
  return head + pieces;
}

std::size_t SimBackend::export_size(int device, const void* va, std::size_t bytes, std::size_t* offset) {
  return export_memory(device, va, bytes, offset).size();
}

void* SimBackend::import_memory(int device, const std::string& handle, std::size_t* bytes) {
  // sim:<pid>:<fd>:<offset>+<length>,... (stitch/ipc_handle.hpp), from another process: hostile
  // input. The pieces are checked against the memfd they name (a page past its end would be a
  // SIGBUS at the first touch), and a refused handle maps nothing and leaves nothing open.
  const auto bad = [&](const std::string& why) {
    return backend_error(prefix("import_memory", device) + "handle '" + handle.substr(0, 120) + "': " + why);
  };
  {
    std::lock_guard lock(impl_->mutex);
    (void)impl_->device(device, "import_memory");
  }
  std::string why;
  const std::optional<ipc::SimShare> share = ipc::decode_sim(handle, host_pages(1), &why);
  if (!share) throw bad("not a handle of backend:sim: " + why);
  const std::string path = "/proc/" + std::to_string(share->pid) + "/fd/" + std::to_string(share->fd);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {  // (follows the link without opening what it names)
    const int err = errno;
    throw bad(errno_text(("stat " + path).c_str(), err) +
              " (the exporting process ended, has no such descriptor, or belongs to another user)");
  }
  if (!S_ISREG(st.st_mode)) throw bad(path + " is not backend:sim's device memory (not a memfd)");
  struct File {
    int fd;
    ~File() {
      if (fd >= 0) ::close(fd);
    }
  } file{::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (file.fd < 0) {
    const int err = errno;
    throw bad(errno_text(("open " + path).c_str(), err) +
              " (the exporting process ended, or belongs to another user)");
  }
  // What was opened (the descriptor may have changed since the stat): a device memfd of
  // backend:sim, and how long it is.
  char target[128] = {};
  const std::string self = "/proc/self/fd/" + std::to_string(file.fd);
  const ssize_t n = ::readlink(self.c_str(), target, sizeof target - 1);
  constexpr std::string_view kMemfd = "/memfd:stitch-sim-device";
  if (n <= 0 || std::string_view(target, static_cast<std::size_t>(n)).substr(0, kMemfd.size()) != kMemfd)
    throw bad(path + " is not backend:sim's device memory (it is " +
              (n > 0 ? std::string(target, static_cast<std::size_t>(n)) : std::string("unreadable")) + ")");
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0) throw bad("fstat of " + path + " failed");
  const auto size = static_cast<std::size_t>(st.st_size);
  for (const ipc::SimPiece& p : share->pieces)
    if (!ipc::lies_within(p.offset, p.length, size))
      throw bad("piece " + std::to_string(p.offset) + "+" + std::to_string(p.length) +
                " runs past the exporter's device memory (" + std::to_string(size) + " bytes)");
  std::lock_guard lock(impl_->mutex);
  Device& d = impl_->device(device, "import_memory");
  const std::size_t total = share->total;
  void* base = ::mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    throw bad(errno_text("mmap", err));
  }
  std::size_t at = 0;
  for (const ipc::SimPiece& p : share->pieces) {
    void* q = ::mmap(static_cast<char*>(base) + at, p.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, file.fd,
                     static_cast<off_t>(p.offset));
    if (q == MAP_FAILED) {
      const int err = errno;
      ::munmap(base, total);
      throw bad(errno_text("mmap", err));
    }
    at += p.length;
  }
  try {
    d.imports.emplace(addr(base), total);
  } catch (...) {
    ::munmap(base, total);
    throw;
  }
  *bytes = total;
  return base;
}

void SimBackend::close_imported(int device, void* va, std::size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  Device& d = impl_->device(device, "close_imported");
  auto it = d.imports.find(addr(va));
  if (it == d.imports.end() || it->second != bytes)
    throw backend_error(prefix("close_imported", device) + "[" + hex(addr(va)) + ", +" +
                        std::to_string(bytes) + ") is not memory import_memory() returned");
  ::munmap(va, bytes);
  d.imports.erase(it);
}

}  // namespace stitch

// fuzz/fuzz_ipc_handles.cpp — libFuzzer target: every IPC handle format stitch reads
// (stitch/ipc_handle.hpp): the stitch1 text, backend:sim's and backend:cuda's shares and PyTorch's
// binary 'c' / 'e' / 's' handles, each parser fed the same bytes, and the simulated device's
// importer behind them. Checks: every refusal says why; whatever is accepted re-encodes to the
// same text (so nothing was ignored or trailing), its numbers hold together without wrapping
// (offset + size, the pieces' sum, whole pages), a PyTorch handle becomes a stitch1 text that
// parses; and an import of a fuzzed handle, pointed at this process's own simulated device
// memory, either fails with an error or maps memory whose every byte can be read (no SIGBUS, no
// pointer outside the mapping), leaving no descriptor open.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/ipc_handle.hpp"
#include "stitch/sim_backend.hpp"
#include "support/process_state.hpp"

namespace {

namespace ipc = stitch::ipc;

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_ipc_handles: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) broken(what);
}

/// A parser's refusal must say why.
template <class T>
bool accepted(const std::optional<T>& parsed, const std::string& why) {
  if (!parsed) check(!why.empty(), "a refusal without a reason");
  return parsed.has_value();
}

// ---- figures of the run ----------------------------------------------------------------------------

struct Figures {
  unsigned long long inputs = 0, stitch1 = 0, sim = 0, cuda = 0, torch = 0, imports = 0, mapped = 0;
};
Figures g_figures;

void print_figures() {
  const Figures& f = g_figures;
  std::fprintf(stderr,
               "fuzz_ipc_handles: %llu inputs; accepted: %llu stitch1 texts, %llu sim shares, %llu cuda shares, "
               "%llu PyTorch handles; %llu imports tried, %llu mapped and read, the others refused with an error\n",
               f.inputs, f.stitch1, f.sim, f.cuda, f.torch, f.imports, f.mapped);
}

using stitch::test::open_descriptors;

/// An allocator over a small simulated device with one live exported block: the memory fuzzed
/// sim handles are pointed at (this process, its device memfd).
struct Exporter {
  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<stitch::Allocator> alloc;
  ipc::SimShare own;
  Exporter() {
    stitch::SimBackend::Options o;
    o.capacity = std::size_t{64} << 20;
    sim = std::make_shared<stitch::SimBackend>(o);
    alloc = std::make_unique<stitch::Allocator>(stitch::Config::parse("backend:sim,expandable_segments:True"), sim);
    void* p = alloc->allocate(std::size_t{3} << 20);
    const auto h = ipc::parse(alloc->export_block(p));
    check(h.has_value(), "the exporter's handle does not parse");
    const auto s = ipc::decode_sim(h->share, static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
    check(s.has_value(), "the exporter's share does not parse");
    own = *s;
  }
};

Exporter& exporter() {
  static Exporter* e = new Exporter;  // (kept for the whole run)
  return *e;
}

void try_import(const ipc::BlockHandle& h, ipc::SimShare share) {
  Exporter& e = exporter();
  share.pid = static_cast<int>(::getpid());  // this process's device memory, so that the
  share.fd = e.own.fd;                       // fuzzed pieces and bounds are what is tested
  const std::string text = ipc::format({h.device % 2, h.offset, h.size, ipc::encode_sim(share)});
  const std::size_t fds = open_descriptors();
  ++g_figures.imports;
  void* p = nullptr;
  try {
    p = e.alloc->import_block(text, 0);
  } catch (const stitch::error& err) {
    check(*err.what() != '\0', "an import refused without a message");
    check(open_descriptors() == fds, "a refused import left a descriptor open");
    return;
  }
  // Accepted: the block lies in the mapping, and every piece under it is backed (a piece past the
  // memfd's end would be a SIGBUS here): the first and last byte of each piece, and of the block.
  const auto* base = static_cast<const volatile unsigned char*>(p) - h.offset;
  unsigned sum = 0;
  std::size_t at = 0;
  for (const ipc::SimPiece& piece : share.pieces) {
    sum += base[at] + base[at + piece.length - 1];
    at += piece.length;
  }
  check(h.offset <= share.total && h.size <= share.total - h.offset, "an import outside its mapping");
  if (h.size > 0) sum += base[h.offset] + base[h.offset + h.size - 1];
  (void)sum;
  ++g_figures.mapped;
  e.alloc->close_block(p);
  check(open_descriptors() == fds, "an import left a descriptor open");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(print_figures);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ++g_figures.inputs;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::size_t page = 4096;
  std::string why;

  // The stitch1 text.
  const std::optional<ipc::BlockHandle> block = ipc::parse(bytes, &why);
  if (accepted(block, why)) {
    ++g_figures.stitch1;
    check(ipc::format(*block) == bytes, "a stitch1 handle does not re-encode to itself");
    std::size_t end = 0;
    check(ipc::checked_add(block->offset, block->size, &end), "an accepted handle's block wraps");
    check(block->device >= 0, "an accepted handle's device is negative");
  }
  // The back ends' shares, alone and inside an accepted stitch1 text.
  const std::string_view share = block ? std::string_view(block->share) : bytes;
  why.clear();
  const std::optional<ipc::SimShare> sim = ipc::decode_sim(share, page, &why);
  if (accepted(sim, why)) {
    ++g_figures.sim;
    check(ipc::encode_sim(*sim) == share, "a sim share does not re-encode to itself");
    std::size_t total = 0, end = 0;
    for (const ipc::SimPiece& p : sim->pieces) {
      check(p.length > 0 && p.offset % page == 0 && p.length % page == 0, "a sim piece is not whole pages");
      check(ipc::checked_add(p.offset, p.length, &end) && ipc::checked_add(total, p.length, &total),
            "sim pieces wrap");
    }
    check(total == sim->total && sim->pid > 0 && sim->fd >= 0, "a sim share's totals or ids are wrong");
    if (block) try_import(*block, *sim);
  }
  why.clear();
  const std::optional<ipc::CudaShare> cuda = ipc::decode_cuda(share, &why);
  if (accepted(cuda, why)) {
    ++g_figures.cuda;
    check(ipc::encode(*cuda) == share, "a cuda share does not re-encode to itself");
    std::size_t total = 0;
    for (const ipc::Piece& p : cuda->pieces) check(p.bytes > 0 && ipc::checked_add(total, p.bytes, &total), "cuda pieces wrap");
    check(cuda->kind == ipc::Kind::legacy || !cuda->pieces.empty(), "a cuda share without pieces");
    check(cuda->kind != ipc::Kind::fd || cuda->pid > 0, "a cuda share's pid is not positive");
    // What the PyTorch layer writes for it reads back.
    const std::string text = ipc::format({0, 0, 0, std::string(share)});
    why.clear();
    check(accepted(ipc::parse_torch(ipc::torch_handle(text), 0, &why), why), "torch_handle writes what parse_torch refuses");
  }
  // PyTorch's binary handles.
  why.clear();
  const auto torch = ipc::parse_torch(bytes, static_cast<int>(size % 3), &why);
  if (accepted(torch, why)) {
    ++g_figures.torch;
    why.clear();
    const auto again = ipc::parse(torch->text, &why);
    check(again.has_value(), "parse_torch made a stitch1 text that does not parse");
    check(again->offset == torch->block_offset || torch->block_offset == 0, "a torch import's offset is not its block's");
  }
  return 0;
}

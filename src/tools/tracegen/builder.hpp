// tools/tracegen/builder.hpp — the machinery the trace patterns are written with:
//   Rng       a portable random number generator (xoshiro256**) with integer-only draws;
//   Trace     emits alloc / free_requested / free_completed events and hands out addresses;
//   Autograd  a miniature of PyTorch's autograd: tensors are freed when their last reference
//             (the program's or a saved-for-backward one) goes, and backward() walks the recorded
//             ops in reverse, allocating input and parameter gradients and freeing what each op
//             saved, in the order PyTorch's engine does;
//   adam_step PyTorch's foreach AdamW (state on the first step, one temporary per parameter) and
//             zero_grad(set_to_none=True).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stitch/snapshot.hpp"

namespace stitch::tracegen::detail {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kBf16 = 2, kFp32 = 4, kInt64 = 8;

/// xoshiro256** seeded through splitmix64: the same numbers on every platform and library
/// (std::uniform_int_distribution is not portable across standard libraries).
class Rng {
 public:
  explicit Rng(std::uint64_t seed);
  std::uint64_t next();
  /// Uniform in [0, n) (n > 0), without modulo bias.
  std::uint64_t below(std::uint64_t n);
  /// Uniform in [lo, hi].
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) { return lo + below(hi - lo + 1); }

 private:
  std::uint64_t s_[4];
};

/// A device block as the trace names it.
struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  [[nodiscard]] bool valid() const { return addr != 0; }
};

/// Synthetic device addresses: best fit (smallest free range that fits, lowest address first, as
/// PyTorch picks blocks) over two address ranges, one for small requests (<= 1 MiB) and one for
/// large ones, in 512-byte units. Freed ranges coalesce. An address is reused only after its
/// free_completed, so live blocks never share an address.
class AddressSpace {
 public:
  AddressSpace();
  std::uintptr_t take(std::size_t bytes);
  void give(std::uintptr_t addr, std::size_t bytes);

 private:
  struct Arena {
    std::map<std::uintptr_t, std::size_t> by_addr;          // free ranges
    std::set<std::pair<std::size_t, std::uintptr_t>> by_size;
  };
  static std::size_t rounded(std::size_t bytes);
  Arena& arena_for(std::size_t bytes);
  Arena small_, large_;
};

/// Event emitter. Frees of blocks used on one stream complete at once (free_requested then
/// free_completed, as PyTorch records them); a block used on another stream completes later,
/// when PyTorch's allocator would see that stream's event complete: just before one of the next
/// allocations (PyTorch processes events at the start of malloc) or at a synchronization.
class Trace {
 public:
  Trace(std::string pattern, bool frames);

  Block alloc(std::size_t bytes, std::uintptr_t stream, std::string_view what);
  /// Frees a block whose last use was on its own stream.
  void free(Block& b);
  /// Frees a block that was also used on another stream: free_completed comes just before the
  /// `after_allocs`-th next allocation (or at sync()).
  void free_used_elsewhere(Block& b, std::size_t after_allocs);
  /// torch.cuda.synchronize(): every pending free completes.
  void sync();
  [[nodiscard]] std::size_t events() const { return events_.size(); }
  /// The events (pending frees completed first).
  std::vector<TraceEntry> finish();

 private:
  void emit(TraceAction action, const Block& b, std::string_view what);
  void complete(const Block& b);
  struct Pending {
    Block block;
    std::size_t allocs_left;
  };
  std::string pattern_;
  bool frames_;
  AddressSpace space_;
  std::vector<TraceEntry> events_;
  std::vector<Pending> pending_;
};

/// A parameter: its data is allocated by the pattern (or not at all when it lives elsewhere);
/// autograd gives it a gradient when it is trainable.
struct Param {
  std::string name;
  std::size_t bytes = 0;
  bool trainable = true;
  Block data;
  Block grad;
  Block exp_avg, exp_avg_sq;  ///< AdamW state
};

/// A tensor handle of Autograd.
struct Tensor {
  int id = -1;
  [[nodiscard]] bool valid() const { return id >= 0; }
};

/// One forward op: its output, what it saves for backward and what its backward needs.
struct Op {
  std::string name{};
  std::vector<Tensor> inputs{};      ///< gradient flows to those that require it
  std::vector<Tensor> saved{};       ///< tensors kept alive for backward
  std::vector<Param*> params{};      ///< weights used (trainable ones get gradients)
  std::size_t out_bytes = 0;
  bool save_output = false;          ///< e.g. softmax, gelu saving their result
  /// Extra outputs the op keeps for backward (layer-norm statistics, attention logsumexp,
  /// dropout masks), freed after its backward.
  std::vector<std::pair<std::size_t, std::string>> aux{};
  std::size_t backward_scratch = 0;  ///< temporary during backward
  /// The output's gradient flows unchanged to every input (add, views): no new gradient buffer.
  bool passthrough = false;
};

class Autograd {
 public:
  Autograd(Trace& trace, std::uintptr_t stream) : trace_(trace), stream_(stream) {}

  /// A tensor the program creates outside autograd (inputs, targets).
  Tensor leaf(std::size_t bytes, std::string_view what, bool requires_grad = false);
  /// Runs a forward op; the program holds a reference to the output.
  Tensor apply(const Op& op);
  /// The program drops its reference (the tensor goes when nothing saved it).
  void drop(Tensor t);
  /// torch.utils.checkpoint (non-reentrant): runs `body` under no_grad and records one node that,
  /// in backward, runs `body` again with grad enabled and backpropagates through that recording
  /// before going on. `body` takes the segment's input and returns its output (with a reference).
  Tensor checkpoint(std::string_view name, Tensor input, const std::function<Tensor(Tensor)>& body);

  /// Hooks around one op's backward (FSDP/offload gather parameters before a layer's backward and
  /// release them after).
  void set_hooks(Tensor output_of_op, std::function<void()> before, std::function<void()> after);

  /// loss.backward(): the loss's gradient is a new scalar; every recorded op runs in reverse.
  void backward(Tensor loss);

  [[nodiscard]] std::size_t bytes(Tensor t) const;

 private:
  struct TensorState {
    Block block;                 ///< no block: freed, or a virtual result (an in-place op's)
    std::size_t size = 0;        ///< bytes (kept after the block is freed)
    bool py = false;             ///< the program holds a reference
    int saved = 0;               ///< saved-for-backward references
    bool requires_grad = false;
    int grad = -1;               ///< gradient buffer, while backward runs
    int producer = -1;           ///< node that made it
  };
  struct GradBuffer {            ///< a gradient, possibly shared by several tensors (passthrough)
    Block block;
    int refs = 0;
  };
  struct Node {
    Op op;
    Tensor output;
    std::vector<Block> aux;
    std::function<Tensor(Tensor)> recompute;  ///< checkpoint nodes
    std::function<void()> before, after;
    bool done = false;
  };
  TensorState& state(Tensor t);
  void unref_saved(Tensor t);
  void maybe_free(Tensor t);
  int new_grad(std::size_t bytes, const std::string& what);
  void release_grad(int g);
  void accumulate(Tensor t, int g);
  void accumulate_param(Param* p);
  void run_node(int index);

  Trace& trace_;
  std::uintptr_t stream_;
  bool grad_ = true;
  std::vector<TensorState> tensors_;
  std::vector<GradBuffer> grads_;
  std::vector<Node> nodes_;
};

/// optimizer.step() of torch.optim.AdamW(foreach=True) over the trainable parameters that have a
/// gradient: exp_avg/exp_avg_sq on the first step (kept for good), then one temporary per
/// parameter (torch._foreach_sqrt(exp_avg_sq)) freed after the update. Parameters without a
/// gradient this step are skipped, as PyTorch does.
void adam_step(Trace& t, const std::vector<Param*>& params, std::uintptr_t stream);
/// optimizer.zero_grad(set_to_none=True): every gradient is freed.
void zero_grad(Trace& t, const std::vector<Param*>& params);

/// Rounds `v` up to a multiple of `m`.
constexpr std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }

/// The padded length of a batch of `batch` sequences whose lengths are skewed towards short ones
/// (the product of two uniforms), padded to the longest and to a multiple of `multiple`, as
/// dynamic padding (DataCollatorWithPadding, pad_to_multiple_of) does.
std::size_t padded_length(Rng& rng, std::size_t batch, std::size_t min_len, std::size_t max_len,
                          std::size_t multiple);

}  // namespace stitch::tracegen::detail

// tools/tracegen/builder.cpp — random numbers, synthetic addresses, event emission and the
// miniature autograd the trace patterns are written with.
#include "tools/tracegen/builder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "stitch/errors.hpp"

namespace stitch::tracegen::detail {

// ---- Rng ------------------------------------------------------------------------------------------

Rng::Rng(std::uint64_t seed) {
  std::uint64_t x = seed;
  for (std::uint64_t& s : s_) {  // splitmix64
    x += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    s = z ^ (z >> 31);
  }
}

std::uint64_t Rng::next() {
  auto rotl = [](std::uint64_t v, int k) { return (v << k) | (v >> (64 - k)); };
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

std::uint64_t Rng::below(std::uint64_t n) {
  if (n <= 1) return 0;
  // Rejection: draw until the value falls in the largest multiple of n.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  std::uint64_t v = 0;
  do {
    v = next();
  } while (v >= limit);
  return v % n;
}

// ---- AddressSpace ---------------------------------------------------------------------------------

namespace {
// Where the synthetic device memory lives (typical of CUDA's unified address space on Linux).
constexpr std::uintptr_t kSmallBase = 0x7f0000000000;
constexpr std::uintptr_t kLargeBase = 0x7f2000000000;
constexpr std::size_t kArenaSize = std::size_t{1} << 40;
constexpr std::size_t kMinBlock = 512;  // PyTorch's kMinBlockSize
constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
}  // namespace

AddressSpace::AddressSpace() {
  small_.by_addr[kSmallBase] = kArenaSize;
  small_.by_size.insert({kArenaSize, kSmallBase});
  large_.by_addr[kLargeBase] = 4 * kArenaSize;
  large_.by_size.insert({4 * kArenaSize, kLargeBase});
}

std::size_t AddressSpace::rounded(std::size_t bytes) {
  return bytes < kMinBlock ? kMinBlock : round_up(bytes, kMinBlock);
}

AddressSpace::Arena& AddressSpace::arena_for(std::size_t bytes) {
  return bytes <= kSmallLimit ? small_ : large_;
}

std::uintptr_t AddressSpace::take(std::size_t bytes) {
  Arena& a = arena_for(bytes);
  const std::size_t size = rounded(bytes);
  auto it = a.by_size.lower_bound({size, 0});
  if (it == a.by_size.end()) throw error("tracegen: synthetic address space exhausted");
  const auto [free_size, addr] = *it;
  a.by_size.erase(it);
  a.by_addr.erase(addr);
  if (free_size > size) {
    a.by_addr[addr + size] = free_size - size;
    a.by_size.insert({free_size - size, addr + size});
  }
  return addr;
}

void AddressSpace::give(std::uintptr_t addr, std::size_t bytes) {
  Arena& a = arena_for(bytes);
  std::uintptr_t start = addr;
  std::size_t size = rounded(bytes);
  auto next = a.by_addr.lower_bound(addr);
  if (next != a.by_addr.end() && next->first == start + size) {  // merge with the following range
    size += next->second;
    a.by_size.erase({next->second, next->first});
    next = a.by_addr.erase(next);
  }
  if (next != a.by_addr.begin()) {  // and with the preceding one
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      a.by_size.erase({prev->second, prev->first});
      a.by_addr.erase(prev);
    }
  }
  a.by_addr[start] = size;
  a.by_size.insert({size, start});
}

// ---- Trace ----------------------------------------------------------------------------------------

Trace::Trace(std::string pattern, bool frames) : pattern_(std::move(pattern)), frames_(frames) {}

void Trace::emit(TraceAction action, const Block& b, std::string_view what) {
  TraceEntry e;
  e.action = action;
  e.addr = b.addr;
  e.size = b.size;
  e.stream = b.stream;
  if (frames_ && !what.empty()) e.frames.push_back(fmt::format("{} (tracegen/{})", what, pattern_));
  events_.push_back(std::move(e));
}

Block Trace::alloc(std::size_t bytes, std::uintptr_t stream, std::string_view what) {
  if (bytes == 0) throw error(fmt::format("tracegen: zero-byte allocation of {}", what));
  // PyTorch's allocator looks at the events of cross-stream frees when malloc starts.
  for (std::size_t i = 0; i < pending_.size();) {
    if (--pending_[i].allocs_left == 0) {
      complete(pending_[i].block);
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  Block b{space_.take(bytes), bytes, stream};
  emit(TraceAction::alloc, b, what);
  return b;
}

void Trace::complete(const Block& b) {
  emit(TraceAction::free_completed, b, {});
  space_.give(b.addr, b.size);
}

void Trace::free(Block& b) {
  if (!b.valid()) throw error("tracegen: free of an invalid block");
  emit(TraceAction::free_requested, b, {});
  complete(b);
  b = Block{};
}

void Trace::free_used_elsewhere(Block& b, std::size_t after_allocs) {
  if (!b.valid()) throw error("tracegen: free of an invalid block");
  emit(TraceAction::free_requested, b, {});
  pending_.push_back(Pending{b, std::max<std::size_t>(after_allocs, 1)});
  b = Block{};
}

void Trace::sync() {
  for (const Pending& p : pending_) complete(p.block);
  pending_.clear();
}

std::vector<TraceEntry> Trace::finish() {
  sync();
  return std::move(events_);
}

// ---- Autograd -------------------------------------------------------------------------------------

Autograd::TensorState& Autograd::state(Tensor t) {
  if (t.id < 0 || static_cast<std::size_t>(t.id) >= tensors_.size())
    throw error("tracegen: invalid tensor handle");
  return tensors_[static_cast<std::size_t>(t.id)];
}

std::size_t Autograd::bytes(Tensor t) const {
  return tensors_.at(static_cast<std::size_t>(t.id)).size;
}

Tensor Autograd::leaf(std::size_t bytes, std::string_view what, bool requires_grad) {
  TensorState s;
  s.block = trace_.alloc(bytes, stream_, what);
  s.size = bytes;
  s.py = true;
  s.requires_grad = requires_grad;
  tensors_.push_back(s);
  return Tensor{static_cast<int>(tensors_.size() - 1)};
}

Tensor Autograd::apply(const Op& op) {
  bool requires_grad = false;
  for (Tensor in : op.inputs) {
    const TensorState& s = state(in);
    if (!s.py) throw error(fmt::format("tracegen: {} uses a tensor the program dropped", op.name));
    requires_grad = requires_grad || s.requires_grad;
  }
  for (const Param* p : op.params) requires_grad = requires_grad || p->trainable;
  const bool record = grad_ && requires_grad;

  TensorState out;
  if (op.out_bytes != 0) out.block = trace_.alloc(op.out_bytes, stream_, op.name);
  out.size = op.out_bytes;
  out.py = true;
  out.requires_grad = record;
  std::vector<Block> aux;
  for (const auto& [bytes, what] : op.aux) aux.push_back(trace_.alloc(bytes, stream_, what));
  tensors_.push_back(out);
  const Tensor result{static_cast<int>(tensors_.size() - 1)};

  if (!record) {  // nothing is kept for a backward that will not happen
    for (Block& b : aux) trace_.free(b);
    return result;
  }
  Node n;
  n.op = op;
  n.output = result;
  n.aux = std::move(aux);
  for (Tensor t : op.saved) ++state(t).saved;
  if (op.save_output) ++state(result).saved;
  nodes_.push_back(std::move(n));
  state(result).producer = static_cast<int>(nodes_.size() - 1);
  return result;
}

void Autograd::maybe_free(Tensor t) {
  TensorState& s = state(t);
  if (!s.py && s.saved == 0 && s.block.valid()) trace_.free(s.block);
}

void Autograd::drop(Tensor t) {
  state(t).py = false;
  maybe_free(t);
}

void Autograd::unref_saved(Tensor t) {
  --state(t).saved;
  maybe_free(t);
}

Tensor Autograd::checkpoint(std::string_view name, Tensor input, const std::function<Tensor(Tensor)>& body) {
  const bool was = grad_;
  grad_ = false;
  const Tensor out = body(input);
  grad_ = was;
  if (!grad_) return out;
  Node n;
  n.op.name = std::string(name);
  n.op.inputs = {input};
  n.op.saved = {input};
  n.output = out;
  n.recompute = body;
  ++state(input).saved;
  nodes_.push_back(std::move(n));
  state(out).requires_grad = true;
  state(out).producer = static_cast<int>(nodes_.size() - 1);
  return out;
}

void Autograd::set_hooks(Tensor output_of_op, std::function<void()> before, std::function<void()> after) {
  const int p = state(output_of_op).producer;
  if (p < 0) return;
  Node& n = nodes_[static_cast<std::size_t>(p)];
  if (before) n.before = std::move(before);
  if (after) n.after = std::move(after);
}

int Autograd::new_grad(std::size_t bytes, const std::string& what) {
  grads_.push_back(GradBuffer{trace_.alloc(bytes, stream_, what), 1});
  return static_cast<int>(grads_.size() - 1);
}

void Autograd::release_grad(int g) {
  GradBuffer& b = grads_[static_cast<std::size_t>(g)];
  if (--b.refs == 0 && b.block.valid()) trace_.free(b.block);
}

// InputBuffer::add: the first gradient is taken as is (shared when it was passed through); a
// later one is added in place when the buffer is not shared, else into a new buffer.
void Autograd::accumulate(Tensor t, int g) {
  TensorState& s = state(t);
  if (!s.requires_grad) return;
  if (s.grad < 0) {
    ++grads_[static_cast<std::size_t>(g)].refs;
    s.grad = g;
    return;
  }
  if (grads_[static_cast<std::size_t>(s.grad)].refs > 1) {
    const std::size_t size = grads_[static_cast<std::size_t>(s.grad)].block.size;
    const int sum = new_grad(size, "grad_accumulate");
    release_grad(s.grad);
    state(t).grad = sum;
  }
}

// AccumulateGrad: the first gradient becomes .grad; later ones (tied weights) are added in place
// after being computed into a temporary.
void Autograd::accumulate_param(Param* p) {
  if (!p->trainable) return;
  if (!p->grad.valid()) {
    p->grad = trace_.alloc(p->bytes, stream_, p->name + ".grad");
  } else {
    Block tmp = trace_.alloc(p->bytes, stream_, p->name + ".grad_tmp");
    trace_.free(tmp);
  }
}

void Autograd::run_node(int index) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  if (node.done) return;
  node.done = true;
  if (node.before) node.before();
  const int g_out = state(node.output).grad;
  state(node.output).grad = -1;

  if (node.recompute) {
    // Checkpoint: rerun the segment with grad enabled (unpacking the saved input gives the
    // program a reference to it again), hand it the gradient, backpropagate through it.
    const std::function<Tensor(Tensor)> body = node.recompute;  // nodes_ grows below
    const Tensor input = node.op.inputs[0];
    const std::size_t first = nodes_.size();
    state(input).py = true;
    const Tensor again = body(input);
    state(again).grad = g_out;  // the reference moves to the recomputed output
    drop(again);
    state(input).py = false;
    unref_saved(input);
    for (std::size_t i = nodes_.size(); i > first; --i) run_node(static_cast<int>(i - 1));
    const std::function<void()> after = nodes_[static_cast<std::size_t>(index)].after;
    if (after) after();
    return;
  }

  if (g_out >= 0) {
    Block scratch;
    if (node.op.backward_scratch != 0)
      scratch = trace_.alloc(node.op.backward_scratch, stream_, node.op.name + ".backward");
    for (Tensor in : node.op.inputs) {
      if (!state(in).requires_grad) continue;
      if (node.op.passthrough) {
        accumulate(in, g_out);
      } else {
        const int g = new_grad(std::max<std::size_t>(state(in).size, 1), node.op.name + ".grad_input");
        accumulate(in, g);
        release_grad(g);
      }
    }
    for (Param* p : node.op.params) accumulate_param(p);
    if (scratch.valid()) trace_.free(scratch);
    release_grad(g_out);
  }
  Node& self = nodes_[static_cast<std::size_t>(index)];
  for (Tensor t : self.op.saved) unref_saved(t);
  if (self.op.save_output) unref_saved(self.output);
  for (Block& b : self.aux) trace_.free(b);
  if (self.after) self.after();
}

void Autograd::backward(Tensor loss) {
  state(loss).grad = new_grad(std::max<std::size_t>(bytes(loss), 4), "loss.grad");
  for (std::size_t i = nodes_.size(); i > 0; --i) run_node(static_cast<int>(i - 1));
  // Gradients that reached no node (inputs that required grad) go with the graph.
  for (TensorState& s : tensors_) {
    if (s.grad >= 0) {
      const int g = s.grad;
      s.grad = -1;
      release_grad(g);
    }
  }
  nodes_.clear();
  grads_.clear();
}

// ---- optimizer ------------------------------------------------------------------------------------

void adam_step(Trace& t, const std::vector<Param*>& params, std::uintptr_t stream) {
  std::vector<Param*> with_grad;
  for (Param* p : params)
    if (p->trainable && p->grad.valid()) with_grad.push_back(p);
  for (Param* p : with_grad) {  // _init_group: state on first use
    if (!p->exp_avg.valid()) {
      p->exp_avg = t.alloc(p->bytes, stream, p->name + ".exp_avg");
      p->exp_avg_sq = t.alloc(p->bytes, stream, p->name + ".exp_avg_sq");
    }
  }
  std::vector<Block> sqrt;  // exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)
  for (Param* p : with_grad) sqrt.push_back(t.alloc(p->bytes, stream, p->name + ".exp_avg_sq_sqrt"));
  for (Block& b : sqrt) t.free(b);
}

void zero_grad(Trace& t, const std::vector<Param*>& params) {
  for (Param* p : params)
    if (p->grad.valid()) t.free(p->grad);
}

std::size_t padded_length(Rng& rng, std::size_t batch, std::size_t min_len, std::size_t max_len,
                          std::size_t multiple) {
  std::size_t longest = min_len;
  for (std::size_t i = 0; i < batch; ++i) {
    const std::uint64_t a = rng.below(1024), b = rng.below(1024);
    longest = std::max(longest, min_len + (max_len - min_len) * a * b / (1023 * 1023));
  }
  return std::min(round_up(longest, multiple), max_len);
}

}  // namespace stitch::tracegen::detail

// tools/tracegen/patterns.cpp — the workload patterns. Each imitates a kind of training run whose
// allocation sequence is known to fragment a caching allocator; the comment above each says what
// it imitates and where its fragmentation comes from. Sizes are those of the real tensors of the
// model it describes (bf16 activations, fp32 or bf16 parameters, AdamW state).
#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "stitch/errors.hpp"
#include "tools/tracegen/builder.hpp"
#include "tools/tracegen/tracegen.hpp"

namespace stitch::tracegen {

namespace {

using namespace detail;

// Streams: the default stream is 0, as in PyTorch's traces; side streams are opaque
// cudaStream_t values (pointers of the CUDA runtime's heap).
constexpr std::uintptr_t kCompute = 0;
constexpr std::uintptr_t kAllGatherStream = 0x55d1c0a3e2f0;
constexpr std::uintptr_t kReduceScatterStream = 0x55d1c0a3f640;

/// A model's parameters, with stable addresses.
struct Params {
  std::deque<Param> items;
  Param* add(std::string name, std::size_t bytes, bool trainable = true) {
    items.push_back(Param{std::move(name), bytes, trainable, {}, {}, {}, {}});
    return &items.back();
  }
  [[nodiscard]] std::vector<Param*> all() {
    std::vector<Param*> out;
    for (Param& p : items) out.push_back(&p);
    return out;
  }
  /// model.to("cuda"): every parameter in module order.
  void materialize(Trace& t) {
    for (Param& p : items) p.data = t.alloc(p.bytes, kCompute, p.name);
  }
};

/// What a forward pass runs with: autograd, and autocast's weight cache under AMP (fp32 weights
/// cast to bf16 once per forward, the copies kept by the ops that saved them).
struct Net {
  Trace& t;
  Autograd& ag;
  bool amp = false;
  std::vector<std::pair<Param*, Tensor>> cast_cache;

  Tensor op(const Op& o) { return ag.apply(o); }
  void drop(Tensor x) { ag.drop(x); }
  void drop(std::initializer_list<Tensor> xs) {
    for (Tensor x : xs) ag.drop(x);
  }

  /// The weight as the matmul sees it: under AMP, a trainable fp32 weight's bf16 copy.
  Tensor weight_cast(Param* w) {
    for (const auto& [p, c] : cast_cache)
      if (p == w) return c;
    Tensor c = op({w->name + ".to_bf16", {}, {}, {w}, w->bytes / 2});
    cast_cache.emplace_back(w, c);
    return c;
  }
  /// x @ w.T: saves x (and the weight copy under AMP).
  Tensor linear(const std::string& name, Tensor x, Param* w, std::size_t out_bytes) {
    if (amp && w->trainable) {
      const Tensor wc = weight_cast(w);
      return op({name, {x, wc}, {x, wc}, {}, out_bytes});
    }
    return op({name, {x}, {x}, {w}, out_bytes});
  }
  /// Autocast's input cast of an fp32 activation for a bf16 op (not saved).
  Tensor to_bf16(const std::string& name, Tensor x) { return op({name + ".to_bf16", {x}, {}, {}, ag.bytes(x) / 2}); }
  /// Leaves autocast: the cache lets its copies go (the ops that saved them keep them).
  void end_forward() {
    for (const auto& [p, c] : cast_cache) ag.drop(c);
    cast_cache.clear();
  }
};

// ---- GPT-style decoder (nanoGPT's model, bias=False) ------------------------------------------------

struct GptDims {
  std::size_t batch = 8, seq = 1024, hidden = 1024, heads = 16, ffn = 4096, vocab = 50304, max_pos = 1024;
  std::size_t layers = 4;
  bool eager_attention = true;  ///< softmax(q k^T) materialized (s^2 per head); else flash SDPA
  bool amp = false;             ///< fp32 weights and residual stream, bf16 matmuls (autocast)
  std::size_t param_bytes = kFp32;
  [[nodiscard]] std::size_t tokens() const { return batch * seq; }
};

/// The bf16 model with 2048-wide layers that the larger patterns share.
GptDims bf16_gpt_2048(std::size_t batch, std::size_t layers) {
  GptDims d;
  d.batch = batch;
  d.hidden = 2048;
  d.heads = 16;
  d.ffn = 8192;
  d.layers = layers;
  d.max_pos = 2048;
  d.param_bytes = kBf16;
  return d;
}

struct GptLayer {
  Param *ln_1, *c_attn, *attn_proj, *ln_2, *c_fc, *mlp_proj;
  [[nodiscard]] std::vector<Param*> list() const { return {ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj}; }
  [[nodiscard]] std::size_t bytes() const {
    std::size_t b = 0;
    for (Param* p : list()) b += p->bytes;
    return b;
  }
};

struct Gpt {
  Param *wte, *wpe, *ln_f;
  std::vector<GptLayer> layers;
};

Gpt make_gpt(Params& ps, const GptDims& d) {
  const std::size_t h = d.hidden, pb = d.param_bytes;
  Gpt g;
  g.wte = ps.add("transformer.wte.weight", d.vocab * h * pb);
  g.wpe = ps.add("transformer.wpe.weight", d.max_pos * h * pb);
  for (std::size_t l = 0; l < d.layers; ++l) {
    const std::string p = fmt::format("transformer.h.{}.", l);
    GptLayer L;
    L.ln_1 = ps.add(p + "ln_1.weight", h * pb);
    L.c_attn = ps.add(p + "attn.c_attn.weight", 3 * h * h * pb);
    L.attn_proj = ps.add(p + "attn.c_proj.weight", h * h * pb);
    L.ln_2 = ps.add(p + "ln_2.weight", h * pb);
    L.c_fc = ps.add(p + "mlp.c_fc.weight", d.ffn * h * pb);
    L.mlp_proj = ps.add(p + "mlp.c_proj.weight", h * d.ffn * pb);
    g.layers.push_back(L);
  }
  g.ln_f = ps.add("transformer.ln_f.weight", h * pb);
  return g;
}

/// One transformer block's forward: x -> x + attn(ln_1(x)) -> ... + mlp(ln_2(...)). The caller
/// keeps its reference to x. `first_op`/`last_op` receive the block's first and last op outputs
/// (for hooks around its backward).
Tensor gpt_block(Net& n, const GptDims& d, const GptLayer& w, Tensor x, const std::string& pre,
                 Tensor* first_op = nullptr, Tensor* last_op = nullptr) {
  const std::size_t tok = d.tokens();
  const std::size_t act = tok * d.hidden * kBf16;                  // a bf16 activation
  const std::size_t res = tok * d.hidden * (d.amp ? kFp32 : kBf16);  // residual stream
  const std::size_t probs = d.batch * d.heads * d.seq * d.seq;     // elements of the attention map

  Tensor h = n.op({pre + "ln_1", {x}, {x}, {w.ln_1}, res, false,
                   {{tok * kFp32, pre + "ln_1.mean"}, {tok * kFp32, pre + "ln_1.rstd"}}});
  if (first_op != nullptr) *first_op = h;
  if (d.amp) {
    const Tensor hb = n.to_bf16(pre + "ln_1", h);
    n.drop(h);
    h = hb;
  }
  const Tensor qkv = n.linear(pre + "attn.c_attn", h, w.c_attn, 3 * act);
  n.drop(h);
  Tensor y;
  if (d.eager_attention) {
    // att = (q @ k.T) * scale; masked_fill(causal); softmax (fp32 under autocast); att @ v.
    const Tensor s1 = n.op({pre + "attn.q@kT", {qkv}, {qkv}, {}, probs * kBf16});
    const Tensor s2 = n.op({pre + "attn.scale", {s1}, {}, {}, probs * kBf16});
    n.drop(s1);
    const Tensor s3 = n.op({pre + "attn.masked_fill", {s2}, {}, {}, probs * kBf16});
    n.drop(s2);
    const Tensor p = n.op({pre + "attn.softmax", {s3}, {}, {}, probs * (d.amp ? kFp32 : kBf16), true});
    n.drop(s3);
    Tensor pv = p;
    if (d.amp) {
      pv = n.to_bf16(pre + "attn.softmax", p);
      n.drop(p);
    }
    y = n.op({pre + "attn.att@v", {pv, qkv}, {pv, qkv}, {}, act});
    n.drop(pv);
  } else {
    // F.scaled_dot_product_attention (flash): saves q, k, v, the output and the logsumexp; its
    // backward accumulates dq in fp32.
    y = n.op({pre + "attn.sdpa", {qkv}, {qkv}, {}, act, true,
              {{d.batch * d.heads * d.seq * kFp32, pre + "attn.logsumexp"}}, tok * d.hidden * kFp32});
  }
  n.drop(qkv);
  const Tensor proj = n.linear(pre + "attn.c_proj", y, w.attn_proj, act);
  n.drop(y);
  const Tensor x1 = n.op({pre + "residual_1", {x, proj}, {}, {}, res, false, {}, 0, true});
  n.drop(proj);
  Tensor h2 = n.op({pre + "ln_2", {x1}, {x1}, {w.ln_2}, res, false,
                    {{tok * kFp32, pre + "ln_2.mean"}, {tok * kFp32, pre + "ln_2.rstd"}}});
  if (d.amp) {
    const Tensor hb = n.to_bf16(pre + "ln_2", h2);
    n.drop(h2);
    h2 = hb;
  }
  const Tensor f = n.linear(pre + "mlp.c_fc", h2, w.c_fc, tok * d.ffn * kBf16);
  n.drop(h2);
  const Tensor g = n.op({pre + "mlp.gelu", {f}, {f}, {}, tok * d.ffn * kBf16});
  n.drop(f);
  const Tensor o = n.linear(pre + "mlp.c_proj", g, w.mlp_proj, act);
  n.drop(g);
  const Tensor out = n.op({pre + "residual_2", {x1, o}, {}, {}, res, false, {}, 0, true});
  n.drop({o, x1});
  if (last_op != nullptr) *last_op = out;
  return out;
}

/// Token + position embeddings.
Tensor gpt_embed(Net& n, const GptDims& d, const Gpt& g, Tensor ids) {
  const std::size_t res = d.tokens() * d.hidden * (d.amp ? kFp32 : kBf16);
  const Tensor tok = n.op({"transformer.wte", {}, {ids}, {g.wte}, res});
  const Tensor pos = n.op({"transformer.wpe", {}, {}, {g.wpe}, d.seq * d.hidden * (d.amp ? kFp32 : kBf16)});
  const Tensor x = n.op({"transformer.drop(tok_emb+pos_emb)", {tok, pos}, {}, {}, res, false, {}, 0, true});
  n.drop({tok, pos});
  return x;
}

/// ln_f, the tied lm_head and F.cross_entropy (fp32 under autocast). Returns {logits, loss}.
std::pair<Tensor, Tensor> gpt_head(Net& n, const GptDims& d, const Gpt& g, Tensor x, Tensor targets) {
  const std::size_t tok = d.tokens();
  Tensor h = n.op({"transformer.ln_f", {x}, {x}, {g.ln_f}, n.ag.bytes(x), false,
                   {{tok * kFp32, "ln_f.mean"}, {tok * kFp32, "ln_f.rstd"}}});
  if (d.amp) {
    const Tensor hb = n.to_bf16("transformer.ln_f", h);
    n.drop(h);
    h = hb;
  }
  const Tensor logits = n.linear("lm_head", h, g.wte, tok * d.vocab * kBf16);
  n.drop(h);
  const Tensor lf = n.op({"cross_entropy.logits.float", {logits}, {}, {}, tok * d.vocab * kFp32});
  const Tensor lsm = n.op({"cross_entropy.log_softmax", {lf}, {}, {}, tok * d.vocab * kFp32, true});
  n.drop(lf);
  const Tensor loss = n.op({"cross_entropy.nll_loss", {lsm}, {targets}, {}, kFp32, false,
                            {{kFp32, "nll_loss.total_weight"}}});
  n.drop(lsm);
  return {logits, loss};
}

/// A Hugging Face causal LM's head and loss (Llama-style models): the untied lm_head in bf16, the
/// logits upcast to fp32, log_softmax and nll_loss. Consumes `hn`; returns the loss.
Tensor causal_lm_loss(Net& n, Tensor hn, Param* lm_head, Tensor labels, std::size_t tok,
                      std::size_t vocab) {
  const Tensor logits = n.linear("lm_head", hn, lm_head, tok * vocab * kBf16);
  n.drop(hn);
  const Tensor lf = n.op({"loss.logits.float()", {logits}, {}, {}, tok * vocab * kFp32});
  n.drop(logits);
  const Tensor lsm = n.op({"loss.log_softmax", {lf}, {}, {}, tok * vocab * kFp32, true});
  n.drop(lf);
  const Tensor loss =
      n.op({"loss.nll_loss", {lsm}, {labels}, {}, kFp32, false, {{kFp32, "nll_loss.total_weight"}}});
  n.drop(lsm);
  return loss;
}

// ---- transformer-varlen ------------------------------------------------------------------------
// Imitates nanoGPT-style GPT training (4 blocks of GPT-2-medium width, eager attention, AMP with
// fp32 weights and bf16 matmuls, foreach AdamW, zero_grad(set_to_none=True)) on a dataset of
// variable-length documents with dynamic padding: every step the batch is padded to its longest
// sequence (a multiple of 8, 32..1024 tokens), so every activation (batch x seq x hidden, the
// attention maps batch x heads x seq^2) changes size from one step to the next. Weights, AdamW
// state and the autocast weight copies are long-lived or per-step; activations are freed in
// reverse order during backward; gradients are freed and reallocated every step. The blocks
// cached for one sequence length rarely fit the next one exactly: PyTorch's allocator splits
// and caches them until it holds far more than the step needs.
void transformer_varlen(Trace& t, Rng& rng, std::size_t steps) {
  GptDims d;
  d.batch = 8;
  d.amp = true;
  d.layers = 4;
  Params ps;
  const Gpt g = make_gpt(ps, d);
  ps.materialize(t);
  const std::vector<Param*> all = ps.all();
  Autograd ag(t, kCompute);
  Net n{t, ag, d.amp, {}};

  auto get_batch = [&](std::size_t seq) {
    const std::size_t tok = d.batch * seq;
    const Tensor x = ag.leaf(tok * kInt64, "get_batch.x");
    const Tensor y = ag.leaf(tok * kInt64, "get_batch.y");
    return std::pair{x, y};
  };
  std::size_t seq = padded_length(rng, d.batch, 32, d.max_pos, 8);
  auto [x, y] = get_batch(seq);
  for (std::size_t step = 0; step < steps; ++step) {
    d.seq = seq;
    Tensor h = gpt_embed(n, d, g, x);
    for (std::size_t l = 0; l < d.layers; ++l) {
      const Tensor next = gpt_block(n, d, g.layers[l], h, fmt::format("transformer.h.{}.", l));
      n.drop(h);
      h = next;
    }
    auto [logits, loss] = gpt_head(n, d, g, h, y);
    n.drop(h);
    n.end_forward();
    // nanoGPT fetches the next batch while the GPU is busy with the forward.
    seq = padded_length(rng, d.batch, 32, d.max_pos, 8);
    const auto [nx, ny] = get_batch(seq);
    n.drop({x, y});
    x = nx;
    y = ny;
    ag.backward(loss);
    adam_step(t, all, kCompute);
    zero_grad(t, all);
    n.drop({logits, loss});
  }
  n.drop({x, y});
}

// ---- recompute ---------------------------------------------------------------------------------
// Imitates fine-tuning with activation checkpointing (torch.utils.checkpoint around every block,
// as Hugging Face's gradient_checkpointing_enable() does) of a bf16 GPT model (hidden 2048,
// eager attention) on long, variable-length sequences (64..2048 tokens, padded to multiples of
// 64). Forward keeps only each block's input; everything else is freed as soon as it is used.
// Backward walks the blocks in reverse and, for each, recomputes its forward (allocating all of
// its activations again) before backpropagating through it: the same large, size-varying
// allocations come and go once per block in backward, between long-lived block inputs and the
// growing set of gradients.
void recompute(Trace& t, Rng& rng, std::size_t steps) {
  GptDims d = bf16_gpt_2048(4, 4);
  Params ps;
  const Gpt g = make_gpt(ps, d);
  ps.materialize(t);
  const std::vector<Param*> all = ps.all();
  Autograd ag(t, kCompute);
  Net n{t, ag, false, {}};
  for (std::size_t step = 0; step < steps; ++step) {
    d.seq = padded_length(rng, d.batch, 64, d.max_pos, 64);
    const Tensor ids = ag.leaf(d.tokens() * kInt64, "batch.input_ids");
    const Tensor labels = ag.leaf(d.tokens() * kInt64, "batch.labels");
    const Tensor mask = ag.leaf(d.tokens() * kInt64, "batch.attention_mask");
    Tensor h = gpt_embed(n, d, g, ids);
    for (std::size_t l = 0; l < d.layers; ++l) {
      const GptLayer& w = g.layers[l];
      const std::string pre = fmt::format("transformer.h.{}.", l);
      const Tensor next = ag.checkpoint(pre + "checkpoint", h, [&n, d, w, pre](Tensor in) {
        return gpt_block(n, d, w, in, pre);
      });
      n.drop(h);
      h = next;
    }
    auto [logits, loss] = gpt_head(n, d, g, h, labels);
    n.drop(h);
    ag.backward(loss);
    adam_step(t, all, kCompute);
    zero_grad(t, all);
    n.drop({logits, loss, ids, labels, mask});
  }
}

// ---- lora --------------------------------------------------------------------------------------
// Imitates PEFT LoRA fine-tuning of a LLaMA-style model (hidden 4096, SwiGLU MLP 11008, 32 heads;
// 4 layers of a 7B model) in bf16 with frozen weights: the big frozen matrices are allocated once
// and never get gradients; rank-16 adapters (lora_A 16x4096, lora_B 4096x16, fp32 under autocast)
// on q_proj and v_proj are the only trainable parameters, so their gradients, AdamW state and
// bf16 copies are many tiny allocations next to the huge weights. Instruction-tuning batches
// are padded to their longest example (32..2048 tokens, multiples of 8), so the activations,
// the lora_dropout copies of the input and their masks change size every step; SDPA (flash)
// attention saves q, k, v, the output and the logsumexp. The first layer's frozen path saves
// nothing (nothing before it requires grad), as in the real model.
void lora(Trace& t, Rng& rng, std::size_t steps) {
  const std::size_t batch = 4, h = 4096, heads = 32, ffn = 11008, layers = 4, vocab = 32000, rank = 16;
  Params ps;
  Param* embed = ps.add("model.embed_tokens.weight", vocab * h * kBf16, false);
  struct Layer {
    Param *in_norm, *q, *k, *v, *o, *post_norm, *gate, *up, *down;
    Param *q_a, *q_b, *v_a, *v_b;
  };
  std::vector<Layer> L;
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string p = fmt::format("base_model.model.model.layers.{}.", l);
    Layer x{};
    x.in_norm = ps.add(p + "input_layernorm.weight", h * kBf16, false);
    x.q = ps.add(p + "self_attn.q_proj.base_layer.weight", h * h * kBf16, false);
    x.q_a = ps.add(p + "self_attn.q_proj.lora_A.default.weight", rank * h * kFp32);
    x.q_b = ps.add(p + "self_attn.q_proj.lora_B.default.weight", h * rank * kFp32);
    x.k = ps.add(p + "self_attn.k_proj.weight", h * h * kBf16, false);
    x.v = ps.add(p + "self_attn.v_proj.base_layer.weight", h * h * kBf16, false);
    x.v_a = ps.add(p + "self_attn.v_proj.lora_A.default.weight", rank * h * kFp32);
    x.v_b = ps.add(p + "self_attn.v_proj.lora_B.default.weight", h * rank * kFp32);
    x.o = ps.add(p + "self_attn.o_proj.weight", h * h * kBf16, false);
    x.post_norm = ps.add(p + "post_attention_layernorm.weight", h * kBf16, false);
    x.gate = ps.add(p + "mlp.gate_proj.weight", ffn * h * kBf16, false);
    x.up = ps.add(p + "mlp.up_proj.weight", ffn * h * kBf16, false);
    x.down = ps.add(p + "mlp.down_proj.weight", h * ffn * kBf16, false);
    L.push_back(x);
  }
  Param* norm = ps.add("base_model.model.model.norm.weight", h * kBf16, false);
  Param* lm_head = ps.add("base_model.model.lm_head.weight", vocab * h * kBf16, false);
  ps.materialize(t);
  const std::vector<Param*> all = ps.all();
  Autograd ag(t, kCompute);
  Net n{t, ag, true, {}};

  for (std::size_t step = 0; step < steps; ++step) {
    const std::size_t seq = padded_length(rng, batch, 32, 2048, 8);
    const std::size_t tok = batch * seq, act = tok * h * kBf16, mlp = tok * ffn * kBf16;
    const Tensor ids = ag.leaf(tok * kInt64, "batch.input_ids");
    const Tensor labels = ag.leaf(tok * kInt64, "batch.labels");
    const Tensor mask = ag.leaf(tok * kInt64, "batch.attention_mask");
    Tensor x = n.op({"model.embed_tokens", {}, {ids}, {embed}, act});
    auto rms = [&](const std::string& name, Tensor in, Param* w) {
      return n.op({name, {in}, {in}, {w}, act, false, {{tok * kFp32, name + ".rstd"}}, tok * h * kFp32});
    };
    // result = base(x) + lora_B(lora_A(lora_dropout(x))) * scaling
    auto lora_linear = [&](const std::string& name, Tensor in, Param* base, Param* a, Param* b) {
      const Tensor base_out = n.linear(name + ".base_layer", in, base, act);
      const Tensor dropped = n.op({name + ".lora_dropout", {in}, {}, {}, act, false, {{tok * h, name + ".lora_dropout.mask"}}});
      const Tensor down = n.linear(name + ".lora_A", dropped, a, tok * rank * kBf16);
      n.drop(dropped);
      const Tensor upw = n.linear(name + ".lora_B", down, b, act);
      n.drop(down);
      const Tensor scaled = n.op({name + ".scaling", {upw}, {}, {}, act});
      n.drop(upw);
      const Tensor out = n.op({name + ".add", {base_out, scaled}, {}, {}, act, false, {}, 0, true});
      n.drop({base_out, scaled});
      return out;
    };
    for (std::size_t l = 0; l < layers; ++l) {
      const Layer& w = L[l];
      const std::string p = fmt::format("model.layers.{}.", l);
      const Tensor n1 = rms(p + "input_layernorm", x, w.in_norm);
      const Tensor q = lora_linear(p + "self_attn.q_proj", n1, w.q, w.q_a, w.q_b);
      const Tensor k = n.linear(p + "self_attn.k_proj", n1, w.k, act);
      const Tensor v = lora_linear(p + "self_attn.v_proj", n1, w.v, w.v_a, w.v_b);
      n.drop(n1);
      const Tensor qr = n.op({p + "self_attn.rotary(q)", {q}, {}, {}, act});
      const Tensor kr = n.op({p + "self_attn.rotary(k)", {k}, {}, {}, act});
      n.drop({q, k});
      const Tensor at = n.op({p + "self_attn.sdpa", {qr, kr, v}, {qr, kr, v}, {}, act, true,
                              {{batch * heads * seq * kFp32, p + "self_attn.sdpa.logsumexp"}}, tok * h * kFp32});
      n.drop({qr, kr, v});
      const Tensor o = n.linear(p + "self_attn.o_proj", at, w.o, act);
      n.drop(at);
      const Tensor x1 = n.op({p + "residual_1", {x, o}, {}, {}, act, false, {}, 0, true});
      n.drop({o, x});
      const Tensor n2 = rms(p + "post_attention_layernorm", x1, w.post_norm);
      const Tensor gt = n.linear(p + "mlp.gate_proj", n2, w.gate, mlp);
      const Tensor up = n.linear(p + "mlp.up_proj", n2, w.up, mlp);
      n.drop(n2);
      const Tensor act_fn = n.op({p + "mlp.act_fn(silu)", {gt}, {gt}, {}, mlp});
      n.drop(gt);
      const Tensor prod = n.op({p + "mlp.act*up", {act_fn, up}, {act_fn, up}, {}, mlp});
      n.drop({act_fn, up});
      const Tensor down = n.linear(p + "mlp.down_proj", prod, w.down, act);
      n.drop(prod);
      x = n.op({p + "residual_2", {x1, down}, {}, {}, act, false, {}, 0, true});
      n.drop({x1, down});
    }
    const Tensor hn = rms("model.norm", x, norm);
    n.drop(x);
    const Tensor loss = causal_lm_loss(n, hn, lm_head, labels, tok, vocab);
    n.end_forward();
    ag.backward(loss);
    adam_step(t, all, kCompute);
    zero_grad(t, all);
    n.drop({loss, ids, labels, mask});
  }
}

// ---- cpu-offload -------------------------------------------------------------------------------
// Imitates FSDP with CPUOffload(offload_params=True) (or DeepSpeed ZeRO-3 with offload_param and
// offload_optimizer) on one GPU: parameters and AdamW state live in host memory; each transformer
// block is an FSDP unit whose flat bf16 parameter (~100 MB for hidden 2048) is copied to the GPU
// just before the block runs (the next unit prefetched), and freed right after, in forward and
// again in backward; the block's gradients are flattened into one buffer, copied back to the host
// and freed after its backward. The root unit (embeddings, tied lm_head, final norm) stays
// gathered from the start of forward to the end of backward. Large parameter-sized buffers thus
// come and go once per layer, twice per step, while the activations of every block (flash
// attention, bf16, variable sequence lengths) live from forward until their backward: each new
// parameter buffer has to find room between them.
void cpu_offload(Trace& t, Rng& rng, std::size_t steps) {
  GptDims d = bf16_gpt_2048(2, 6);
  d.eager_attention = false;
  Params ps;
  const Gpt g = make_gpt(ps, d);  // no materialize(): parameters live on the host
  Autograd ag(t, kCompute);
  Net n{t, ag, false, {}};
  const std::size_t root_bytes = g.wte->bytes + g.wpe->bytes + g.ln_f->bytes;
  std::vector<Block> unit(d.layers);
  auto gather = [&](std::size_t l) {
    if (l < d.layers && !unit[l].valid())
      unit[l] = t.alloc(g.layers[l].bytes(), kCompute, fmt::format("fsdp.h.{}.flat_param", l));
  };
  auto reshard = [&](std::size_t l) {
    if (unit[l].valid()) t.free(unit[l]);
  };
  // After a block's backward: flatten its gradients, copy them to the host, free.
  auto offload_grads = [&](std::size_t l) {
    Block flat = t.alloc(g.layers[l].bytes(), kCompute, fmt::format("fsdp.h.{}.flat_grad", l));
    for (Param* p : g.layers[l].list())
      if (p->grad.valid()) t.free(p->grad);
    t.free(flat);
  };
  for (std::size_t step = 0; step < steps; ++step) {
    d.seq = padded_length(rng, d.batch, 128, d.max_pos, 128);
    const Tensor ids = ag.leaf(d.tokens() * kInt64, "batch.input_ids");
    const Tensor labels = ag.leaf(d.tokens() * kInt64, "batch.labels");
    Block root = t.alloc(root_bytes, kCompute, "fsdp.root.flat_param");
    Tensor h = gpt_embed(n, d, g, ids);
    for (std::size_t l = 0; l < d.layers; ++l) {
      gather(l);
      gather(l + 1);  // forward_prefetch
      Tensor first, last;
      const Tensor next = gpt_block(n, d, g.layers[l], h, fmt::format("transformer.h.{}.", l), &first, &last);
      reshard(l);
      ag.set_hooks(last, [&gather, l] { gather(l); if (l > 0) gather(l - 1); }, nullptr);
      ag.set_hooks(first, nullptr, [&, l] { offload_grads(l); reshard(l); });
      n.drop(h);
      h = next;
    }
    auto [logits, loss] = gpt_head(n, d, g, h, labels);
    n.drop(h);
    ag.backward(loss);
    for (Param* p : {g.wte, g.wpe, g.ln_f})
      if (p->grad.valid()) t.free(p->grad);
    t.free(root);
    n.drop({logits, loss, ids, labels});
    t.sync();  // the optimizer step runs on the host after the gradients arrived
  }
}

// ---- multistream -------------------------------------------------------------------------------
// Imitates FSDP FULL_SHARD (world size 8, bf16 mixed precision) on one rank, with its two side
// streams: all-gathers of each block's unsharded parameters run on an all-gather stream and
// reduce-scatters of its gradients on a reduce-scatter stream. The unsharded parameter buffer is
// allocated on the all-gather stream, used by the compute stream and freed on the all-gather
// stream after the block ran: PyTorch can reuse it only once the compute stream's work completed
// (free_requested now, free_completed later). Likewise the unsharded gradient is freed after the
// reduce-scatter stream used it, and the fp32 sharded gradient produced on the reduce-scatter
// stream is used by the optimizer on the compute stream. Blocks of one stream's pool cannot serve
// another stream, and the deferred frees keep memory busy longer: each stream builds up its own
// cache. Batches are padded to one of four lengths (512..2048).
void multistream(Trace& t, Rng& rng, std::size_t steps) {
  GptDims d = bf16_gpt_2048(4, 6);
  d.eager_attention = false;
  constexpr std::size_t world = 8;
  Params ps;
  const Gpt g = make_gpt(ps, d);  // the unsharded bf16 views; the shards are below
  Params shards;                  // fp32 sharded flat parameters: what AdamW updates
  std::vector<std::size_t> unit_bytes;  // bf16 unsharded
  unit_bytes.push_back(g.wte->bytes + g.wpe->bytes + g.ln_f->bytes);  // root unit
  for (const GptLayer& L : g.layers) unit_bytes.push_back(L.bytes());
  for (std::size_t u = 0; u < unit_bytes.size(); ++u)
    shards.add(u == 0 ? "fsdp.root.flat_param(shard)" : fmt::format("fsdp.h.{}.flat_param(shard)", u - 1),
               round_up(unit_bytes[u] / kBf16, world) / world * kFp32);
  shards.materialize(t);
  std::vector<Param*> shard_list = shards.all();
  Autograd ag(t, kCompute);
  Net n{t, ag, false, {}};

  std::vector<Block> unsharded(unit_bytes.size());
  auto all_gather = [&](std::size_t u) {
    if (u >= unit_bytes.size() || unsharded[u].valid()) return;
    // The bf16 copy of the local shard is the all-gather's input; the output is the whole unit.
    Block input = t.alloc(unit_bytes[u] / world, kAllGatherStream, fmt::format("fsdp.unit{}.all_gather_input", u));
    unsharded[u] = t.alloc(unit_bytes[u], kAllGatherStream, fmt::format("fsdp.unit{}.all_gather_output", u));
    t.free(input);
  };
  auto reshard = [&](std::size_t u) {  // used by the compute stream: completes a few mallocs later
    if (unsharded[u].valid()) t.free_used_elsewhere(unsharded[u], 6);
  };
  auto reduce_scatter = [&](std::size_t u, const std::vector<Param*>& params) {
    Block flat = t.alloc(unit_bytes[u], kCompute, fmt::format("fsdp.unit{}.unsharded_grad", u));
    for (Param* p : params)
      if (p->grad.valid()) t.free(p->grad);
    Block out = t.alloc(unit_bytes[u] / world, kReduceScatterStream, fmt::format("fsdp.unit{}.reduce_scatter_output", u));
    t.free_used_elsewhere(flat, 4);  // record_stream(reduce-scatter stream)
    Param* shard = shard_list[u];
    if (!shard->grad.valid()) {
      shard->grad = t.alloc(shard->bytes, kReduceScatterStream, shard->name + ".grad");
    } else {
      Block tmp = t.alloc(shard->bytes, kReduceScatterStream, shard->name + ".grad_fp32");
      t.free(tmp);
    }
    t.free(out);
  };

  for (std::size_t step = 0; step < steps; ++step) {
    d.seq = std::size_t{512} * rng.between(1, 4);
    const Tensor ids = ag.leaf(d.tokens() * kInt64, "batch.input_ids");
    const Tensor labels = ag.leaf(d.tokens() * kInt64, "batch.labels");
    all_gather(0);
    Tensor h = gpt_embed(n, d, g, ids);
    for (std::size_t l = 0; l < d.layers; ++l) {
      const std::size_t u = l + 1;
      all_gather(u);
      all_gather(u + 1);  // forward prefetch
      Tensor first, last;
      const Tensor next = gpt_block(n, d, g.layers[l], h, fmt::format("transformer.h.{}.", l), &first, &last);
      reshard(u);
      ag.set_hooks(last, [&all_gather, u] { all_gather(u); all_gather(u - 1); }, nullptr);
      const std::vector<Param*> params = g.layers[l].list();
      ag.set_hooks(first, nullptr, [&, u, params] { reduce_scatter(u, params); reshard(u); });
      n.drop(h);
      h = next;
    }
    auto [logits, loss] = gpt_head(n, d, g, h, labels);
    n.drop(h);
    ag.backward(loss);
    reduce_scatter(0, {g.wte, g.wpe, g.ln_f});
    reshard(0);
    adam_step(t, shard_list, kCompute);
    // zero_grad(set_to_none=True): the gradients were last used by the optimizer (compute stream).
    for (Param* s : shard_list)
      if (s->grad.valid()) t.free_used_elsewhere(s->grad, 2);
    n.drop({logits, loss, ids, labels});
  }
}

// ---- moe ---------------------------------------------------------------------------------------
// Imitates training a Mixtral-style mixture-of-experts model (hidden 1024, 8 SwiGLU experts of
// width 2816 per layer, top-2 routing, 3 layers, bf16, flash attention) with Hugging Face's
// per-expert loop: for each expert, the tokens routed to it are gathered (hidden[top_x]), run
// through w1/w3/silu/w2, weighted and index_add_-ed into the output. How many tokens each expert
// gets changes every step and is very uneven: each layer has its popular and its neglected
// experts (fixed skewed popularity) and every step perturbs it, so the per-expert buffers take a
// different size at every layer and step, from nothing to several times the average. In
// backward, each expert's gather allocates a full-size (tokens x hidden) gradient that is added
// into the input's gradient.
void moe(Trace& t, Rng& rng, std::size_t steps) {
  const std::size_t batch = 8, seq = 1024, h = 1024, heads = 16, ffn = 2816, experts = 8, top_k = 2;
  const std::size_t layers = 3, vocab = 32000;
  const std::size_t tok = batch * seq, act = tok * h * kBf16;
  Params ps;
  Param* embed = ps.add("model.embed_tokens.weight", vocab * h * kBf16);
  struct Layer {
    Param *in_norm, *qkv, *o, *post_norm, *router;
    std::vector<Param*> w1, w2, w3;
    std::vector<std::uint64_t> popularity;
  };
  std::vector<Layer> L;
  for (std::size_t l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    Layer x{};
    x.in_norm = ps.add(p + "input_layernorm.weight", h * kBf16);
    x.qkv = ps.add(p + "self_attn.qkv_proj.weight", 3 * h * h * kBf16);
    x.o = ps.add(p + "self_attn.o_proj.weight", h * h * kBf16);
    x.post_norm = ps.add(p + "post_attention_layernorm.weight", h * kBf16);
    x.router = ps.add(p + "block_sparse_moe.gate.weight", experts * h * kBf16);
    for (std::size_t e = 0; e < experts; ++e) {
      const std::string q = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
      x.w1.push_back(ps.add(q + "w1.weight", ffn * h * kBf16));
      x.w2.push_back(ps.add(q + "w2.weight", h * ffn * kBf16));
      x.w3.push_back(ps.add(q + "w3.weight", ffn * h * kBf16));
      const std::uint64_t r = rng.between(1, 8);
      x.popularity.push_back(r * r);  // 1..64: a few experts get most tokens
    }
    L.push_back(std::move(x));
  }
  Param* norm = ps.add("model.norm.weight", h * kBf16);
  Param* lm_head = ps.add("lm_head.weight", vocab * h * kBf16);
  ps.materialize(t);
  const std::vector<Param*> all = ps.all();
  Autograd ag(t, kCompute);
  Net n{t, ag, false, {}};

  // Tokens per expert this step: popularity x noise (0.25..2x), 2 * tokens in all.
  auto route = [&](const Layer& layer) {
    std::vector<std::uint64_t> w(experts);
    std::uint64_t total = 0;
    for (std::size_t e = 0; e < experts; ++e) {
      w[e] = layer.popularity[e] * rng.between(25, 200);
      total += w[e];
    }
    std::vector<std::size_t> counts(experts);
    std::size_t assigned = 0;
    for (std::size_t e = 0; e < experts; ++e) {
      counts[e] = static_cast<std::size_t>(top_k * tok * w[e] / total);
      counts[e] = std::min(counts[e], tok);  // an expert sees each token at most once
      assigned += counts[e];
    }
    // The remainder goes to the experts with room, most popular first.
    std::vector<std::size_t> order(experts);
    for (std::size_t e = 0; e < experts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return w[a] > w[b]; });
    for (std::size_t i = 0; assigned < top_k * tok; i = (i + 1) % experts) {
      const std::size_t e = order[i];
      const std::size_t room = std::min(tok - counts[e], top_k * tok - assigned);
      counts[e] += room;
      assigned += room;
    }
    return counts;
  };

  for (std::size_t step = 0; step < steps; ++step) {
    const Tensor ids = ag.leaf(tok * kInt64, "batch.input_ids");
    const Tensor labels = ag.leaf(tok * kInt64, "batch.labels");
    Tensor x = n.op({"model.embed_tokens", {}, {ids}, {embed}, act});
    for (std::size_t l = 0; l < layers; ++l) {
      const Layer& w = L[l];
      const std::string p = fmt::format("model.layers.{}.", l);
      const Tensor n1 = n.op({p + "input_layernorm", {x}, {x}, {w.in_norm}, act, false, {{tok * kFp32, p + "input_layernorm.rstd"}}});
      const Tensor qkv = n.linear(p + "self_attn.qkv_proj", n1, w.qkv, 3 * act);
      n.drop(n1);
      const Tensor at = n.op({p + "self_attn.sdpa", {qkv}, {qkv}, {}, act, true,
                              {{batch * heads * seq * kFp32, p + "self_attn.logsumexp"}}, tok * h * kFp32});
      n.drop(qkv);
      const Tensor o = n.linear(p + "self_attn.o_proj", at, w.o, act);
      n.drop(at);
      const Tensor x1 = n.op({p + "residual_1", {x, o}, {}, {}, act, false, {}, 0, true});
      n.drop({o, x});
      const Tensor n2 = n.op({p + "post_attention_layernorm", {x1}, {x1}, {w.post_norm}, act, false,
                              {{tok * kFp32, p + "post_attention_layernorm.rstd"}}});
      // Router: logits, fp32 softmax, top-2 (weights and indices), renormalized weights.
      const std::string m = p + "block_sparse_moe.";
      const Tensor logits = n.linear(m + "gate", n2, w.router, tok * experts * kBf16);
      const Tensor probs = n.op({m + "softmax", {logits}, {}, {}, tok * experts * kFp32, true});
      n.drop(logits);
      const Tensor topk = n.op({m + "topk", {probs}, {}, {}, tok * top_k * kFp32, false,
                                {{tok * top_k * kInt64, m + "topk.indices"}}});
      n.drop(probs);
      const Tensor rw = n.op({m + "routing_weights/sum", {topk}, {topk}, {}, tok * top_k * kFp32});
      n.drop(topk);
      const Tensor rwb = n.op({m + "routing_weights.to(bf16)", {rw}, {}, {}, tok * top_k * kBf16});
      n.drop(rw);
      const Tensor expert_mask = n.op({m + "one_hot(selected_experts)", {}, {}, {}, tok * top_k * experts * kInt64});
      std::vector<Tensor> parts;
      const std::vector<std::size_t> counts = route(w);
      for (std::size_t e = 0; e < experts; ++e) {
        const std::size_t c = counts[e];
        if (c == 0) continue;
        const std::string q = fmt::format("{}experts.{}.", m, e);
        const Tensor idx = n.op({q + "where(expert_mask)", {}, {}, {}, 2 * c * kInt64});
        const Tensor cur = n.op({q + "hidden_states[top_x]", {n2}, {idx}, {}, c * h * kBf16});
        const Tensor a = n.linear(q + "w1", cur, w.w1[e], c * ffn * kBf16);
        const Tensor b = n.linear(q + "w3", cur, w.w3[e], c * ffn * kBf16);
        n.drop(cur);
        const Tensor s = n.op({q + "act_fn(silu)", {a}, {a}, {}, c * ffn * kBf16});
        n.drop(a);
        const Tensor prod = n.op({q + "act*w3", {s, b}, {s, b}, {}, c * ffn * kBf16});
        n.drop({s, b});
        const Tensor y = n.linear(q + "w2", prod, w.w2[e], c * h * kBf16);
        n.drop(prod);
        const Tensor rsel = n.op({q + "routing_weights[top_x, idx]", {rwb}, {idx}, {}, c * kBf16});
        const Tensor yw = n.op({q + "*routing_weights", {y, rsel}, {y, rsel}, {}, c * h * kBf16});
        n.drop({y, rsel});
        // final_hidden_states.index_add_(0, top_x, yw): in place, keeps only the index.
        parts.push_back(n.op({q + "index_add_", {yw}, {idx}, {}, 0}));
        n.drop({yw, idx});
      }
      n.drop({expert_mask, rwb});
      std::vector<Tensor> ins = parts;
      const Tensor moe_out = n.op({m + "final_hidden_states", ins, {}, {}, act, false, {}, 0, true});
      for (Tensor part : parts) n.drop(part);
      n.drop(n2);
      x = n.op({p + "residual_2", {x1, moe_out}, {}, {}, act, false, {}, 0, true});
      n.drop({x1, moe_out});
    }
    const Tensor hn = n.op({"model.norm", {x}, {x}, {norm}, act, false, {{tok * kFp32, "model.norm.rstd"}}});
    n.drop(x);
    const Tensor loss = causal_lm_loss(n, hn, lm_head, labels, tok, vocab);
    ag.backward(loss);
    adam_step(t, all, kCompute);
    zero_grad(t, all);
    n.drop({loss, ids, labels});
  }
}

struct Entry {
  PatternInfo info;
  void (*run)(Trace&, Rng&, std::size_t);
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = {
      {{"transformer-varlen", "GPT training (AMP, eager attention) with a new padded sequence length every step", 16},
       transformer_varlen},
      {{"recompute", "activation checkpointing: every block's forward is recomputed in backward", 16}, recompute},
      {{"lora", "LoRA fine-tuning: frozen bf16 weights, tiny trainable adapters, varying activations", 16}, lora},
      {{"cpu-offload", "parameters offloaded to the host: per-layer parameter buffers come and go", 16}, cpu_offload},
      {{"multistream", "FSDP with all-gather and reduce-scatter side streams, frees deferred across streams", 16},
       multistream},
      {{"moe", "mixture of experts with uneven, changing token counts per expert", 10}, moe},
  };
  return entries;
}

}  // namespace

const std::vector<PatternInfo>& patterns() {
  static const std::vector<PatternInfo> list = [] {
    std::vector<PatternInfo> out;
    for (const Entry& e : registry()) out.push_back(e.info);
    return out;
  }();
  return list;
}

namespace {
const Entry& find(std::string_view pattern) {
  for (const Entry& e : registry())
    if (e.info.name == pattern) return e;
  std::string known;
  for (const Entry& e : registry()) known += (known.empty() ? "" : ", ") + e.info.name;
  throw error(fmt::format("unknown pattern '{}' (known: {})", pattern, known));
}
}  // namespace

std::size_t steps_for(std::string_view pattern, const Options& options) {
  return options.steps != 0 ? options.steps : find(pattern).info.default_steps;
}

stitch::detail::SnapshotMeta snapshot_meta(std::string_view pattern, std::uint64_t seed, const Options& options) {
  stitch::detail::SnapshotMeta meta;
  meta.version = "tracegen-1";
  meta.backend = "none";
  meta.config = fmt::format("tracegen pattern:{},seed:{},steps:{}{}", pattern, seed, steps_for(pattern, options),
                            options.frames ? "" : ",frames:False");
  meta.device_count = 1;
  return meta;
}

Snapshot generate(std::string_view pattern, std::uint64_t seed, const Options& options) {
  const Entry& e = find(pattern);
  Rng rng(seed);
  Trace trace(e.info.name, options.frames);
  e.run(trace, rng, steps_for(pattern, options));
  Snapshot snap;
  snap.device_traces.push_back(trace.finish());
  // PyTorch's defaults: the settings the imitated program would have run with.
  snap.settings = "";
  snap.max_split_size = SIZE_MAX;
  snap.garbage_collection_threshold = 0.0;
  snap.expandable_segments = false;
  snap.roundup_power2_divisions.assign(16, 0);
  return snap;
}

std::string generate_pickle(std::string_view pattern, std::uint64_t seed, const Options& options) {
  return stitch::detail::snapshot_to_pickle(generate(pattern, seed, options), snapshot_meta(pattern, seed, options));
}

}  // namespace stitch::tracegen

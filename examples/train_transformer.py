#!/usr/bin/env python3
"""Trains a small transformer language model on synthetic data whose sequence length changes
every step (the shape churn that fragments a caching allocator), with PyTorch's allocator or
stitch's, and reports loss per step, peak reserved memory and time per step.

    python examples/train_transformer.py --allocator native --steps 50
    python examples/train_transformer.py --allocator stitch --steps 50
    python examples/train_transformer.py --allocator stitch-expandable --steps 50
    python -m stitch.torch examples/train_transformer.py --steps 50     # launcher: same as stitch

Needs PyTorch with a CUDA device. Seeds are fixed (--seed): the same arguments give the same
batches and, up to GPU nondeterminism (--deterministic removes most), the same losses. The last
line is `RESULT {json}` for scripts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allocator", choices=["native", "stitch", "stitch-expandable"],
                   default=None, help="CUDA allocator (default: native, or stitch under "
                   "python -m stitch.torch)")
    p.add_argument("--stitch-conf", default="",
                   help="extra stitch configuration, e.g. max_split_size_mb:256")
    p.add_argument("--steps", type=int, default=20, help="training steps (default: 20)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--min-len", type=int, default=64, help="shortest sequence (default: 64)")
    p.add_argument("--max-len", type=int, default=512, help="longest sequence (default: 512)")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms(True) (slower)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.min_len < 2 or args.max_len < args.min_len:
        p.error("need --steps >= 1 and 2 <= --min-len <= --max-len")
    return args


def import_stitch():
    try:
        import stitch  # noqa: F401
        import stitch.torch  # noqa: F401
    except ImportError:
        # Running from a source checkout without `pip install ./python`.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
        import stitch  # noqa: F401
        import stitch.torch  # noqa: F401
    return sys.modules["stitch"]


def setup_allocator(args):
    """Installs the allocator before anything initializes CUDA; returns (name, stitch or None)."""
    launched = "stitch.torch" in sys.modules and sys.modules["stitch.torch"].is_enabled()
    if args.allocator in (None, "native") and not launched:
        return "native", None
    stitch = import_stitch()
    if launched:
        if args.allocator == "native":
            print("note: started by python -m stitch.torch: stitch is the allocator", flush=True)
        if args.stitch_conf or args.allocator == "stitch-expandable":
            print("note: under the launcher, set stitch options with --conf/STITCH_ALLOC_CONF",
                  flush=True)
        return "stitch (launcher)", stitch
    conf = ",".join(c for c in (
        "expandable_segments:True" if args.allocator == "stitch-expandable" else "",
        args.stitch_conf) if c)
    stitch.torch.enable(conf or None)
    return args.allocator, stitch


def make_batch(rng, args, torch, device):
    """A copy task: each row is a random prefix followed by the same tokens again, so the model
    can learn to predict the second half. The length changes every step."""
    length = rng.randrange(args.min_len, args.max_len + 1)
    half = (length + 1) // 2
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    prefix = torch.randint(0, args.vocab, (args.batch, half), generator=gen)
    tokens = torch.cat([prefix, prefix], dim=1)[:, :length]
    return tokens.to(device, non_blocking=True)


def build_model(args, torch):
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.d_model)
            self.pos = nn.Embedding(args.max_len, args.d_model)
            layer = nn.TransformerEncoderLayer(
                args.d_model, args.heads, dim_feedforward=4 * args.d_model, dropout=0.0,
                batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(args.d_model)
            self.head = nn.Linear(args.d_model, args.vocab, bias=False)

        def forward(self, x):
            n = x.shape[1]
            pos = torch.arange(n, device=x.device)
            mask = nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
            h = self.embed(x) + self.pos(pos)
            h = self.blocks(h, mask=mask, is_causal=True)
            return self.head(self.norm(h))

    return LM()


def main(argv=None):
    args = parse_args(argv)
    allocator, stitch = setup_allocator(args)  # before the first CUDA call

    import torch

    if not torch.cuda.is_available():
        print("error: this example needs a CUDA device", file=sys.stderr)
        return 2
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    # cudnn.benchmark asks the allocator for cacheInfo, which a pluggable allocator lacks.
    torch.backends.cudnn.benchmark = False
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = torch.device("cuda")

    model = build_model(args, torch).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    params = sum(p.numel() for p in model.parameters())
    print(f"allocator={allocator} params={params / 1e6:.1f}M steps={args.steps} "
          f"batch={args.batch} len={args.min_len}..{args.max_len}", flush=True)

    times, losses = [], []
    for step in range(args.steps):
        tokens = make_batch(rng, args, torch, device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()  # synchronizes
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(value)
        print(f"step {step:4d} len {tokens.shape[1]:4d} loss {value:.4f} "
              f"time {times[-1] * 1e3:.1f} ms", flush=True)
        if not math.isfinite(value):
            print("error: loss is not finite", file=sys.stderr)
            return 1

    if stitch is not None:
        peak_reserved = stitch.max_memory_reserved()
        peak_allocated = stitch.max_memory_allocated()
        stats = stitch.memory_stats()
    else:
        peak_reserved = torch.cuda.max_memory_reserved()
        peak_allocated = torch.cuda.max_memory_allocated()
        stats = torch.cuda.memory_stats()
    steady = times[1:] or times  # the first step includes warm-up (cuBLAS handles, caches)
    result = {
        "allocator": allocator,
        "steps": args.steps,
        "final_loss": losses[-1],
        "peak_reserved_bytes": peak_reserved,
        "peak_allocated_bytes": peak_allocated,
        "mean_step_ms": statistics.fmean(steady) * 1e3,
        "median_step_ms": statistics.median(steady) * 1e3,
        "first_step_ms": times[0] * 1e3,
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "num_device_alloc": stats.get("num_device_alloc", 0),
    }
    print(f"peak reserved {peak_reserved / 2**20:.1f} MiB, peak allocated "
          f"{peak_allocated / 2**20:.1f} MiB, time/step mean {result['mean_step_ms']:.1f} ms "
          f"median {result['median_step_ms']:.1f} ms (first step {result['first_step_ms']:.1f} ms)")
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Several models take turns on one device whose host cannot hold all their weights: stitch's
disk tier (backup_dir, docs/sleep.md). Each model's weights are tensors allocated under a region
tag with backup (stitch.torch.region); only one model is awake at a time: it is woken
(stitch.torch.wake), serves a forward pass, and is put back to sleep (stitch.torch.sleep), its
weights going to pinned host memory up to backup_host_mb and to files in backup_dir beyond it.
After every wake every weight is checked against the digest taken when it was made, and the
forward pass must give the very output it gave the first time.

    python examples/model_swap.py                      # the simulated device (CPU tensors)
    python examples/model_swap.py --device cuda        # a GPU, under stitch.torch.enable()
    python examples/model_swap.py --models 6 --model-mb 512 --host-mb 1024 --backup-dir /mnt/nvme/stitch

On the simulated device (the default without a GPU, and in CI) the device memory is host memory:
the weights are CPU tensors over it (torch.frombuffer); without torch they are plain buffers and
the forward pass is left out. The last line is `RESULT {json}`; the exit status is 1 when any
check failed. Needs libstitch (STITCH_LIBRARY or a build next to the checkout).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time

MiB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["auto", "sim", "cuda"], default="auto",
                   help="sim: the simulated device (CPU tensors); cuda: a GPU; auto: cuda when torch sees one")
    p.add_argument("--models", type=int, default=4)
    p.add_argument("--model-mb", type=int, default=48, help="weights per model, MiB (default 48)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--host-mb", type=int, default=None,
                   help="backup_host_mb: pinned host memory for backups (default: a third of all the weights)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backup-dir", default=None, help="backup_dir (default: a temporary directory, removed after)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.models < 2 or args.model_mb < args.layers or args.layers < 1 or args.rounds < 1:
        p.error("need --models >= 2, --layers >= 1, --model-mb >= --layers and --rounds >= 1")
    total = args.models * args.model_mb
    if args.host_mb is None:
        args.host_mb = max(1, total // 3)
    if args.host_mb >= total:
        p.error(f"--host-mb {args.host_mb} holds every model ({total} MiB): nothing would go to disk")
    return args


def load_torch():
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    return torch


class Model:
    """A model's weights: `layers` square float32 matrices (tensors, or buffers without torch),
    the digest of each, and the output of its first forward pass."""

    def __init__(self, index, tag, layers, layer_bytes):
        self.index, self.tag = index, tag
        self.layers, self.layer_bytes = layers, layer_bytes
        self.side = int(math.isqrt(layer_bytes // 4))
        self.weights, self.digests, self.output = [], [], None
        self.pointers = []  # the simulated device's addresses of the weights (freed at the end)


def digest(torch, w) -> str:
    if torch is None:
        return hashlib.blake2b(bytes(w), digest_size=16).hexdigest()
    cpu = w.detach().to("cpu").contiguous()
    return hashlib.blake2b(memoryview(cpu.numpy()).cast("B"), digest_size=16).hexdigest()


def build(args, torch, cuda, st, stitch, m: Model, seed):
    """Allocates the model's weights in its region (backup=True) and fills them."""
    rng = random.Random(seed)
    with st.region(m.tag, backup=True):
        for layer in range(m.layers):
            n = m.side * m.side
            if torch is None:
                ptr = stitch.malloc(n * 4, 0)
                buf = (ctypes.c_uint8 * (n * 4)).from_address(ptr)
                buf[:] = rng.randbytes(n * 4)
                m.weights.append(buf)
                m.pointers.append(ptr)
                continue
            g = torch.Generator().manual_seed(seed * 1000 + layer)
            values = torch.randn(m.side, m.side, generator=g) / math.sqrt(m.side)
            if cuda:
                w = torch.empty(m.side, m.side, device="cuda")
            else:  # the simulated device's memory is host memory: a CPU tensor over it
                ptr = stitch.malloc(n * 4, 0)
                w = torch.frombuffer((ctypes.c_uint8 * (n * 4)).from_address(ptr), dtype=torch.float32)
                w = w.view(m.side, m.side)
                m.pointers.append(ptr)
            w.copy_(values)
            m.weights.append(w)
    m.digests = [digest(torch, w) for w in m.weights]


def forward(torch, m: Model):
    if torch is None:
        return None
    x = torch.ones(4, m.side, device=m.weights[0].device)
    for w in m.weights:
        x = torch.tanh(x @ w)
    return x.to("cpu")


def entry(res, tag):
    devices = res["devices"] if "devices" in res else [res]
    for t in devices[0]["tags"]:
        if t["tag"] == tag:
            return t
    return {}


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    torch = load_torch()
    cuda = args.device == "cuda" or (args.device == "auto" and torch is not None and torch.cuda.is_available())
    if cuda and (torch is None or not torch.cuda.is_available()):
        print("model_swap: --device cuda needs torch with a CUDA device", file=sys.stderr)
        return 2
    own_dir = args.backup_dir is None
    backup_dir = tempfile.mkdtemp(prefix="stitch-model-swap-") if own_dir else os.path.abspath(args.backup_dir)
    layer_bytes = args.model_mb * MiB // args.layers
    conf = f"backup_host_mb:{args.host_mb},backup_dir:{backup_dir}"
    import stitch  # noqa: PLC0415
    import stitch.torch as st  # noqa: PLC0415

    if cuda:
        st.enable(conf)
    else:
        # Room for one model awake (with its pages' rounding) and not two.
        device_mb = args.model_mb * 3 // 2 + 16
        stitch.configure(f"backend:sim,sim_capacity_mb:{device_mb},{conf}")
    print(f"model_swap: {args.models} models of {args.model_mb} MiB ({args.layers} layers) on "
          f"{'a GPU' if cuda else 'the simulated device'}"
          f"{'' if torch is not None else ' (no torch: plain buffers)'}; pinned host memory for backups "
          f"{args.host_mb} MiB, the rest to {backup_dir}", flush=True)

    failures, rows = [], []
    models = [Model(i, f"model{i}", args.layers, layer_bytes) for i in range(args.models)]
    start = time.monotonic()
    for m in models:
        build(args, torch, cuda, st, stitch, m, args.seed * 100 + m.index)
        m.output = forward(torch, m)
        st.sleep(m.tag, progress=True)  # one awake at a time
    peak_files = stitch.stat("backup_file_bytes.current", 0)
    for r in range(args.rounds):
        for m in models:
            t0 = time.monotonic()
            st.wake(m.tag, progress=True)
            t1 = time.monotonic()
            bad = [i for i, w in enumerate(m.weights) if digest(torch, w) != m.digests[i]]
            same = True
            if torch is not None:
                out = forward(torch, m)
                same = bool(torch.equal(out, m.output))
            t2 = time.monotonic()
            res = st.sleep(m.tag, progress=True)
            t3 = time.monotonic()
            e = entry(res, m.tag)
            peak_files = max(peak_files, stitch.stat("backup_file_bytes.current", 0))
            if bad:
                failures.append(f"round {r} {m.tag}: weights {bad} changed")
            if not same:
                failures.append(f"round {r} {m.tag}: the forward pass gave another output")
            if os.listdir(backup_dir):
                failures.append(f"round {r} {m.tag}: files left in {backup_dir}: {os.listdir(backup_dir)}")
            rows.append({"round": r, "model": m.tag, "wake_ms": round((t1 - t0) * 1e3, 1),
                         "sleep_ms": round((t3 - t2) * 1e3, 1), "weights_ok": not bad, "output_same": same,
                         "host_MiB": round(e.get("host_backup_bytes", 0) / MiB, 1),
                         "file_MiB": round(e.get("backup_file_bytes", 0) / MiB, 1), "backup": e.get("backup")})
            output = "no forward pass" if torch is None else f"output {'the same' if same else 'CHANGED'}"
            print(f"round {r} {m.tag}: wake {rows[-1]['wake_ms']} ms, {len(m.weights) - len(bad)}/{len(m.weights)} "
                  f"weights intact, {output}; sleep {rows[-1]['sleep_ms']} ms, "
                  f"backup in {e.get('backup')} ({rows[-1]['host_MiB']} MiB host, {rows[-1]['file_MiB']} MiB files)",
                  flush=True)
    if peak_files == 0:
        failures.append("no backup went to a file: the disk tier was not used")
    total_host = sum(entry(stitch.residency(0), m.tag).get("host_backup_bytes", 0) for m in models)
    if total_host > args.host_mb * MiB:
        failures.append(f"host backups {total_host} bytes exceed backup_host_mb:{args.host_mb}")
    # Done: every model woken and its memory freed; nothing may stay in the directory.
    for m in models:
        st.wake(m.tag)
        if not cuda:
            for ptr, w in zip(m.pointers, m.weights):
                n = ctypes.sizeof(w) if torch is None else w.numel() * 4
                stitch.free(ptr, n, 0)
        m.weights.clear()
    if stitch.stat("backup_file_bytes.current", 0) != 0 or os.listdir(backup_dir):
        failures.append("backup files remain after every model woke")
    if own_dir:
        shutil.rmtree(backup_dir, ignore_errors=True)
    result = {"device": "cuda" if cuda else "sim", "torch": torch is not None, "models": args.models,
              "model_MiB": args.model_mb, "host_MiB": args.host_mb, "swaps": len(rows),
              "peak_file_MiB": round(peak_files / MiB, 1), "seconds": round(time.monotonic() - start, 2),
              "failures": failures}
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    print("RESULT " + json.dumps(result), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

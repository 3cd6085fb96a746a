#!/usr/bin/env python3
"""An engine-shaped serving loop on stitch's KV pools (docs/kv.md), on the simulated device: two
models serve requests (prefill allocates a request's blocks, each decode step grows it by a token,
finished requests free theirs) while a trainer beside them allocates and frees its working set
through the caching allocator, all on one 8 GiB device. Model B is busy in the first half and idle
in the second. Each model keeps a prefix cache of finished requests' blocks (1 GiB), as engines
do, so an idle model still holds memory until its cache sleeps.

Three ways to hold the KV caches, on the same request trace (fixed seed):
  static   each model preallocates 45% of the device at start (vLLM's gpu_memory_utilization=0.9
           split between two models) and manages block ids itself;
  elastic  a stitch KV pool per model: pages mapped under live blocks only;
  sleep    elastic, and model B's cache is put to sleep (stitch_sleep) once it goes idle.
For each: the peak device memory stitch holds, the trainer's largest possible allocation over time
(minimum and mean), the trainer's failed steps, and page map/unmap calls per simulated second with
their estimated device time (cuMemCreate 193.3 us, cuMemMap 1.45 us, cuMemSetAccess 36.0 us per
page per buffer; cuMemUnmap 25.6 us, cuMemRelease 5 us: kvcached's published A100 figures).

    python examples/kv_serving.py               # all three, a table (and RESULT lines)
    python examples/kv_serving.py --mode sleep  # one

Each mode runs in a fresh process (an allocator is configured once). Needs libstitch
(STITCH_LIBRARY or a build next to the checkout).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys

GiB = 1 << 30
MiB = 1 << 20
DEVICE_MB = 8192
LAYERS = 16
BLOCK_TOKENS = 16
BLOCK_BYTES = BLOCK_TOKENS * 8 * 128 * 2  # tokens x kv heads x head dim x fp16: 32 KiB a buffer
STEPS = 1200
STEP_SECONDS = 0.02  # one decode step
MAX_BATCH = 32
PREFIX_CACHE_BLOCKS = 1024  # 1 GiB of a model's KV blocks kept for prefix reuse
COST_MAP_US = 193.3 + 1.45 + 36.0
COST_UNMAP_US = 25.6 + 5.0


def run_mode(mode: str, seed: int) -> dict:
    os.environ["STITCH_ALLOC_CONF"] = f"backend:sim,sim_capacity_mb:{DEVICE_MB},expandable_segments:True"
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import stitch

    rng = random.Random(seed)
    buffers = 2 * LAYERS
    per_block = BLOCK_BYTES * buffers
    max_blocks = int(0.45 * DEVICE_MB * MiB) // per_block
    pools = {m: stitch.kv.Pool(0, buffers, BLOCK_BYTES, max_blocks, tag=f"kv-{m}") for m in "AB"}
    static_free = {}
    if mode == "static":  # every block allocated up front; the engine hands ids out itself
        for m, p in pools.items():
            static_free[m] = p.alloc(max_blocks)
    running = {"A": [], "B": []}  # [tokens, remaining, ids]
    # A prefix cache per model, as engines keep finished requests' blocks for reuse (evicted
    # oldest first past PREFIX_CACHE_BLOCKS, or when an allocation fails).
    cached = {"A": [], "B": []}
    trainer = []  # live trainer allocations (ptr, size)
    samples, trainer_fail, asleep = [], 0, False
    kv_fail = 0

    def give(m: str, ids):
        if mode == "static":
            static_free[m].extend(ids)
            static_free[m].sort()
        else:
            pools[m].free(ids)

    def take(m: str, n: int):
        nonlocal kv_fail
        for attempt in range(2):
            if mode == "static":
                if len(static_free[m]) >= n:
                    ids, static_free[m][:] = static_free[m][:n], static_free[m][n:]
                    return ids
            else:
                try:
                    return pools[m].alloc(n)
                except stitch.StitchError:
                    pass
            while cached[m] and attempt == 0:  # evict the prefix cache, then once more
                give(m, cached[m].pop(0))
        kv_fail += 1
        return None

    def retire(m: str, ids):
        cached[m].append(ids)
        while sum(len(c) for c in cached[m]) > PREFIX_CACHE_BLOCKS:
            give(m, cached[m].pop(0))

    for step in range(STEPS):
        busy_b = step < STEPS // 2
        if mode == "sleep" and not busy_b and not asleep and not running["B"]:
            stitch.sleep("kv-B")
            asleep = True
        # Arrivals, prefill.
        for m, rate in (("A", 0.6), ("B", 0.6 if busy_b else 0.0)):
            arrivals = sum(1 for _ in range(3) if rng.random() < rate / 3)
            for _ in range(arrivals):
                if len(running[m]) >= MAX_BATCH:
                    continue
                prompt, out = rng.randint(64, 1024), rng.randint(32, 256)
                ids = take(m, (prompt + BLOCK_TOKENS - 1) // BLOCK_TOKENS)
                if ids is not None:
                    running[m].append([prompt, out, ids])
        # Decode: a token per request; a new block at each block boundary; finished ones free.
        for m in "AB":
            still = []
            for r in running[m]:
                r[0] += 1
                r[1] -= 1
                if r[1] <= 0:
                    retire(m, r[2])
                    continue
                if r[0] % BLOCK_TOKENS == 1:
                    more = take(m, 1)
                    if more is None:  # preempted: freed, as an engine does
                        give(m, r[2])
                        continue
                    r[2].extend(more)
                still.append(r)
            running[m] = still
        # The trainer: a working set that swings between 1 and 3 GiB in 64 MiB tensors.
        want = int((2.0 + 1.0 * ((step % 200) / 100.0 - 1.0)) * GiB)
        have = sum(s for _, s in trainer)
        while have > want and trainer:
            p, s = trainer.pop()
            stitch.free(p, s)
            have -= s
        while have < want:
            try:
                p = stitch.malloc(64 * MiB)
            except stitch.StitchError:
                trainer_fail += 1
                break
            trainer.append((p, 64 * MiB))
            have += 64 * MiB
        if step % 10 == 0:
            res = stitch.residency(0)
            # Pages under live blocks (a sleeping pool's are unmapped); static: everything.
            used = sum(0 if k["state"] == "asleep" else k["used_bytes"] for k in res["kv_pools"])
            if mode == "static":
                used = sum(k["mapped_bytes"] for k in res["kv_pools"])
            # What the trainer could allocate beside its live memory: the device less the KV
            # pages under live blocks (the ladder takes the pools' unused pages and the cache).
            samples.append(DEVICE_MB * MiB - used - res["allocated_bytes"])
    res = stitch.residency(0)
    maps = sum(k["page_maps"] for k in res["kv_pools"])
    unmaps = sum(k["page_unmaps"] for k in res["kv_pools"])
    seconds = STEPS * STEP_SECONDS
    cost_us = (maps * COST_MAP_US + unmaps * COST_UNMAP_US) * buffers
    return {
        "mode": mode,
        "peak_reserved_GiB": round(stitch.stat("reserved_bytes.all.peak") / GiB, 3),
        "peak_kv_GiB": round(stitch.stat("kv_bytes.peak") / GiB, 3),
        "trainer_room_min_GiB": round(min(samples) / GiB, 3),
        "trainer_room_mean_GiB": round(sum(samples) / len(samples) / GiB, 3),
        "trainer_failed_steps": trainer_fail,
        "kv_failed_allocs": kv_fail,
        "page_maps_per_s": round(maps / seconds, 1),
        "page_unmaps_per_s": round(unmaps / seconds, 1),
        "est_device_ms_per_s": round(cost_us / 1000.0 / seconds, 2),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["static", "elastic", "sleep"])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.mode:
        print("RESULT " + json.dumps(run_mode(args.mode, args.seed)))
        return 0
    rows = []
    for mode in ("static", "elastic", "sleep"):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", mode, "--seed", str(args.seed)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            return r.returncode
        line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")][-1]
        rows.append(json.loads(line[len("RESULT "):]))
        print(line)
    keys = [k for k in rows[0] if k != "mode"]
    print("| mode | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for r in rows:
        print(f"| {r['mode']} | " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

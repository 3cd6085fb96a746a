#!/usr/bin/env python3
"""Measures stitching's trade-off between memory and device calls (docs/stitching.md).

usage: scripts/stitching_tradeoff.py [--replay build-release/stitch-replay] TRACE...

Prints two markdown tables (python3 standard library only; needs a built stitch-replay):

1. Minimum capacity (the smallest device, in 2 MiB steps, on which the trace replays without an
   OOM) of PyTorch's defaults, expandable segments, stitching under several values of
   stitch_fine_above, and stitching with compaction (stitch_compact:True), with how far
   compaction's is above fine pages throughout (stitch_fine_above:0).
2. The device calls of expandable segments, stitching and stitching with compaction on devices
   with less and less room: the unlimited 1 TiB device, a device of 1.02x the peak that
   expandable segments reserve on it, expandable segments' minimum capacity, stitching's and
   compaction's: map calls, unmaps, stream and device synchronizations, the bytes compaction
   copied, the estimated device time at the published costs, and OOMs (the requests that failed
   even after the allocator's last resort).

Deterministic: the same build and traces print the same tables.
"""
import argparse
import json
import os
import subprocess
import sys

EXPANDABLE = "expandable_segments:True"
STITCHING = "expandable_segments:True,stitching:True"
COMPACT = "expandable_segments:True,stitching:True,stitch_compact:True"
FRACTIONS = ["0", "0.1", "0.5", "0.9", "1"]


def replay(exe, trace, configs, capacity=None, min_capacity=False):
    args = [exe, "--no-progress", "--json"]
    if capacity is not None:
        args += ["--capacity", f"{capacity}MiB"]
    if min_capacity:
        args.append("--min-capacity")
    for c in configs:
        args += ["--config", c]
    out = subprocess.run(args + [trace], check=True, capture_output=True, text=True).stdout
    report = json.loads(out)[0]
    return {c["config"]: c for c in report["configs"]}


def name(trace):
    base = os.path.basename(trace)
    return base[:-len(".pickle")] if base.endswith(".pickle") else base


def mib(n):
    return "—" if not n else f"{n // (1 << 20):,}"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", default="build-release/stitch-replay")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args(argv)

    stitch_configs = [f"{STITCHING},stitch_fine_above:{f}" for f in FRACTIONS]
    print("| trace | defaults | expandable | " +
          " | ".join(f"stitching, fine above {f}" for f in FRACTIONS) +
          " | stitching with compaction | compaction over fine pages |")
    print("|---|" + "---:|" * (4 + len(FRACTIONS)))
    for t in a.traces:
        r = replay(a.replay, t, ["", EXPANDABLE] + stitch_configs + [COMPACT], min_capacity=True)
        best = min(r[""]["min_capacity"], r[EXPANDABLE]["min_capacity"])
        cells = []
        for c in stitch_configs + [COMPACT]:
            v = r[c]["min_capacity"]
            cells.append(f"**{mib(v)}**" if v and v <= best else mib(v))
        fine = r[stitch_configs[0]]["min_capacity"]
        over = r[COMPACT]["min_capacity"] - fine
        print(f"| {name(t)} | {mib(r['']['min_capacity'])} | {mib(r[EXPANDABLE]['min_capacity'])} | "
              + " | ".join(cells) + f" | {over / fine:+.3%} ({over / (1 << 20):+,.0f} MiB) |")
    print()

    print("| trace | device | expandable: maps / unmaps / syncs / est. ms / OOMs | "
          "stitching: maps / unmaps / syncs / est. ms / OOMs | "
          "compaction: maps / unmaps / syncs / copied MiB / est. ms / OOMs |")
    print("|---|---|---:|---:|---:|")
    for t in a.traces:
        r = replay(a.replay, t, [EXPANDABLE, STITCHING, COMPACT], min_capacity=True)
        peak = r[EXPANDABLE]["peak_reserved"]
        devices = [(None, "1 TiB"), (int(peak * 1.02) >> 20, "1.02x expandable's peak"),
                   (r[EXPANDABLE]["min_capacity"] >> 20, "expandable's minimum"),
                   (r[STITCHING]["min_capacity"] >> 20, "stitching's minimum"),
                   (r[COMPACT]["min_capacity"] >> 20, "compaction's minimum")]
        for cap, label in devices:
            r = replay(a.replay, t, [EXPANDABLE, STITCHING, COMPACT], capacity=cap)
            cells = []
            for c in (r[EXPANDABLE], r[STITCHING], r[COMPACT]):
                syncs = c["stream_syncs"] + c.get("device_syncs", 0)
                copied = f"{c.get('compacted_bytes', 0) / (1 << 20):,.0f} / " if c is r[COMPACT] else ""
                cells.append(f"{c['maps']:,} / {c['unmaps']:,} / {syncs:,} / {copied}"
                             f"{c['estimated_device_us'] / 1000:,.0f} / {c['ooms']:,}")
            where = label if cap is None else f"{label} ({cap:,} MiB)"
            print(f"| {name(t)} | {where} | {cells[0]} | {cells[1]} | {cells[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Turns stitch-replay --json output into docs/fragmentation.md (python3 standard library only).

usage: fragmentation_report.py --out docs/fragmentation.md [--plots DIR] [--readme traces/README.md]...
                               [--command TEXT] [--example TEXT_FILE --example-command TEXT] JSON...

Each JSON file is what `stitch-replay --json --min-capacity` printed for one or more traces. For
every trace the report has a table with one row per configuration (reserved / requested, peak
reserved, minimum capacity, the device calls and their estimated time as the cost, OOMs) and, when the
trace recorded PyTorch's own segments, what PyTorch reserved in the real run. The descriptions come
from the tables of the given README.md files (first column: the file name). With --plots, SVG plots
named after the traces are linked and shrunk in place (coordinates rounded to whole pixels,
points that add nothing to the picture dropped), so that they stay small in the repository.

With --example, the text stitch-replay printed for one trace with --fits and --capacity gives the
real examples of the fits table and of an out-of-memory explanation (its fits and OOM lines only).

Traces of runs that ran out of memory (a recorded OOM) are reported on their own and left out of
the comparisons and totals, which are about programs' requests.

The report holds no timings and no absolute paths: the same traces give the same file.
"""
import argparse
import json
import os
import re
import sys

GIB = 1 << 30
MIB = 1 << 20


def human(n):
    if n is None:
        return "—"
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n} B"


def config_name(c):
    return "PyTorch defaults (`\"\"`)" if c == "" else f"`{c}`"


def trace_name(path):
    base = os.path.basename(path)
    return base[:-len(".pickle")] if base.endswith(".pickle") else base


def read_readme_rows(paths):
    """{file name: cells by column} from the markdown tables of the README files."""
    rows = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            header = None
            last_repo = {}
            for line in f:
                line = line.strip()
                if not line.startswith("|"):
                    header = None
                    continue
                cells = [c.strip() for c in line.strip("|").split("|")]
                if header is None:
                    header = cells
                    continue
                if set(cells[0]) <= set("-: "):
                    continue
                row = dict(zip(header, cells))
                # "same repo : path" refers to the row above.
                for key, value in row.items():
                    if value.startswith("same repo") and last_repo.get(key):
                        row[key] = last_repo[key] + value[len("same repo"):]
                    elif " @ " in value:
                        last_repo[key] = value.split(" : ")[0]
                rows[cells[0]] = row
    return rows


def recorded_oom(report):
    return (report.get("fidelity") or {}).get("recorded_oom")


def programs(reports):
    """The traces the comparisons and totals are about: not the recorded runs that ran out."""
    return [r for r in reports if not recorded_oom(r)]


def example_blocks(path):
    """From stitch-replay's text for one trace: its fits lines, and its first OOM explanation."""
    if not path:
        return [], []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    fits, oom, where = [], [], None
    for line in lines:
        if line.startswith("  fits ("):
            where = fits
        elif re.match(r"^  [A-Z]+: first OOM", line):
            where = oom if not oom else None
        elif line and not line.startswith("    "):
            where = None
        if where is not None:
            where.append(line[2:])
    return fits, oom


def kind_of(report):
    return "generated" if report["trace"].startswith("traces/") else "real"


def points_shrunk(points):
    """Polyline points rounded to whole pixels, without duplicates or the inner points of
    horizontal and vertical runs."""
    pts = []
    for p in points.split():
        x, y = p.split(",")
        q = (round(float(x)), round(float(y)))
        if not pts or pts[-1] != q:
            pts.append(q)
    out = []
    for p in pts:
        while len(out) >= 2 and ((out[-2][0] == out[-1][0] == p[0]) or (out[-2][1] == out[-1][1] == p[1])):
            out.pop()
        out.append(p)
    return " ".join(f"{x},{y}" for x, y in out)


def shrink_svg(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r'points="([^"]*)"', lambda m: f'points="{points_shrunk(m.group(1))}"', text)
    text = re.sub(r'(y)="(-?\d+\.\d+)"', lambda m: f'{m.group(1)}="{round(float(m.group(2)))}"', text)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def pct(x):
    return f"{100.0 * x:+.2f}%"


def label(i):
    out = ""
    i += 1
    while i > 0:
        i, r = divmod(i - 1, 26)
        out = chr(ord("A") + r) + out
    return out


def fidelity_error(r):
    f = r.get("fidelity")
    return None if not f else f["replayed_peak_reserved"] / f["recorded_peak_reserved"] - 1.0


# Where the published per-call costs come from (stitch-replay's CostModel::published()).
COST_SOURCES = {
    "cudaMalloc": "third-party estimate (jvoltci.github.io \"mosaic\" lesson); RMM PR #283 measured about 38 µs per malloc+free",
    "cudaFree": "third-party estimate (jvoltci.github.io \"mosaic\" lesson); cudaFree also synchronizes the device, which is not counted",
    "cuMemCreate": "kvcached `benchmarks/bench_vmm`, A100-80GB, average per 2 MiB page",
    "cuMemMap": "kvcached `benchmarks/bench_vmm`, A100-80GB, average per 2 MiB page",
    "cuMemSetAccess": "kvcached `benchmarks/bench_vmm`, A100-80GB, average per 2 MiB page; granted once per run of maps, charged per call (the cost of a larger call is not published)",
    "cuMemUnmap": "kvcached `benchmarks/bench_vmm`, A100-80GB, average per 2 MiB page",
    "cuMemRelease": "not published; derived from \"a few ms per GiB\" for unmap plus release on an L20 (torch_memory_saver #111)",
    "cuMemAddressReserve": "kvcached `benchmarks/bench_vmm` (8 GB reservation, A100-80GB)",
    "cuMemAddressFree": "not published; taken equal to cuMemAddressReserve",
    "cudaStreamSynchronize": "not published; an estimate for a stream with no work queued (a real sync also waits for the queued kernels)",
    "cuMemcpyDtoDAsync": "compaction's copies: about 1 ms per 2 GiB on an H200 (the device's copy bandwidth, read and write); per call an estimate; the GPU check measures it",
    "cuMemcpyDtoH/HtoD": "compaction's staging through pageable host memory: an estimate of 12.5 GB/s each way",
    "cuCtxSynchronize": "not published; an estimate for a device with no work queued, as for a stream",
    "cuMemcpyAsync(spill)": "spill's copies between device and host pages: PCIe Gen5 x16, about 50 GB/s; per call an estimate; NVLink-C2C (Grace Hopper) is several times faster (give a cost file)",
}


def est_ms(c):
    us = c.get("estimated_device_us")
    return "—" if us is None else f"{us / 1000.0:,.1f}"


def render_costs(w, reports):
    """The cost model: each call kind with its cost and where the figure comes from."""
    model = next((r for r in reports if r.get("call_costs")), None)
    if model is None:
        return
    w("## Estimated device time")
    w("")
    source = model.get("cost_model", "published")
    w("stitch-replay counts every call the replay makes to the device and charges each a cost per")
    w("call (plus, where a cost file says so, per MiB); the sum is the estimated device time, the")
    w("driver time a GPU would spend on this allocator's calls. It leaves out kernels, the waiting")
    w("inside a stream synchronization, and the device-wide synchronization of cudaFree. The per-call")
    w("figures vary by GPU and driver (a second, unnamed GPU measured cuMemCreate at 7.6 µs instead")
    w("of 193 µs): the estimate ranks configurations, it is not a prediction. `stitch-replay --costs")
    w("FILE` takes other figures; `scripts/gpu-check.sh` writes such a file from its own measurements.")
    w("")
    if source == "published":
        w("Costs used here (published figures):")
    else:
        w(f"Costs used here: from `{os.path.basename(source)}`.")
    w("")
    w("| call | µs per call | µs per MiB | source |")
    w("|---|---:|---:|---|")
    for name, cost in model["call_costs"].items():
        src = COST_SOURCES.get(name, "") if source == "published" else os.path.basename(source)
        w(f"| {name} | {cost['per_call_us']:g} | {cost['per_mib_us']:g} | {src} |")
    w("")


def render_totals(w, reports, configs, labels):
    """Per configuration, summed over every trace: the calls and estimated device time on the
    unlimited device, and on how many traces its minimum capacity is the smallest."""
    w("| config | maps | unmaps | syncs | est. device ms | smallest min capacity |")
    w("|---|---:|---:|---:|---:|---:|")
    best = {c: 0 for c in configs}
    n_cap = 0
    for r in reports:
        caps = {x["config"]: x.get("min_capacity") for x in r["configs"] if x.get("min_capacity")}
        if caps and len(caps) == len(r["configs"]):
            n_cap += 1
            for c, v in caps.items():
                best[c] += v == min(caps.values())
    for c in configs:
        rows = [x for r in reports for x in r["configs"] if x["config"] == c]
        maps = sum(x["maps"] for x in rows)
        unmaps = sum(x["unmaps"] for x in rows)
        syncs = sum(x["stream_syncs"] + x.get("device_syncs", 0) for x in rows)
        est = sum(x.get("estimated_device_us", 0.0) for x in rows) / 1000.0
        w(f"| {labels[c]}: {config_name(c)} | {maps:,} | {unmaps:,} | {syncs:,} | {est:,.1f} | "
          f"{best[c]} of {n_cap} |")
    w("")


def render_cost_summary(w, reports, configs, labels):
    """Each configuration's calls against expandable segments' on the unlimited device."""
    base = "expandable_segments:True"
    if base not in configs:
        return
    for c in configs:
        if c in ("", base):
            continue
        ratios, syncs, more_unmaps, est, est_base, n = [], 0, [], 0.0, 0.0, 0
        for r in reports:
            by = {x["config"]: x for x in r["configs"]}
            if base not in by or c not in by:
                continue
            n += 1
            b, x = by[base], by[c]
            name = trace_name(r["trace"])
            ratios.append(((x["maps"] / b["maps"]) if b["maps"] else (1.0 if x["maps"] == 0 else float("inf")), name))
            syncs += x["stream_syncs"]
            if x["unmaps"] > b["unmaps"]:
                more_unmaps.append(name)
            est += x.get("estimated_device_us", 0.0)
            est_base += b.get("estimated_device_us", 0.0)
        if n == 0:
            continue
        worst = max(ratios)
        same = sum(1 for ratio, _ in ratios if ratio == 1.0)
        maps = (f"the same map calls on all {n} traces" if same == n else
                f"map calls at most {worst[0]:.2f}x ({worst[1]}), the same on {same} of {n} traces")
        w(f"{labels[c]} against {labels[base]} ({config_name(base)}) on the unlimited device: "
          f"{maps}, {syncs:,} stream synchronizations, "
          f"more unmaps on {len(more_unmaps)} of {n} traces"
          + (f" ({', '.join(more_unmaps)})" if more_unmaps else "")
          + (f"; estimated device time {est / est_base:.2f}x in all" if est_base else "") + ".")
        w("")


def config_labels(reports):
    """Every config of the reports in first-seen order, and its letter (A, B, ...)."""
    configs = []
    for r in reports:
        for c in r["configs"]:
            if c["config"] not in configs:
                configs.append(c["config"])
    return configs, {c: label(i) for i, c in enumerate(configs)}


def render(reports, readme_rows, plots_dir, out_path, command, example="", example_command=""):
    lines = []
    w = lines.append
    configs, labels = config_labels(reports)

    w("# Fragmentation benchmark")
    w("")
    w("Generated by `scripts/fragmentation-bench.sh` — do not edit; rerun it"
      + (f" (`{command}`)." if command else "."))
    w("")
    w("Every trace is replayed through stitch on the simulated device under each configuration,")
    w("from an empty allocator: the blocks the program held when the trace began (usually the")
    w("weights) are allocated first, so every figure counts them. The configurations:")
    w("")
    for c in configs:
        w(f"- **{labels[c]}**: {config_name(c)}")
    w("")
    w("Columns:")
    w("")
    w("- **peak requested**: the most bytes the program had allocated at once (sizes as asked for),")
    w("  the memory live at the start included;")
    w("- **peak reserved**: the most bytes the allocator held from the device;")
    w("- **reserved / requested**: their ratio: 1.000 means no memory lost to rounding, caching or")
    w("  fragmentation;")
    w("- **min capacity**: the smallest device (in 2 MiB steps) on which the whole trace runs without")
    w("  an out-of-memory error (when it runs out, the allocator frees its cached segments and")
    w("  retries, as PyTorch's does), i.e. the GPU this workload needs under this configuration;")
    w("- **cudaMalloc**, **maps**, **unmaps** and **syncs**: the cost: segments allocated from the")
    w("  driver, page ranges mapped and unmapped (expandable segments and stitching map pages with")
    w("  cuMemMap instead of allocating segments), and stream (and device) synchronizations, on the")
    w("  unlimited (1 TiB) device;")
    w("- **copied**: the live bytes compaction (`stitch_compact:True`) copied to free coarse pages,")
    w("  on the unlimited device: with room it never runs;")
    w("- **est. device ms**: the device time those calls would take at the costs below (see")
    w("  [Estimated device time](#estimated-device-time)), on the unlimited device;")
    w("- **OOMs**: requests that failed on the unlimited device: 0 unless the trace is broken.")
    w("")
    render_costs(w, reports)
    w("## The state at the start, PyTorch's peak, and the fidelity replay")
    w("")
    w("A snapshot holds the allocator's segments at the moment it was dumped and the trace of")
    w("events before it. PyTorch clears the trace when recording is turned off")
    w("(`recordHistory` in c10/cuda/CUDACachingAllocator.cpp), so a dump that carries a trace was")
    w("taken while recording was on, and what the trace does not explain was there before it began.")
    w("The rules, applied to every trace:")
    w("")
    w("- **Live at the start**: a block that is active in the dump (allocated, or freed and waiting")
    w("  for another stream), that the trace never allocated, and that lies outside every range the")
    w("  trace created (`segment_alloc` / `segment_map`); and a block the trace frees without having")
    w("  allocated it. Its size is the size the program asked for; where the dump shows the block,")
    w("  its layout (address, block size, stream) is kept.")
    w("- **Held at the start**: a segment that is in the dump and that the trace did not create, and")
    w("  a segment the trace frees without having created it: the dump's segments with the trace's")
    w("  segment events undone, newest first (for expandable segments, the mapped ranges with the")
    w("  trace's `segment_map` taken out and its `segment_unmap` put back).")
    w("- **Reserved at the start** is the dump's reserved memory minus the trace's net segment")
    w("  events; **cached at the start** is what of it no live block used.")
    w("- **PyTorch's peak reserved** (what PyTorch really held at its peak) is reserved at the start")
    w("  plus the running maximum of the trace's segment events (`segment_alloc` and `segment_map`")
    w("  up, `segment_free` and `segment_unmap` down). A trace without segment events shows —.")
    w("- **The fidelity replay** replays the trace under the settings the recording ran with (the")
    w("  snapshot's `allocator_settings`: `expandable_segments`, `max_split_size`,")
    w("  `roundup_power2_divisions`, `garbage_collection_threshold`, and the keys of")
    w("  `PYTORCH_CUDA_ALLOC_CONF` that stitch shares with PyTorch; PyTorch's defaults when the file")
    w("  has none, as older snapshots), starting from the held segments with the live blocks where")
    w("  the recording had them, and gives cached memory back where the recording did: a run of")
    w("  `segment_free` after which PyTorch kept no entirely free segment (an `empty_cache()`, or its")
    w("  out-of-memory ladder before a retry) is an `empty_cache()`; a run after which it did (garbage")
    w("  collection, oversize segments) gives back one free segment of each size it names. It is")
    w("  compared with PyTorch's peak reserved; the segment agreement is the share of the segment sizes")
    w("  the trace created that the replay created too.")
    w("")
    render_oom_rules(w, reports)
    render_fits(w, example, example_command)
    w("Generated traces come from `traces/` (see traces/README.md: synthetic training workloads")
    w("written by `stitch-tracegen`), real ones from PyTorch memory snapshots recorded on real GPUs")
    w("(`../shared/traces`, when present).")
    w("")

    # Summary: reserved / requested and min capacity per config.
    w("## Summary")
    w("")
    head = "| trace | kind | events | live at start | peak requested |"
    sep = "|---|---|---:|---:|---:|"
    for c in configs:
        head += f" {labels[c]}: rsv/req | {labels[c]}: min capacity |"
        sep += "---:|---:|"
    head += " PyTorch peak reserved | PyTorch rsv/req | fidelity |"
    sep += "---:|---:|---:|"
    w(head)
    w(sep)
    for r in reports:
        name = trace_name(r["trace"])
        kind = kind_of(r)
        by = {c["config"]: c for c in r["configs"]}
        peak_req = max(c["peak_requested"] for c in r["configs"]) if r["configs"] else 0
        row = (f"| [{name}](#{name}) | {kind} | {r['events']:,} | {human(r.get('live_at_start', 0))} | "
               f"{human(peak_req)} |")
        for c in configs:
            x = by.get(c)
            if x is None:
                row += " — | — |"
            else:
                mc = x.get("min_capacity")
                row += f" {x['reserved_over_requested']:.3f} | {human(mc) if mc else '—'} |"
        rec = r.get("recorded_peak_reserved")
        err = fidelity_error(r)
        row += f" {human(rec)} |"
        row += f" {rec / peak_req:.3f} |" if rec and peak_req else " — |"
        row += f" {pct(err)} |" if err is not None else " — |"
        w(row)
    w("")

    # Each configuration against PyTorch's defaults, computed (not written by hand).
    all_reports, reports = reports, programs(reports)
    for c in configs:
        if c == "":
            continue
        less_rsv, more_rsv, less_cap, more_cap, n = [], [], [], [], 0
        for r in reports:
            by = {x["config"]: x for x in r["configs"]}
            if "" not in by or c not in by:
                continue
            n += 1
            d, x = by[""], by[c]
            name = trace_name(r["trace"])
            (less_rsv if x["peak_reserved"] < d["peak_reserved"] else
             more_rsv if x["peak_reserved"] > d["peak_reserved"] else []).append(name)
            if x.get("min_capacity") and d.get("min_capacity"):
                (less_cap if x["min_capacity"] < d["min_capacity"] else
                 more_cap if x["min_capacity"] > d["min_capacity"] else []).append(name)
        if n == 0:
            continue
        w(f"{labels[c]} ({config_name(c)}) against PyTorch's defaults: peak reserved lower on {len(less_rsv)} of {n} traces"
          + (f", higher on {', '.join(more_rsv)}" if more_rsv else "")
          + f"; minimum capacity lower on {len(less_cap)} of {n}"
          + (f", higher on {', '.join(more_cap)}" if more_cap else "") + ".")
        w("")
    render_cost_summary(w, reports, configs, labels)
    w(f"Totals over the {len(reports)} traces (calls on the unlimited device; ties for the smallest "
      "minimum capacity counted for each):")
    w("")
    render_totals(w, reports, configs, labels)
    reports = all_reports
    # Fidelity on the traces with segment events.
    errs = [(trace_name(r["trace"]), fidelity_error(r)) for r in reports if fidelity_error(r) is not None]
    if errs:
        within = [n for n, e in errs if abs(e) <= 0.01]
        worst = max(errs, key=lambda x: abs(x[1]))
        agree = [r["fidelity"]["segment_agreement"] for r in reports if r.get("fidelity")]
        w(f"Fidelity: on {len(within)} of {len(errs)} traces with segment events the replay under the "
          f"recorded settings is within 1% of PyTorch's peak reserved (largest difference "
          f"{pct(worst[1])}, {worst[0]}); segment sizes agree {100.0 * min(agree):.1f}% to "
          f"{100.0 * max(agree):.1f}%.")
        w("")

    for r in reports:
        name = trace_name(r["trace"])
        kind, cells = kind_of(r), readme_rows.get(name + ".pickle", {})
        w(f"## {name}")
        w("")
        desc = cells.get("imitates") or cells.get("source (public repository @ commit : path)")
        origin = ("generated trace (`traces/`)" if kind == "generated"
                  else f"real trace, recorded by {r.get('recorded_by', 'PyTorch')}")
        w(f"{origin}: {desc}." if desc else f"{origin}.")
        if r.get("starts_empty"):
            start = "it starts from an empty allocator"
        else:
            start = (f"at the start {human(r.get('live_at_start', 0))} was live in "
                     f"{r.get('initial_blocks', 0):,} blocks, and the recording allocator held "
                     f"{human(r.get('reserved_at_start', 0))} in {r.get('held_segments', 0):,} segments "
                     f"({human(r.get('cached_at_start', 0))} of it cached)")
        w(f"{r['events']:,} events; {start}.")
        w("")
        w("| config | peak requested | peak reserved | reserved / requested | min capacity | cudaMalloc | maps | unmaps | syncs | copied | est. device ms | OOMs |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in r["configs"]:
            mc = c.get("min_capacity", "unset")
            mc_text = "—" if mc == "unset" else ("does not fit" if mc is None else human(mc))
            w(f"| {labels[c['config']]}: {config_name(c['config'])} | {human(c['peak_requested'])} | "
              f"{human(c['peak_reserved'])} | {c['reserved_over_requested']:.3f} | {mc_text} | "
              f"{c['device_allocs']:,} | {c['maps']:,} | {c['unmaps']:,} | "
              f"{c['stream_syncs'] + c.get('device_syncs', 0):,} | {human(c.get('compacted_bytes', 0))} | "
              f"{est_ms(c)} | {c['ooms']} |")
        rec = r.get("recorded_peak_reserved")
        by = r.get("recorded_by", "PyTorch")
        if rec or kind == "real":
            w("")
        if rec:
            fid = r.get("fidelity")
            line = f"Peak reserved by the recording ({by}): {human(rec)}"
            if fid:
                settings = fid.get("config") or "PyTorch defaults"
                if not r.get("settings_recorded", True):
                    settings += ", assumed (the file does not record its settings)"
                line += (f"; replayed under the recorded settings ({settings}) from the recorded start, "
                         f"{fid.get('releases', 0)} release{'s' if fid.get('releases', 0) != 1 else ''} "
                         f"honoured: {human(fid['replayed_peak_reserved'])} ({pct(fidelity_error(r))}), "
                         f"segment sizes agree {100.0 * fid['segment_agreement']:.1f}% "
                         f"({fid.get('recorded_segments', 0):,} recorded, {fid.get('replayed_segments', 0):,} replayed)")
            w(line + ".")
            oom = recorded_oom(r)
            if oom:
                cap = fid.get("capacity", 0)
                w("")
                w(f"The recording ran out of memory: a {human(oom['size'])} request failed at event "
                  f"{oom['event'] + 1:,} with {human(oom['reserved'])} held and {human(oom['device_free'])} "
                  f"free on the device, so the fidelity replay ran on a {human(cap)} device; there the "
                  + ("OOM is reproduced, at the same event." if fid.get("oom_reproduced") else
                     f"OOM is NOT reproduced (first failure: event {fid.get('replayed_oom_event')})."))
        elif kind == "real":
            w(f"Peak reserved by the recording ({by}): — (the trace has no segment events).")
        if plots_dir:
            svg = os.path.join(plots_dir, name + ".svg")
            if os.path.exists(svg):
                rel = os.path.relpath(svg, os.path.dirname(os.path.abspath(out_path)))
                w("")
                w(f"![{name}: requested, reserved and reserved-but-unallocated over the trace]({rel})")
        w("")
    return "\n".join(lines)


def render_oom_rules(w, reports):
    w("## Runs that ran out of memory")
    w("")
    w("A run that ran out of memory records it: PyTorch's allocator, after its out-of-memory ladder")
    w("(`release_cached_blocks()`, which gives the cache back: the `segment_free` / `segment_unmap`")
    w("run just before), writes an `oom` entry with the request (`size`, rounded) and `device_free`,")
    w("what `cudaMemGetInfo` said was free then (`record_trace(TraceEntry::OOM, device_free, ...)` in")
    w("c10/cuda/CUDACachingAllocator.cpp). The fidelity replay of such a trace runs on the device it")
    w("implies, one rule per device trace:")
    w("")
    w("- **The device** is what the allocator held at the first `oom` entry (reserved at the start")
    w("  plus the trace's segment events before it) plus `device_free`, rounded down to 2 MiB, and")
    w("  never less than the most the recording held. Memory the allocator did not own (the CUDA")
    w("  context, NCCL and other libraries, other processes) is in neither figure, so it is left out")
    w("  of the simulated device as it was out of the allocator's reach on the real one. A device")
    w("  trace without an `oom` entry is replayed on an unlimited device, as before.")
    w("- The recorded failed requests are tried again in the replay (freed at once if served), and")
    w("  the OOM is **reproduced** when the replay's first failed request is the recording's, at the")
    w("  same event.")
    w("- A run of `segment_unmap` followed by a `segment_map` is PyTorch's ladder giving the cache")
    w("  back and growing again: a release (only a stitch recording made with `stitching:True` may")
    w("  move pages that way).")
    w("")
    ooms = [r for r in reports if recorded_oom(r)]
    for r in ooms:
        fid, oom = r["fidelity"], recorded_oom(r)
        w(f"On {trace_name(r['trace'])} ({'generated' if kind_of(r) == 'generated' else 'real'}), a "
          f"{human(oom['size'])} request failed at event {oom['event'] + 1:,} with {human(oom['reserved'])} "
          f"held and {human(oom['device_free'])} free: the replay ran on {human(fid.get('capacity', 0))}, "
          f"reserved {human(fid['replayed_peak_reserved'])} against {human(fid['recorded_peak_reserved'])} "
          f"recorded ({pct(fidelity_error(r))}), and "
          + ("reproduced the OOM at the same event." if fid.get("oom_reproduced") else "did NOT reproduce the OOM."))
        w("")


# The sizes of stitch-replay --fits (src/tools/stitch_replay/fits.cpp): the total CUDA reports,
# less 512 MiB, rounded down to 2 MiB.
GPUS = [
    ("14.06 GiB", "16 GB class: NVIDIA T4", "14.56 GiB (14,909 MiB)",
     "PyTorch's OOM messages on T4s: \"total capacity of 14.56 GiB\" (Zheng-Chong/CatVTON#133, "
     "AlphaGPU/leetgpu-challenges#52), 14.57 GiB (QwenLM/Qwen3-VL#1046); older drivers 14.74 to "
     "14.76 GiB (googlecolab/colabtools#3439, zai-org/CogVideo#741), i.e. deviceQuery's 15,110 MiB"),
    ("21.55 GiB", "24 GB class: NVIDIA L4 (an A10 reports about the same, 21.99 GiB; an RTX 4090 "
     "1.6 GiB more)", "22.05 GiB (22,579 MiB)",
     "PyTorch's OOM messages on L4s: \"total capacity of 22.05 GiB\" (vllm-project/vllm#20214, "
     "vllm-project/vllm-omni#168); A10: 21.99 GiB (zai-org/CogVLM#236); RTX 4090: 23.64 GiB "
     "(3DTopia/Phidias-Diffusion#8)"),
    ("39.09 GiB", "A100 40GB", "39.59 GiB (40,536 MiB)",
     "PyTorch's OOM message on an A100 40GB: \"39.59 GiB total capacity\" "
     "(raoyongming/DenseCLIP#52); others print 39.50 GiB (TianheWu/CoSeR#10) down to 39.38 GiB "
     "(A100-PCIE-40GB, vllm-project/vllm#16749)"),
    ("43.92 GiB", "48 GB class: L40S, RTX 6000 Ada", "44.42 GiB (45,486 MiB)",
     "PyTorch's OOM message on an L40S: \"total capacity of 44.42 GiB\" "
     "(stepfun-ai/Step-Video-T2V#8); RTX 6000 Ada: 44.43 GiB (DINGYANB/MTVCrafter#21)"),
    ("78.61 GiB", "80 GB class: H100 80GB (an A100 80GB reports 79.15 to 79.25 GiB, a little more)",
     "79.11 GiB (81,009 MiB)",
     "PyTorch's OOM messages on an H100: \"total capacity of 79.11 GiB\" (vllm-project/vllm#27508) "
     "and an H800 (verl-project/verl#2828); nvidia-smi says 81,559 MiB (LMCache/LMCache#259); "
     "A100 80GB: 79.25 GiB (levihsu/OOTDiffusion#235)"),
    ("139.30 GiB", "H200 (141 GB)", "139.80 GiB (143,155 MiB)",
     "PyTorch's OOM messages on H200s print 139.80 GiB (139.81 and 139.72 GiB also seen) in "
     "public notes found by text search; no issue thread to cite: to be checked on a device "
     "(`torch.cuda.mem_get_info()`)"),
]


def code_block(w, intro, lines):
    """`intro`, then `lines` as a code block (nothing when there are none)."""
    if not lines:
        return
    w(intro)
    w("")
    w("```")
    for line in lines:
        w(line)
    w("```")
    w("")


def render_fits(w, example, example_command):
    fits, oom = example_blocks(example)
    w("## Fits on which GPU")
    w("")
    w("`stitch-replay --fits` replays every configuration on the memory common GPUs report as their")
    w("total, less 512 MiB for the CUDA context, and says per size whether the trace fits (runs without")
    w("an OOM, the criterion of `--min-capacity`), the headroom at the peak (size minus peak reserved),")
    w("or the first OOM's verdict. `--fits=24GiB,40GiB` takes the sizes given (the `=` is needed). Each")
    w("size is replayed for real, once per configuration; those replays bound the bisection of the")
    w("smallest fitting device, which is printed too. Running out of memory is not always monotone in")
    w("the device's size (`stitch_fine_above` is relative to it): where a size at or above the smallest")
    w("fitting device fails, or one below it fits, both answers say so. The tool prints sizes; the GPUs")
    w("behind them are below.")
    w("")
    w("\"Reported total\" is the total CUDA itself reports (`cudaMemGetInfo`, which PyTorch prints in an")
    w("out-of-memory message as \"GPU 0 has a total capacity of X GiB\"), not nvidia-smi's `memory.total`:")
    w("nvidia-smi counts memory the driver keeps for itself, 0.4 to 0.9 GiB more on these cards")
    w("(nvidia-smi totals: modal-labs/modal-client#2797). The total also moves with the driver by up to")
    w("0.2 GiB (a T4 printed 14.75 GiB in 2023, 14.56 GiB in 2025); the figures below are recent ones.")
    w("PyTorch prints two decimals, so a total in MiB is good to about 5 MiB. The 512 MiB for the context")
    w("is a margin over what PyTorch's context takes with lazy module loading, its default since 1.13:")
    w("287,047,680 bytes after a first small tensor, 666,632,192 bytes with eager loading")
    w("(pytorch/pytorch#86509), \"around 400MB\" (pytorch/pytorch#109888). Sources are GitHub threads")
    w("(owner/repo#number).")
    w("")
    w("| size replayed | GPUs | reported total | source of the figure |")
    w("|---:|---|---:|---|")
    for size, gpus, total, source in GPUS:
        w(f"| {size} | {gpus} | {total} | {source} |")
    w("")
    code_block(w, f"A real example (`{example_command}`; A = PyTorch's defaults, B = `expandable_segments:True`):",
               fits)
    w("## Out-of-memory explanations")
    w("")
    w("With `--capacity`, the first OOM of each configuration is explained as the live OOM report")
    w("explains one (docs/diagnostics.md): the request and its stream; the verdict with its numbers")
    w("(live data exceeds the device, fragmentation, memory held elsewhere, or device full); the")
    w("what-if over the run's other configurations on the same device, read from their own replays")
    w("(they served the request, fail there too, or failed earlier); the largest live blocks with the")
    w("events that allocated them; and the recorded frames of the failing request and of those")
    w("blocks (file:line of the Python code, when the snapshot has them: the file is read again with")
    w("its frames only when something is explained). `--explain-all` explains every OOM. In the JSON,")
    w("each configuration with OOMs has `first_oom`, and `oom_reports` under `--explain-all`.")
    w("`--html FILE` writes the tables, plots, breakdown at the peak, fits and explanations as one")
    w("self-contained page.")
    w("")
    code_block(w, "A real example, from the same run:", oom)


BEGIN = "<!-- fragmentation totals: written by scripts/fragmentation-bench.sh -->"
END = "<!-- end of fragmentation totals -->"


def write_totals(path, reports, command):
    """Replaces the part of `path` between BEGIN and END with the totals table."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no '{BEGIN}' ... '{END}' section")
    reports = programs(reports)
    configs, labels = config_labels(reports)
    lines = [BEGIN, ""]
    lines.append(f"Totals over the {len(reports)} traces of [fragmentation.md](fragmentation.md)"
                 + (f" (`{command}`)" if command else "") + ": calls on the unlimited device, the "
                 "estimated device time at published per-call costs, and on how many traces each "
                 "configuration needs the smallest device.")
    lines.append("")
    render_totals(lines.append, reports, configs, labels)
    lines.append(END)
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + "\n".join(lines) + tail)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--totals", default="", help="also write the totals table into this file's "
                    "marked section (docs/benchmarks.md)")
    ap.add_argument("--plots", default="")
    ap.add_argument("--readme", action="append", default=[])
    ap.add_argument("--command", default="")
    ap.add_argument("--example", default="", help="stitch-replay's text for one trace with --fits "
                    "and --capacity: the fits and OOM explanation examples")
    ap.add_argument("--example-command", default="")
    ap.add_argument("json", nargs="+")
    a = ap.parse_args(argv)
    reports = []
    for path in a.json:
        with open(path, encoding="utf-8") as f:
            reports.extend(json.load(f))
    if a.plots and os.path.isdir(a.plots):
        for f in sorted(os.listdir(a.plots)):
            if f.endswith(".svg"):
                shrink_svg(os.path.join(a.plots, f))
    text = render(reports, read_readme_rows(a.readme), a.plots, a.out, a.command, a.example, a.example_command)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    if a.totals:
        write_totals(a.totals, reports, a.command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

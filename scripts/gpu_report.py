#!/usr/bin/env python3
"""scripts/gpu_report.py — turns stitch_gpu_bench's Google Benchmark JSON (plus the gpu-check
step log, the ctest log and nvidia-smi's output) into one markdown report. Standard library only.

  gpu_report.py --out report.md [--bench-json F ...] [--steps F] [--ctest-log F]
                [--nvidia-smi F] [--no-gpu REASON] [--costs-out costs.json]
  gpu_report.py --self-test FIXTURE.json     # checks the report built from a hand-made JSON
  gpu_report.py --stitch-cost-status F ...   # 'STATUS<TAB>DETAIL' of the stitch_cost benchmarks
  gpu_report.py --compaction-cost-status F ...   # the same for the compaction_cost benchmarks
  gpu_report.py --sleep-cost-status F ...   # the same for the sleep_cost benchmarks

Benchmark names (see benchmarks/gpu/gpu_bench.cpp): pair/<peer>/<size>, mixed/<peer>,
changing/<peer>, vmm/<call>/<size>, stitch_cost/<op>/<N>pages (its section: gpu_report_stitch.py),
compaction_cost/<op>/<label> (gpu_report_compaction.py), sleep_cost/<op>/<label>
(gpu_report_sleep.py; number formats: gpu_report_format.py); Google Benchmark appends /real_time, /manual_time,
/iterations:N, /repeats:N and, for aggregates, _median etc. (the median is used).
Time per operation is 1e9 / items_per_second (one item = one allocator call); ratios are
stitch ÷ peer, so below 1 is better for stitch, for time and for peak reserved bytes alike.

--costs-out writes the measured call costs as a stitch-replay cost file (`stitch-replay
--costs FILE`): per call, the cost per call and per MiB fitted to the vmm/<call>/<size> medians
(least squares over the sizes, neither below 0), and compaction's copies and device sync
(gpu_report_compaction.measured_costs); calls it did not measure keep the published figures there.
"""
import argparse
import json
import os
import re
import sys
import tempfile

from gpu_report_format import fmt_bytes, fmt_ns, fmt_ratio, ratio
import gpu_report_compaction
import gpu_report_sleep
import gpu_report_stitch

PEERS = ["cudaMalloc", "cudaMallocAsync", "torch", "torch_expandable", "stitch", "stitch_expandable"]
STITCHES = ["stitch", "stitch_expandable"]
OTHERS = ["cudaMalloc", "cudaMallocAsync", "torch", "torch_expandable"]
VMM_CALLS = ["cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease", "cycle"]
TIME_UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
WORKLOADS = [
    ("pair", "Warm cache-hit alloc+free pair",
     "One allocation and one free of the same size, repeated; the caching peers serve it from "
     "their cache (cudaMalloc has none). Host time per allocator call."),
    ("mixed", "Random mixed workload",
     "A fixed trace (seed 20240601) of 6000 calls: sizes log-uniform in 512 B..64 MiB, up to "
     "1000 blocks live, everything freed at the end; replayed warm. Host time per call."),
    ("changing", "Changing sizes",
     "8 tensors (1.5..48 MiB at step 0) allocated and freed every step for 48 steps, each 4 % "
     "larger than the step before (a growing batch / sequence length), from an empty cache; "
     "median of 3 runs. The case expandable segments exist for: compare peak reserved."),
]


# ---- loading --------------------------------------------------------------------------------------

def load_json_tolerant(path):
    """Returns (data or None, note). Repairs a file cut short by a crash (the JSON reporter
    writes one benchmark object at a time) by closing it after the last complete object."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        return None, f"{path}: cannot read ({e.strerror})"
    if not text.strip():
        return None, f"{path}: empty"
    try:
        return json.loads(text), ""
    except ValueError:
        pass
    cut = text.rfind("\n    }")
    if cut >= 0:
        try:
            data = json.loads(text[:cut + 6] + "\n  ]\n}\n")
            return data, f"{path}: truncated (the run stopped early); read up to the last complete result"
        except ValueError:
            pass
    head = text.find('"benchmarks"')
    if head >= 0:
        try:
            data = json.loads(text[:head].rstrip().rstrip(",") + "\n}\n")
            data["benchmarks"] = []
            return data, f"{path}: truncated before any result"
        except ValueError:
            pass
    return None, f"{path}: not valid JSON"


def key_of(entry):
    """('pair', 'stitch', '4KiB') from 'pair/stitch/4KiB/real_time' (run_name preferred)."""
    name = entry.get("run_name") or entry.get("name", "")
    if entry.get("run_type") == "aggregate" and "run_name" not in entry:
        name = re.sub(r"_(mean|median|stddev|cv)$", "", name)
    parts = [p for p in name.split("/")
             if p and ":" not in p and p not in ("real_time", "manual_time", "process_time")]
    return tuple(parts)


class Results:
    def __init__(self):
        self.rows = {}       # key -> dict(ns_per_op, time_ns, peak, segments, counters, error)
        self.context = {}
        self.notes = []      # problems reading the inputs
        self.files = 0       # JSON files read

    def add_file(self, path):
        data, note = load_json_tolerant(path)
        if note:
            self.notes.append(note)
        if data is None:
            return
        self.files += 1
        for k, v in (data.get("context") or {}).items():
            if isinstance(v, (str, int, float)):
                self.context.setdefault(k, v)
        for e in data.get("benchmarks") or []:
            if e.get("run_type") == "aggregate" and e.get("aggregate_name") != "median":
                continue
            key = key_of(e)
            if not key:
                continue
            row = {"error": None}
            if e.get("error_occurred"):
                msg = str(e.get("error_message") or "error").strip().splitlines() or ["error"]
                row["error"] = msg[0][:300] + (" …" if len(msg) > 1 or len(msg[0]) > 300 else "")
            else:
                unit = TIME_UNITS.get(e.get("time_unit", "ns"), 1.0)
                row["time_ns"] = float(e.get("real_time", float("nan"))) * unit
                ips = e.get("items_per_second")
                row["ns_per_op"] = 1e9 / float(ips) if ips else None
                row["peak"] = e.get("peak_reserved")
                row["segments"] = e.get("peak_segments")
                row["counters"] = {k: v for k, v in e.items()
                                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
            old = self.rows.get(key)
            if old is None or (old["error"] and not row["error"]):
                self.rows[key] = row

    def get(self, *key):
        return self.rows.get(tuple(key))


# ---- formatting -----------------------------------------------------------------------------------

def cell_time(row):
    if row is None:
        return "—"
    if row["error"]:
        return "error"
    return fmt_ns(row.get("ns_per_op"))


def cell_peak(row):
    if row is None:
        return "—"
    if row["error"]:
        return "error"
    return fmt_bytes(row.get("peak"))


def size_sort_key(label):
    m = re.match(r"(\d+)(B|KiB|MiB|GiB)$", label)
    if not m:
        return (1, label)
    mult = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
    return (0, int(m.group(1)) * mult)


# ---- the report ---------------------------------------------------------------------------------

def read_steps(path):
    steps = []
    if path and os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 2:
                    while len(parts) < 4:
                        parts.append("")
                    steps.append(parts[:4])
    return steps


def ctest_summary(path):
    """Lines describing the ctest run (summary, skipped count, failures)."""
    if not path or not os.path.exists(path):
        return ["ctest did not run (no log)."]
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = []
    m = None
    for m in re.finditer(r"^\s*(\d+% tests passed, \d+ tests? failed out of \d+)\s*$", text, re.M):
        pass
    out.append(f"`{m.group(1)}`" if m else "no ctest summary line found (ctest did not finish?)")
    t = re.findall(r"Total Test time \(real\) =\s*([\d.]+ sec)", text)
    if t:
        out.append(f"Total test time: {t[-1]}.")
    skipped = re.findall(r"^\s*\d+ - (\S+).*\(Skipped\)\s*$", text, re.M)
    if skipped:
        cuda = [s for s in skipped if "cuda" in s.lower()]
        out.append(f"Skipped: {len(skipped)} test(s), {len(cuda)} of them CUDA tests"
                   + (f" (e.g. `{skipped[0]}`)." if skipped else "."))
    failed_block = re.search(r"The following tests FAILED:\n((?:\s+\d+ - .*\n?)+)", text)
    if failed_block:
        names = [re.sub(r"\s+#.*?(\((Failed|SEGFAULT|Timeout|Not Run|Subprocess aborted|Exception)\))", r" \1", n)
                 for n in re.findall(r"\d+ - (.*)", failed_block.group(1))]
        shown = ", ".join(f"`{n.strip()}`" for n in names[:30])
        more = f" and {len(names) - 30} more" if len(names) > 30 else ""
        out.append(f"FAILED: {shown}{more}.")
    return out


def workload_section(res, wl, title, blurb, lines):
    keys = [k for k in res.rows if k[0] == wl]
    lines.append(f"## {title}")
    lines.append("")
    lines.append(blurb)
    lines.append("")
    if not keys:
        lines.append("No results.")
        lines.append("")
        return
    peers = [p for p in PEERS if any(k[1] == p for k in keys)]
    sizes = sorted({k[2] for k in keys if len(k) > 2}, key=size_sort_key) if wl == "pair" else [None]

    def row(peer, size):
        return res.get(wl, peer, size) if size else res.get(wl, peer)

    head = "| " + ("size | " if wl == "pair" else "") + "measure | " + " | ".join(peers) + " |"
    lines.append(head)
    lines.append("|" + "---|" * (len(peers) + (2 if wl == "pair" else 1)))
    for size in sizes:
        pre = f"| {size} " if size else ""
        lines.append(pre + "| time per op | " + " | ".join(cell_time(row(p, size)) for p in peers) + " |")
        lines.append(pre + "| peak reserved | " + " | ".join(cell_peak(row(p, size)) for p in peers) + " |")
    lines.append("")
    errors = [(p, s, row(p, s)["error"]) for s in sizes for p in peers
              if row(p, s) is not None and row(p, s)["error"]]
    for p, s, err in errors:
        lines.append(f"- `{wl}/{p}{'/' + s if s else ''}` failed: {err}")
    if errors:
        lines.append("")

    # Ratios: stitch ÷ peer.
    present_stitch = [s for s in STITCHES if s in peers]
    cols = [p for p in OTHERS if p in peers] + (["stitch"] if "stitch_expandable" in peers and "stitch" in peers else [])
    if not present_stitch or not cols:
        return
    lines.append("Ratios, stitch ÷ peer (below 1: stitch better):")
    lines.append("")
    lines.append("| " + ("size | " if wl == "pair" else "") + "stitch variant | measure | "
                 + " | ".join("vs " + c for c in cols) + " |")
    lines.append("|" + "---|" * (len(cols) + (3 if wl == "pair" else 2)))
    for size in sizes:
        for s in present_stitch:
            mine = row(s, size)
            if mine is None:
                continue
            measures = [("time", "ns_per_op", "faster", "slower")]
            if wl != "pair":
                measures.append(("peak reserved", "peak", "less", "more"))
            for label, field, better, worse in measures:
                cells = []
                for c in cols:
                    other = row(c, size)
                    if c == s or mine is None or other is None or mine["error"] or other["error"]:
                        cells.append("—")
                    else:
                        cells.append(fmt_ratio(ratio(mine.get(field), other.get(field)), better, worse))
                pre = f"| {size} " if size else ""
                lines.append(pre + f"| {s} | {label} | " + " | ".join(cells) + " |")
    lines.append("")


def vmm_section(res, lines):
    keys = [k for k in res.rows if k[0] == "vmm" and len(k) > 2]
    lines.append("## Raw VMM call costs")
    lines.append("")
    lines.append("Each iteration runs cuMemCreate → cuMemMap → cuMemSetAccess → cuMemUnmap → "
                 "cuMemRelease on one range of the given size; each column times that call alone "
                 "(`cycle`: all five). Driver entry points via dlopen and cuGetProcAddress, as the back end.")
    lines.append("")
    gmin = res.context.get("stitch_vmm_granularity_min")
    grec = res.context.get("stitch_vmm_granularity_recommended")
    if gmin:
        lines.append(f"Granularity: minimum {fmt_bytes(float(gmin))}, recommended {fmt_bytes(float(grec or 0))}.")
        lines.append("")
    if res.context.get("stitch_vmm_unavailable"):
        lines.append(f"VMM unavailable: {res.context['stitch_vmm_unavailable']}")
        lines.append("")
    if not keys:
        lines.append("No results.")
        lines.append("")
        return
    sizes = sorted({k[2] for k in keys}, key=size_sort_key)
    calls = [c for c in VMM_CALLS if any(k[1] == c for k in keys)]
    lines.append("| size | " + " | ".join(calls) + " |")
    lines.append("|" + "---|" * (len(calls) + 1))
    for s in sizes:
        cells = []
        for c in calls:
            r = res.get("vmm", c, s)
            cells.append("—" if r is None else ("error" if r["error"] else fmt_ns(r.get("time_ns"))))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")
    for k in sorted(keys):
        r = res.rows[k]
        if r["error"]:
            lines.append(f"- `{'/'.join(k)}` failed: {r['error']}")
    lines.append("")


def size_bytes(label):
    key = size_sort_key(label)
    return key[1] if key[0] == 0 else None


def fit_cost(points):
    """(per_call_us, per_mib_us) of the line through (MiB, µs) points, least squares, neither
    negative."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else 0.0
    if slope <= 0:
        return my, 0.0
    intercept = my - slope * mx
    if intercept < 0:  # through the origin
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return intercept, slope


def measured_costs(res):
    """{call: {"per_call_us", "per_mib_us"}} from the vmm and compaction_cost rows, for
    stitch-replay --costs."""
    costs = {}
    for call in VMM_CALLS:
        if call == "cycle":
            continue
        points = []
        for k, r in res.rows.items():
            if k[0] != "vmm" or len(k) < 3 or k[1] != call or r["error"]:
                continue
            b, t = size_bytes(k[2]), r.get("time_ns")
            if b and t is not None and t == t:  # not NaN
                points.append((b / float(1 << 20), t / 1000.0))
        if points:
            per_call, per_mib = fit_cost(points)
            costs[call] = {"per_call_us": round(per_call, 3), "per_mib_us": round(per_mib, 4)}
    costs.update(gpu_report_compaction.measured_costs(res, fit_cost))
    return costs


def write_costs(res, path):
    """Writes the cost file; returns how many calls it holds (0: nothing measured, no file)."""
    costs = measured_costs(res)
    if costs:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(costs, f, indent=1, sort_keys=True)
            f.write("\n")
    return len(costs)


def build_report(res, steps, ctest_log, smi_path, no_gpu):
    lines = ["# stitch GPU check", ""]
    no_dev = no_gpu or res.context.get("stitch_no_device")
    if no_dev:
        lines += [f"**No GPU found: {no_dev}.** No GPU numbers in this report; the GPU check "
                  "exits non-zero on a machine without a GPU.", ""]
    failed = [s for s in steps if s[1] not in ("ok", "skipped")]
    if steps:
        lines.append("**Overall: " + ("FAILED" if failed or no_dev else "passed") + "**"
                     + (f" ({len(failed)} step(s) failed)" if failed else "") + ".")
        lines.append("")
        lines.append("| step | status | seconds | detail |")
        lines.append("|---|---|---|---|")
        for name, status, secs, detail in steps:
            lines.append(f"| {name} | {status} | {secs} | {detail.strip().replace('|', '/')} |")
        lines.append("")

    lines.append("## Machine")
    lines.append("")
    ctx = res.context
    for key, label in [("stitch_device", "device"), ("stitch_compute_capability", "compute capability"),
                       ("stitch_device_memory_bytes", "memory"), ("stitch_cuda_driver_version", "CUDA driver"),
                       ("stitch_cuda_runtime_version", "CUDA runtime"), ("stitch_torch", "PyTorch peer"),
                       ("host_name", "host"), ("date", "date")]:
        if key in ctx:
            val = ctx[key]
            if key == "stitch_device_memory_bytes":
                val = fmt_bytes(float(val))
            lines.append(f"- {label}: {val}")
    for k, v in sorted(ctx.items()):
        if k.startswith("stitch_env_"):
            lines.append(f"- {k[len('stitch_env_'):]}={v}")
    if smi_path and os.path.exists(smi_path):
        with open(smi_path, encoding="utf-8", errors="replace") as f:
            smi = f.read().strip()
        if smi:
            lines += ["", "<details><summary>nvidia-smi</summary>", "", "```", smi[:6000], "```", "", "</details>"]
    lines.append("")

    lines.append("## Tests (ctest, Release, CUDA tests included)")
    lines.append("")
    for line in ctest_summary(ctest_log):
        lines.append(f"- {line}")
    lines.append("")

    if "torch" not in {k[1] for k in res.rows if len(k) > 1} and "stitch_torch" in ctx:
        lines.append(f"PyTorch columns: {ctx['stitch_torch']}.")
        lines.append("")
    lines.append("Times are host wall time per allocator call; peak reserved is what the allocator "
                 "held from the device at most (stitch: reserved_bytes.all.peak; torch: its device "
                 "stats; cudaMallocAsync: cudaMemPoolAttrReservedMemHigh; cudaMalloc: peak of live bytes).")
    lines.append("")
    if not res.rows:
        lines.append("No benchmark results" + (": the benchmarks need a GPU." if no_dev else "."))
        lines.append("")
    for wl, title, blurb in WORKLOADS if res.rows else []:
        workload_section(res, wl, title, blurb, lines)
    te = res.get("changing", "torch_expandable")
    if te and not te["error"] and te.get("segments") not in (None, 0, 0.0):
        lines.append(f"Note: torch_expandable reported {te['segments']:.0f} cudaMalloc segments, so "
                     "PyTorch may not have applied expandable_segments:True.")
        lines.append("")
    if res.rows:
        vmm_section(res, lines)
        costs = measured_costs(res)
        if costs:
            lines.append("As stitch-replay costs (`costs.json`: `stitch-replay --costs costs.json "
                         "TRACE` estimates device time with them), per call + per MiB: "
                         + "; ".join(f"{c} {v['per_call_us']:g} µs + {v['per_mib_us']:g} µs/MiB"
                                     for c, v in sorted(costs.items())) + ".")
            lines.append("")
        gpu_report_stitch.section(res, lines)
        gpu_report_compaction.section(res, lines)
        gpu_report_sleep.section(res, lines)

    if res.notes:
        lines.append("## Input problems")
        lines.append("")
        for n in res.notes:
            lines.append(f"- {n}")
        lines.append("")
    lines.append("Raw numbers: the Google Benchmark JSON file(s) next to this report.")
    lines.append("")
    return "\n".join(lines)


def generate(args):
    res = Results()
    for p in args.bench_json or []:
        if os.path.exists(p):
            res.add_file(p)
        else:
            res.notes.append(f"{p}: missing (the benchmark did not run or wrote nothing)")
    text = build_report(res, read_steps(args.steps), args.ctest_log, args.nvidia_smi, args.no_gpu)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    if getattr(args, "costs_out", None):
        write_costs(res, args.costs_out)
    return text


# ---- self-test ----------------------------------------------------------------------------------

def self_test(fixture):
    failures = []

    def expect(text, needle, what):
        if needle not in text:
            failures.append(f"{what}: expected {needle!r}")

    with tempfile.TemporaryDirectory() as tmp:
        steps = os.path.join(tmp, "steps.tsv")
        with open(steps, "w") as f:
            f.write("build\tok\t61\t\nctest\tfailed\t30\trc=8\n")
        ctest = os.path.join(tmp, "ctest.log")
        with open(ctest, "w") as f:
            f.write("99% tests passed, 1 tests failed out of 120\n\nTotal Test time (real) =  12.34 sec\n\n"
                    "The following tests did not run:\n\t118 - cuda.backend_smoke (Skipped)\n\n"
                    "The following tests FAILED:\n\t 7 - Foo.Bar (Failed)\n")
        out = os.path.join(tmp, "report.md")
        ns = argparse.Namespace(bench_json=[fixture], steps=steps, ctest_log=ctest,
                                nvidia_smi=None, no_gpu=None, out=out)
        text = generate(ns)
        # Values and ratios the fixture was built to produce.
        expect(text, "| 4KiB | time per op | 5 µs | 50 ns | 100 ns | 25 ns | 40 ns |", "pair table")
        expect(text, "| 4KiB | stitch | time | 0.005× (200× faster) | 0.5× (2× faster) | 0.25× (4× faster) |", "pair ratios")
        expect(text, "| 4KiB | stitch_expandable | time | 0.008× (125× faster) | 0.8× (1.25× faster) | 0.4× (2.5× faster) | 1.6× (1.6× slower) |", "pair ratios (expandable)")
        expect(text, "| stitch | peak reserved | 1.33× (1.33× more) | 1.2× (1.2× more) | 1× (same) |", "mixed peak ratios")
        expect(text, "| stitch_expandable | peak reserved | 1.05× (1.05× more) | 0.9× (1.11× less) | 0.075× (13.3× less) | 0.9× (1.11× less) | 0.125× (8× less) |", "changing peak ratios")
        expect(text, "| stitch | time | 0.1× (10× faster) | 0.25× (4× faster) | 0.5× (2× faster) |", "changing time ratios")
        expect(text, "- `mixed/torch_expandable` failed: CUDA out of memory", "error listed")
        expect(text, "| 2MiB | 30 µs | 12 µs | 20 µs | 40 µs | 15 µs | 117 µs |", "vmm table")
        expect(text, "Granularity: minimum 2 MiB, recommended 2 MiB.", "granularity")
        # The cost file: cuMemCreate over (2, 30), (20, 45), (64, 90) MiB/µs fits 26.96 µs +
        # 0.978 µs/MiB (26.963 and 0.978 rounded as the file keeps them).
        costs_path = os.path.join(tmp, "costs.json")
        res = Results()
        res.add_file(fixture)
        if write_costs(res, costs_path) != 5:
            failures.append("cost file: expected the five VMM calls")
        with open(costs_path, encoding="utf-8") as f:
            costs = json.load(f)
        create = costs.get("cuMemCreate", {})
        if abs(create.get("per_call_us", 0) - 26.96) > 0.01 or abs(create.get("per_mib_us", 0) - 0.978) > 0.001:
            failures.append(f"cost file: cuMemCreate fitted as {create}")
        expect(text, "cuMemCreate 26.963 µs + 0.978 µs/MiB", "costs line")
        if fit_cost([(2.0, 10.0), (20.0, 8.0)]) != (9.0, 0.0):
            failures.append("fit: a falling line is its mean")
        if fit_cost([(2.0, 2.0), (4.0, 5.0)]) != (0.0, 1.2):
            failures.append(f"fit: through the origin: {fit_cost([(2.0, 2.0), (4.0, 5.0)])}")
        expect(text, "`99% tests passed, 1 tests failed out of 120`", "ctest summary")
        expect(text, "Skipped: 1 test(s), 1 of them CUDA tests", "ctest skipped")
        expect(text, "FAILED: `Foo.Bar (Failed)`", "ctest failures")
        expect(text, "**Overall: FAILED** (1 step(s) failed)", "overall status")
        expect(text, "- device: NVIDIA H200 (fixture)", "context")

        # A run cut short by a crash still gives the results written before it.
        with open(fixture, encoding="utf-8") as f:
            full = f.read()
        cut = full.find('"name": "mixed/cudaMalloc')
        trunc = os.path.join(tmp, "trunc.json")
        with open(trunc, "w") as f:
            f.write(full[:cut])
        ns = argparse.Namespace(bench_json=[trunc], steps=None, ctest_log=None, nvidia_smi=None,
                                no_gpu=None, out=out)
        text = generate(ns)
        expect(text, "| 4KiB | time per op | 5 µs | 50 ns | 100 ns | 25 ns | 40 ns |", "truncated JSON")
        expect(text, "truncated (the run stopped early)", "truncation noted")

        # The stitch cost section, from synthetic stitch_cost entries (gpu_report_stitch.py).
        sc = os.path.join(tmp, "stitch_cost.json")
        with open(sc, "w") as f:
            json.dump({"context": {}, "benchmarks": gpu_report_stitch.SELF_TEST_BENCHMARKS}, f)
        ns = argparse.Namespace(bench_json=[sc], steps=None, ctest_log=None, nvidia_smi=None,
                                no_gpu=None, out=out)
        text = generate(ns)
        for needle, what in gpu_report_stitch.SELF_TEST_EXPECT:
            expect(text, needle, what)
        st = stitch_cost_status([sc])
        expect(st, "failed\t1 of 4 failed; stitch_cost/stitch/32pages: the request was not served",
               "stitch cost status")

        # The compaction cost section, from synthetic compaction_cost entries
        # (gpu_report_compaction.py), its status line and its stitch-replay costs.
        def section_self_test(name, module):
            # The section a report module writes from its synthetic entries: the file it read.
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                json.dump({"context": {}, "benchmarks": module.SELF_TEST_BENCHMARKS}, f)
            ns = argparse.Namespace(bench_json=[path], steps=None, ctest_log=None,
                                    nvidia_smi=None, no_gpu=None, out=out)
            text = generate(ns)
            for needle, what in module.SELF_TEST_EXPECT:
                expect(text, needle, what)
            return path

        cc = section_self_test("compaction_cost.json", gpu_report_compaction)
        st = compaction_cost_status([cc])
        expect(st, "failed\t1 of 6 failed; compaction_cost/compact/full: the request was served "
               "without compaction", "compaction cost status")
        res = Results()
        res.add_file(cc)
        costs = measured_costs(res)
        # (4 MiB, 4 µs) and (1024 MiB, 500 µs): 496/1020 µs per MiB, 2.055 µs per call.
        dtod = costs.get("cuMemcpyDtoDAsync", {})
        if abs(dtod.get("per_mib_us", 0) - 0.4863) > 0.0001 or abs(dtod.get("per_call_us", 0) - 2.055) > 0.001:
            failures.append(f"cost file: cuMemcpyDtoDAsync fitted as {dtod}")
        if costs.get("cuCtxSynchronize") != {"per_call_us": 20.0, "per_mib_us": 0.0}:
            failures.append(f"cost file: cuCtxSynchronize as {costs.get('cuCtxSynchronize')}")
        if "cuMemcpyDtoH/HtoD" not in costs:
            failures.append("cost file: no staging copy")

        # The sleep and wake cost section, from synthetic sleep_cost entries
        # (gpu_report_sleep.py), and its status line.
        sl = section_self_test("sleep_cost.json", gpu_report_sleep)
        st = sleep_cost_status([sl])
        expect(st, "failed\t1 of 8 failed; sleep_cost/wake/1GiB/backup: cuMemCreate failed: out "
               "of memory", "sleep cost status")
        ok_rows = [b for b in gpu_report_sleep.SELF_TEST_BENCHMARKS
                   if not b.get("error_message", "").startswith("cuMemCreate")]
        with open(sl, "w") as f:
            json.dump({"context": {}, "benchmarks": ok_rows}, f)
        st = sleep_cost_status([sl])
        expect(st, "ok\t6 results, 1 skipped (memory); backup 16 GiB/s at 10 GiB, 0.8× the pinned "
               "copy's 20 GiB/s (goal 0.8×: met)", "sleep cost status (ok)")

        # No device: the bench binary's stub JSON.
        stub = os.path.join(tmp, "stub.json")
        with open(stub, "w") as f:
            json.dump({"context": {"stitch_no_device": "cudaGetDeviceCount failed: no driver",
                                   "stitch_torch": "skipped: torch not installed for python3"},
                       "benchmarks": []}, f)
        ns = argparse.Namespace(bench_json=[stub], steps=None, ctest_log=None, nvidia_smi=None,
                                no_gpu=None, out=out)
        text = generate(ns)
        expect(text, "**No GPU found: cudaGetDeviceCount failed: no driver.**", "no-GPU banner")
        expect(text, "PyTorch columns: skipped: torch not installed for python3.", "torch skipped")
    if failures:
        for f in failures:
            print("FAIL", f)
        print(f"gpu_report self-test: {len(failures)} check(s) failed")
        return 1
    print("gpu_report self-test: all checks passed")
    return 0


def _cost_status(paths, module):
    """'STATUS<TAB>DETAIL' of a cost section's benchmarks (`module.status`) in the JSON file(s),
    for gpu-check.sh."""
    res = Results()
    for p in paths:
        res.add_file(p)
    state, detail = module.status(res)
    return f"{state}\t{detail}"


def stitch_cost_status(paths):
    return _cost_status(paths, gpu_report_stitch)


def compaction_cost_status(paths):
    return _cost_status(paths, gpu_report_compaction)


def sleep_cost_status(paths):
    return _cost_status(paths, gpu_report_sleep)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="markdown report to write")
    ap.add_argument("--bench-json", nargs="*", default=[], help="Google Benchmark JSON file(s)")
    ap.add_argument("--steps", help="gpu-check step log (TSV: step, status, seconds, detail)")
    ap.add_argument("--ctest-log", help="ctest output")
    ap.add_argument("--nvidia-smi", help="nvidia-smi output")
    ap.add_argument("--no-gpu", help="why no GPU was found (the report says so)")
    ap.add_argument("--costs-out", help="also write the measured VMM call costs as a "
                    "stitch-replay cost file (stitch-replay --costs FILE)")
    ap.add_argument("--self-test", metavar="FIXTURE", help="check the report built from FIXTURE")
    ap.add_argument("--stitch-cost-status", nargs="+", metavar="JSON",
                    help="print 'STATUS<TAB>DETAIL' of the stitch_cost benchmarks and exit")
    ap.add_argument("--compaction-cost-status", nargs="+", metavar="JSON",
                    help="print 'STATUS<TAB>DETAIL' of the compaction_cost benchmarks and exit")
    ap.add_argument("--sleep-cost-status", nargs="+", metavar="JSON",
                    help="print 'STATUS<TAB>DETAIL' of the sleep_cost benchmarks and exit")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(args.self_test)
    if args.stitch_cost_status:
        print(stitch_cost_status(args.stitch_cost_status))
        return 0
    if args.compaction_cost_status:
        print(compaction_cost_status(args.compaction_cost_status))
        return 0
    if args.sleep_cost_status:
        print(sleep_cost_status(args.sleep_cost_status))
        return 0
    if not args.out:
        ap.error("--out is required")
    generate(args)
    print(f"gpu_report: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

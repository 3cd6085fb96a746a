#!/usr/bin/env python3
"""summarize.py — the timed run as a markdown table: per case the median over rounds of wall ns
per pair (per thread) of every allocator, CPU ns per pair beside it for the thread cases, and each
stitch row's ratio to glibc, RMM and PyTorch from the same run (stitch / peer: below 1 means stitch
is faster). Also the min-max spread over rounds per cell (--spread).

  summarize.py out/timed.txt [more files ...]     one table per file
  summarize.py --compare A.txt B.txt             stitch rows of two runs side by side (B / A)
  summarize.py --train out/train.txt             the training loop's table (run.sh's train runs)
"""
import collections, statistics, sys

GLIBC, CXX, CAPI, CAPI_B, TORCH, RMM = ("glibc malloc/free", "stitch C++ API", "stitch C API",
                                        "stitch C API (B)", "PyTorch CUDACachingAllocator",
                                        "RMM pool_memory_resource")
SHORT = {GLIBC: "glibc", CXX: "stitch C++", CAPI: "stitch C", CAPI_B: "stitch C (B)", TORCH: "PyTorch CCA",
         RMM: "RMM pool"}


def load(path):
    cells = collections.OrderedDict()
    skips = []
    for line in open(path):
        if line.startswith("skip |"):
            skips.append(line.strip())
        if not line.startswith("raw |"):
            continue
        _, r, case, alloc, n, cpu, wall = [x.strip() for x in line.split("|")]
        cells.setdefault(case, collections.OrderedDict()).setdefault(alloc, []).append((float(cpu), float(wall)))
    return cells, skips


def med(v, i):
    return statistics.median(x[i] for x in v)


def is_thread_case(case):
    return "thread" in case


def fmt(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def table(path, spread=False):
    cells, skips = load(path)
    allocs = [a for a in (GLIBC, CXX, CAPI, CAPI_B, TORCH, RMM) if any(a in c for c in cells.values())]
    stitch_rows = [a for a in (CXX, CAPI) if a in allocs]  # B: only its ratio to A's C API
    peers = [a for a in (GLIBC, RMM, TORCH) if a in allocs]
    rounds = max(len(v) for c in cells.values() for v in c.values())
    print(f"### {path}: median of {rounds} interleaved rounds, wall ns per pair (per thread); "
          f"thread cases: wall / CPU ns per pair\n")
    head = ["case"] + [SHORT[a] for a in allocs] + [f"{SHORT[s]} ÷ {SHORT[p]}" for s in stitch_rows for p in peers]
    if CAPI_B in allocs:
        head.append("C (B) ÷ C")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for case, row in cells.items():
        out = [case]
        for a in allocs:
            if a not in row:
                out.append("—")
                continue
            w = med(row[a], 1)
            s = fmt(w)
            if is_thread_case(case):
                s += f" / {fmt(med(row[a], 0))}"
            if spread:
                ws = [x[1] for x in row[a]]
                s += f" [{fmt(min(ws))}–{fmt(max(ws))}]"
            out.append(s)
        for s_ in stitch_rows:
            for p in peers:
                if s_ in row and p in row:
                    out.append(f"{med(row[s_], 1) / med(row[p], 1):.2f}")
                else:
                    out.append("—")
        if CAPI_B in allocs:
            out.append(f"{med(row[CAPI_B], 1) / med(row[CAPI], 1):.2f}" if CAPI_B in row and CAPI in row else "—")
        print("| " + " | ".join(out) + " |")
    for s in skips:
        print(f"\n{s}")
    print()


def compare(a_path, b_path):
    a, _ = load(a_path)
    b, _ = load(b_path)
    print(f"### stitch, run A = {a_path}, run B = {b_path}: median wall ns per pair (B ÷ A)\n")
    print("| case | C++ A | C++ B | B ÷ A | C A | C B | B ÷ A |")
    print("|---|---|---|---|---|---|---|")
    for case in a:
        if case not in b:
            continue
        out = [case]
        for s in (CXX, CAPI):
            if s in a[case] and s in b[case]:
                x, y = med(a[case][s], 1), med(b[case][s], 1)
                out += [fmt(x), fmt(y), f"{y / x:.2f}"]
            else:
                out += ["—"] * 3
        print("| " + " | ".join(out) + " |")


def train_table(path):
    # train | conf | allocator | threads | steps | seed | allocations | peak GB | cpu us/step | wall us/step
    runs = collections.OrderedDict()
    for line in open(path):
        if not line.startswith("train |"):
            continue
        _, conf, alloc, threads, steps, seed, n, peak, cpu, wall = [x.strip() for x in line.split("|")]
        runs.setdefault((conf, alloc, seed), {})[int(threads)] = (float(peak), float(cpu), int(n) / int(steps))
    print(f"### {path}: the forward/backward loop, backward on the main thread (1) and on its own (2)\n")
    print("| config | allocator | seed | peak reserved GB, 1 thread | 2 threads | 2 ÷ 1 | CPU µs per step, 1 / 2 "
          "| CPU ns per request, 1 / 2 |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (conf, alloc, seed), r in runs.items():
        if 1 not in r or 2 not in r:
            continue
        (p1, c1, n1), (p2, c2, n2) = r[1], r[2]
        peaks = (f"{p1:.3f} | {p2:.3f} | {p2 / p1:.3f}" if p1 > 0 and p2 > 0 else "— | — | —")
        print(f"| {conf} | {SHORT.get(alloc, alloc)} | {seed} | {peaks} | {c1:.0f} / {c2:.0f} "
              f"| {c1 * 1e3 / n1:.0f} / {c2 * 1e3 / n2:.0f} |")
    print()


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--compare":
        compare(args[1], args[2])
    elif args and args[0] == "--train":
        train_table(args[1])
    else:
        spread = "--spread" in args
        for p in [x for x in args if x != "--spread"]:
            table(p, spread)

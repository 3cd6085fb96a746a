"""The cost of recorded stacks per allocation, from Python (docs/diagnostics.md).

Times malloc/free pairs through the C API on the simulated device with the history off, on
without stacks, and on with native ("cpp"), Python ("python") and both ("all") stacks, each at a
call depth of about 20 Python frames. Prints a markdown table: time per pair and the cost the
stacks add per recorded allocation, against the history without stacks in the same run.

Usage: STITCH_LIBRARY=build-release/libstitch.so python3 benchmarks/python_stacks.py [pairs]
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
os.environ["STITCH_ALLOC_CONF"] = "backend:sim,sim_capacity_mb:1024"

import stitch  # noqa: E402


def pairs(n):
    malloc, free = stitch._lib.lib().stitch_malloc, stitch._lib.lib().stitch_free
    start = time.perf_counter()
    for _ in range(n):
        p = malloc(4096, 0, None)
        free(p, 4096, 0, None)
    return (time.perf_counter() - start) / n


def at_depth(depth, fn, *args):
    return fn(*args) if depth == 0 else at_depth(depth - 1, fn, *args)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    at_depth(20, pairs, 1000)  # warm up
    rows = []
    for label, on, stacks in [("history off", False, "none"), ("history, no stacks", True, "none"),
                              ("stacks=cpp", True, "cpp"), ("stacks=python", True, "python"),
                              ("stacks=all", True, "all")]:
        stitch.record_history(on, max_entries=1000, stacks=stacks)
        best = min(at_depth(20, pairs, n) for _ in range(5))
        stitch.record_history(False, stacks="none")
        rows.append((label, best))
    base = rows[1][1]
    print("| recording | per malloc/free pair | stacks add per allocation |")
    print("|---|---|---|")
    for label, t in rows:
        extra = f"{(t - base) * 1e9:.0f} ns" if label.startswith("stacks") else ""
        print(f"| {label} | {t * 1e9:.0f} ns | {extra} |")


if __name__ == "__main__":
    main()

"""scripts/gpu_report_stitch.py — the "Stitch cost" section of the GPU report, from the
stitch_cost/<op>/<N>pages benchmarks of stitch_gpu_bench (benchmarks/gpu/stitch_cost.cpp), and
the one-line status gpu-check.sh records for them. Used by gpu_report.py; standard library only.

Each row's time is the mean host time of one call (Google Benchmark manual time); the counter
free_ns is the mean time of what gives the memory back (dissolving the stitched range, the
grow's unmap, cudaFree); source_runs is the unmap calls per stitch.
"""
from gpu_report_format import counter, error_lines, fmt_bytes, fmt_ns, fmt_ratio, good, ratio

OPS = ["stitch", "grow", "cudaMalloc"]

# Synthetic stitch_cost entries for gpu_report.py's self-test: round numbers chosen so that the
# ratios are easy to check by hand. They are not measurements.
SELF_TEST_BENCHMARKS = [
    {"name": "stitch_cost/stitch/8pages/iterations:5/manual_time", "run_type": "iteration",
     "real_time": 800.0, "time_unit": "us", "pages": 8, "bytes": 16777216,
     "free_ns": 400000.0, "source_runs": 8.0},
    {"name": "stitch_cost/grow/8pages/iterations:20/manual_time", "run_type": "iteration",
     "real_time": 400.0, "time_unit": "us", "pages": 8, "bytes": 16777216, "free_ns": 100000.0},
    {"name": "stitch_cost/cudaMalloc/8pages/iterations:20/manual_time", "run_type": "iteration",
     "real_time": 1600.0, "time_unit": "us", "pages": 8, "bytes": 16777216, "free_ns": 800000.0},
    {"name": "stitch_cost/stitch/32pages/iterations:5/manual_time", "run_type": "iteration",
     "error_occurred": True, "error_message": "the request was not served by a stitch"},
]
SELF_TEST_EXPECT = [
    ("| 8 | 16 MiB | 800 µs | 100 µs | 400 µs | 8 | 400 µs | 50 µs | 100 µs | 1.6 ms | 800 µs |",
     "stitch cost table"),
    ("| 8 | 2× (2× slower) | 0.5× (2× faster) | 4× (4× slower) | 0.5× (2× faster) |",
     "stitch cost ratios"),
    ("- `stitch_cost/stitch/32pages` failed: the request was not served by a stitch",
     "stitch cost error"),
]


def _rows(res):
    """{pages: {op: row}} for the stitch_cost results of `res` (a gpu_report.Results)."""
    by_pages = {}
    for key, row in res.rows.items():
        if len(key) == 3 and key[0] == "stitch_cost" and key[2].endswith("pages"):
            try:
                pages = int(key[2][:-len("pages")])
            except ValueError:
                continue
            by_pages.setdefault(pages, {})[key[1]] = row
    return by_pages


def _time(row):
    return row.get("time_ns") if good(row) else None


def _per(ns, pages):
    return ns / pages if ns is not None and pages else None


def _cell(row, ns):
    if row is None:
        return "—"
    return "error" if row["error"] else fmt_ns(ns)


def section(res, lines):
    by_pages = _rows(res)
    lines.append("## Stitch cost")
    lines.append("")
    lines.append(
        "What one stitch costs on this GPU (benchmarks/gpu/stitch_cost.cpp): the adversarial "
        "scenario of the stitching tests under a 1 GiB cap (every other block freed, no fresh "
        "page left), then an allocate of N granules that only a stitch can serve: a stream sync, "
        "one unmap per source run, N maps into a new range. *Dissolve*: freeing that block and "
        "empty_cache (unmapping and releasing its N pages and its range). Beside it, in the same "
        "run: an expandable segment growing by N fresh granules (*grow*; its *free* gives them "
        "back), and cudaMalloc / cudaFree of the same bytes. Mean host time per call.")
    lines.append("")
    if not by_pages:
        lines.append("No results.")
        lines.append("")
        return
    lines.append("| granules | bytes | stitch | per granule | dissolve | source runs | grow | "
                 "per granule | grow's free | cudaMalloc | cudaFree |")
    lines.append("|" + "---|" * 11)
    for pages in sorted(by_pages):
        r = by_pages[pages]
        st, gr, cm = r.get("stitch"), r.get("grow"), r.get("cudaMalloc")
        size = next((counter(x, "bytes") for x in (st, gr, cm) if counter(x, "bytes")), None)
        runs = counter(st, "source_runs")
        cells = [
            str(pages), fmt_bytes(size),
            _cell(st, _time(st)), _cell(st, _per(_time(st), pages)), _cell(st, counter(st, "free_ns")),
            "—" if runs is None else f"{runs:.3g}",
            _cell(gr, _time(gr)), _cell(gr, _per(_time(gr), pages)), _cell(gr, counter(gr, "free_ns")),
            _cell(cm, _time(cm)), _cell(cm, counter(cm, "free_ns")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Ratios (below 1: the stitch, or its dissolving, is cheaper):")
    lines.append("")
    lines.append("| granules | stitch ÷ grow | stitch ÷ cudaMalloc | dissolve ÷ grow's free | "
                 "dissolve ÷ cudaFree |")
    lines.append("|---|---|---|---|---|")
    for pages in sorted(by_pages):
        r = by_pages[pages]
        st, gr, cm = r.get("stitch"), r.get("grow"), r.get("cudaMalloc")
        pairs = [(_time(st), _time(gr)), (_time(st), _time(cm)),
                 (counter(st, "free_ns"), counter(gr, "free_ns")),
                 (counter(st, "free_ns"), counter(cm, "free_ns"))]
        lines.append(f"| {pages} | " + " | ".join(
            fmt_ratio(ratio(a, b), "faster", "slower") for a, b in pairs) + " |")
    lines.append("")
    error_lines(lines, [(f"stitch_cost/{op}/{pages}pages", row["error"])
                        for pages, ops in sorted(by_pages.items())
                        for op, row in sorted(ops.items()) if row["error"]])


def status(res):
    """(status, detail) for gpu-check.sh's step log: ok, or failed with the reason."""
    by_pages = _rows(res)
    rows = [(pages, op, row) for pages, ops in by_pages.items() for op, row in ops.items()]
    if not rows:
        return "failed", "no stitch_cost results in the benchmark JSON"
    bad = [(pages, op, row["error"]) for pages, op, row in rows if row["error"]]
    if bad:
        pages, op, err = min(bad, key=lambda b: (b[0], OPS.index(b[1]) if b[1] in OPS else len(OPS)))
        return "failed", f"{len(bad)} of {len(rows)} failed; stitch_cost/{op}/{pages}pages: {err}"
    largest = max(by_pages)
    st = by_pages[largest].get("stitch")
    what = (f"stitch of {largest} granules {fmt_ns(_time(st))} "
            f"({fmt_ns(_per(_time(st), largest))} per granule)") if good(st) else ""
    missing = [f"{op}/{p}pages" for p in by_pages for op in OPS if op not in by_pages[p]]
    return "ok", f"{len(rows)} results" + (f"; {what}" if what else "") + (
        f"; missing {', '.join(missing)}" if missing else "")

"""scripts/gpu_report_sleep.py — the "Sleep and wake cost" section of the GPU report, from the
sleep_cost/* benchmarks of stitch_gpu_bench (benchmarks/gpu/sleep_cost.cpp), and the one-line
status gpu-check.sh records for them. Used by gpu_report.py; standard library only.

  sleep_cost/pinned_copy/d2h|h2d        cudaMemcpyAsync of 1 GiB with pinned host memory, device
                                        time by events (bytes_per_second: the pinned copy bandwidth)
  sleep_cost/sleep/<N>GiB/backup|nobackup   one alloc.sleep(0) of N GiB of tagged memory, host
  sleep_cost/wake/<N>GiB/backup|nobackup    wall time; then its alloc.wake(0). Counters: GiB,
                                        ms_per_GiB, moved_bytes, backup_GiB_per_s (bytes backed up
                                        or restored / the whole sleep or wake), copy_GiB_per_s
                                        (the same / the copies and their wait), and per kind of
                                        back-end call <kind>_calls and <kind>_ns
Errors whose message begins with "skipped:" (a size the device or the host cannot hold) are
skips, not failures.
"""
from gpu_report_format import counter, error_lines, fmt_ns, good, num3

GOAL = 0.8  # backups at 80% of the pinned host copy bandwidth or more
GIB = float(1 << 30)
CALLS = ["sync_device", "allocate_host", "copy_to_host_async", "copy_from_host_async",
         "sync_stream", "unmap", "release", "create", "map", "deallocate_host"]
CALL_NAMES = {"sync_device": "device sync", "allocate_host": "pinned host alloc",
              "copy_to_host_async": "copies D2H (queueing)",
              "copy_from_host_async": "copies H2D (queueing)",
              "sync_stream": "copies' wait", "unmap": "cuMemUnmap", "release": "cuMemRelease",
              "create": "cuMemCreate", "map": "cuMemMap + access", "deallocate_host": "host free"}

# Synthetic sleep_cost entries for gpu_report.py's self-test: round numbers chosen so that the
# figures are easy to check by hand. They are not measurements.
SELF_TEST_BENCHMARKS = [
    {"name": "sleep_cost/pinned_copy/d2h/iterations:5/manual_time", "run_type": "iteration",
     "real_time": 50.0, "time_unit": "ms", "bytes": 1073741824.0,
     "bytes_per_second": 1073741824.0 / 0.05},
    {"name": "sleep_cost/pinned_copy/h2d/iterations:5/manual_time", "run_type": "iteration",
     "real_time": 40.0, "time_unit": "ms", "bytes": 1073741824.0,
     "bytes_per_second": 1073741824.0 / 0.04},
    {"name": "sleep_cost/sleep/10GiB/backup/iterations:1/manual_time", "run_type": "iteration",
     "real_time": 625.0, "time_unit": "ms", "GiB": 10.0, "ms_per_GiB": 62.5,
     "moved_bytes": 10737418240.0, "backup_GiB_per_s": 16.0, "copy_GiB_per_s": 20.0,
     "allocate_host_calls": 1.0, "allocate_host_ns": 100e6, "copy_to_host_async_calls": 160.0,
     "copy_to_host_async_ns": 20e6, "sync_stream_calls": 1.0, "sync_stream_ns": 480e6},
    {"name": "sleep_cost/wake/10GiB/backup/iterations:1/manual_time", "run_type": "iteration",
     "real_time": 500.0, "time_unit": "ms", "GiB": 10.0, "ms_per_GiB": 50.0,
     "moved_bytes": 10737418240.0, "backup_GiB_per_s": 20.0, "copy_GiB_per_s": 25.0},
    {"name": "sleep_cost/sleep/10GiB/nobackup/iterations:1/manual_time", "run_type": "iteration",
     "real_time": 20.0, "time_unit": "ms", "GiB": 10.0, "ms_per_GiB": 2.0, "moved_bytes": 0.0},
    {"name": "sleep_cost/wake/10GiB/nobackup/iterations:1/manual_time", "run_type": "iteration",
     "real_time": 30.0, "time_unit": "ms", "GiB": 10.0, "ms_per_GiB": 3.0, "moved_bytes": 0.0},
    {"name": "sleep_cost/sleep/50GiB/backup/iterations:1/manual_time", "run_type": "iteration",
     "error_occurred": True, "error_message": "skipped: the host has 40 GiB available"},
    {"name": "sleep_cost/wake/1GiB/backup/iterations:2/manual_time", "run_type": "iteration",
     "error_occurred": True, "error_message": "cuMemCreate failed: out of memory"},
]
SELF_TEST_EXPECT = [
    ("Pinned host copy (1 GiB, cudaMemcpyAsync, device time): device to host **20 GiB/s**, "
     "host to device **25 GiB/s**.", "pinned copy line"),
    ("| 10 GiB | backup | 625 ms | 62.5 ms | 500 ms | 50 ms | 16 GiB/s (0.8× D2H) | "
     "20 GiB/s (0.8× H2D) |", "sleep table (backup)"),
    ("| 10 GiB | no backup | 20 ms | 2 ms | 30 ms | 3 ms | — | — |", "sleep table (no backup)"),
    ("| 50 GiB | backup | skipped |  | — | — | skipped | — |", "sleep table (skipped)"),
    ("Backups at **16 GiB/s, 0.8× the pinned copy's 20 GiB/s** (10 GiB; goal: 0.8× or more: met)",
     "sleep goal line"),
    ("| sleep 10 GiB | 100 ms (16%) | 20 ms (3.2%) | 480 ms (76.8%) |", "sleep calls"),
    ("- `sleep_cost/sleep/50GiB/backup` skipped: the host has 40 GiB available", "sleep skip"),
    ("- `sleep_cost/wake/1GiB/backup` failed: cuMemCreate failed: out of memory", "sleep error"),
]


def _rows(res, op):
    """{label: row} for sleep_cost/<op>/<label...> (labels joined by '/')."""
    return {"/".join(k[2:]): row for k, row in res.rows.items()
            if len(k) >= 3 and k[0] == "sleep_cost" and k[1] == op}


def _skipped(row):
    return row is not None and bool(row["error"]) and row["error"].startswith("skipped:")




def _gib(label):
    try:
        return int(label.split("/")[0][:-len("GiB")])
    except ValueError:
        return None


def _fmt_gibps(x):
    return "n/a" if x is None else f"{num3(x)} GiB/s"


def pinned(res, direction):
    """The pinned copy bandwidth in GiB/s ('d2h' or 'h2d'), or None."""
    bps = counter(_rows(res, "pinned_copy").get(direction), "bytes_per_second")
    return None if bps is None else bps / GIB


def backup_ratio(res):
    """(backup GiB/s, its ratio to the pinned D2H copy, the pinned GiB/s, GiB) at the largest size
    whose backed-up sleep ran, or Nones."""
    best = None
    for label, row in _rows(res, "sleep").items():
        gib = _gib(label)
        rate = counter(row, "backup_GiB_per_s")
        if label.endswith("/backup") and gib is not None and rate is not None:
            if best is None or gib > best[1]:
                best = (rate, gib)
    if best is None:
        return None, None, pinned(res, "d2h"), None
    ref = pinned(res, "d2h")
    return best[0], (best[0] / ref if ref else None), ref, best[1]


def _rate_cell(row, ref, direction):
    if row is None:
        return "—"
    if _skipped(row):
        return "skipped"
    if row["error"]:
        return "error"
    rate = counter(row, "backup_GiB_per_s")
    if rate is None:
        return "n/a"
    if not ref:
        return _fmt_gibps(rate)
    return f"{_fmt_gibps(rate)} ({num3(rate / ref)}× {direction})"


def _time_cells(row):
    if row is None:
        return ["—", "—"]
    if _skipped(row):
        return ["skipped", ""]
    if row["error"]:
        return ["error", ""]
    ms = counter(row, "ms_per_GiB")
    return [fmt_ns(row.get("time_ns")), fmt_ns(ms * 1e6 if ms is not None else None)]


def section(res, lines):
    lines.append("## Sleep and wake cost")
    lines.append("")
    lines.append(
        "What sleep and wake cost on this GPU (benchmarks/gpu/sleep_cost.cpp, docs/sleep.md): a "
        "fresh allocator over backend:cuda allocates N GiB in 256 MiB blocks under a region (with "
        "backup or without) and writes them; timed (host wall time): `sleep(0)` — the device "
        "sync, the pinned host memory and the backups' copies, every page unmapped and released "
        "— and then `wake(0)` — fresh pages at the same addresses, the backups copied back. "
        "Backup rates are bytes moved ÷ the whole sleep (or wake), set against the plain pinned "
        "host copy of the same run.")
    lines.append("")
    ops = {op: _rows(res, op) for op in ("pinned_copy", "sleep", "wake")}
    if not any(ops.values()):
        lines.append("No results.")
        lines.append("")
        return
    d2h, h2d = pinned(res, "d2h"), pinned(res, "h2d")
    if ops["pinned_copy"]:
        lines.append("Pinned host copy (1 GiB, cudaMemcpyAsync, device time): device to host "
                     f"**{_fmt_gibps(d2h)}**, host to device **{_fmt_gibps(h2d)}**.")
        lines.append("")
    labels = sorted({label for op in ("sleep", "wake") for label in ops[op]},
                    key=lambda s: (_gib(s) is None, _gib(s) or 0, not s.endswith("/backup"), s))
    if labels:
        lines.append("| size | backup | sleep | per GiB | wake | per GiB | backup at the sleep | "
                     "restore at the wake |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for label in labels:
            gib = _gib(label)
            mode = label.split("/")[-1]
            sleep, wake = ops["sleep"].get(label), ops["wake"].get(label)
            backup = mode == "backup"
            lines.append("| " + " | ".join(
                [f"{gib} GiB" if gib is not None else label, "backup" if backup else "no backup"]
                + _time_cells(sleep) + _time_cells(wake)
                + ([_rate_cell(sleep, d2h, "D2H"), _rate_cell(wake, h2d, "H2D")] if backup
                   else ["—", "—"])) + " |")
        lines.append("")
    rate, share, ref, gib = backup_ratio(res)
    if rate is not None:
        if share is not None:
            verdict = "met" if share >= GOAL else "NOT met"
            lines.append(f"Backups at **{_fmt_gibps(rate)}, {num3(share)}× the pinned copy's "
                         f"{_fmt_gibps(ref)}** ({gib} GiB; goal: {num3(GOAL)}× or more: {verdict}): "
                         "the whole sleep, pinned host allocation included.")
        else:
            lines.append(f"Backups at **{_fmt_gibps(rate)}** ({gib} GiB; no pinned copy ran to "
                         "compare with).")
        lines.append("")
    # Where the time goes: the back-end calls of the backed-up runs.
    timed = [(op, label, row) for label in labels for op in ("sleep", "wake")
             if label.endswith("/backup") and good(ops[op].get(label))
             for row in [ops[op][label]]
             if any(counter(row, c + "_ns") for c in CALLS)]
    if timed:
        shown = [c for c in CALLS if any(counter(row, c + "_ns") for _, _, row in timed)]
        lines.append("Back-end calls of the backed-up runs (host time per sleep or wake, share "
                     "of it):")
        lines.append("")
        lines.append("| run | " + " | ".join(CALL_NAMES[c] for c in shown) + " |")
        lines.append("|---|" + "---|" * len(shown))
        for op, label, row in timed:
            total = row.get("time_ns")
            cells = []
            for c in shown:
                ns = counter(row, c + "_ns")
                if not ns:
                    cells.append("—")
                else:
                    share_s = f" ({ns / total * 100:.3g}%)" if total else ""
                    cells.append(fmt_ns(ns) + share_s)
            lines.append(f"| {op} {_gib(label)} GiB | " + " | ".join(cells) + " |")
        lines.append("")
    for op, rows in sorted(ops.items()):
        for label, row in sorted(rows.items()):
            if _skipped(row):
                lines.append(f"- `sleep_cost/{op}/{label}` skipped: "
                             f"{row['error'][len('skipped:'):].strip()}")
    if any(_skipped(r) for rows in ops.values() for r in rows.values()):
        lines.append("")
    error_lines(lines, [(f"sleep_cost/{op}/{label}", row["error"])
                        for op, rows in sorted(ops.items())
                        for label, row in sorted(rows.items())
                        if row["error"] and not _skipped(row)])


def status(res):
    """(status, detail) for gpu-check.sh's step log: ok, or failed with the reason."""
    rows = [(op, label, row) for op in ("pinned_copy", "sleep", "wake")
            for label, row in _rows(res, op).items()]
    if not rows:
        return "failed", "no sleep_cost results in the benchmark JSON"
    bad = [(op, label, row["error"]) for op, label, row in rows
           if row["error"] and not _skipped(row)]
    if bad:
        op, label, err = bad[0]
        return "failed", f"{len(bad)} of {len(rows)} failed; sleep_cost/{op}/{label}: {err}"
    skipped = sum(1 for _, _, row in rows if _skipped(row))
    parts = [f"{len(rows) - skipped} results" + (f", {skipped} skipped (memory)" if skipped else "")]
    rate, share, ref, gib = backup_ratio(res)
    if share is not None:
        parts.append(f"backup {_fmt_gibps(rate)} at {gib} GiB, {num3(share)}× the pinned copy's "
                     f"{_fmt_gibps(ref)} (goal {num3(GOAL)}×: {'met' if share >= GOAL else 'NOT met'})")
    return "ok", "; ".join(parts)

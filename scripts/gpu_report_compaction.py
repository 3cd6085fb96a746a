"""scripts/gpu_report_compaction.py — the "Compaction cost" section of the GPU report, from the
compaction_cost/* benchmarks of stitch_gpu_bench (benchmarks/gpu/compaction_cost.cpp), the
one-line status gpu-check.sh records for them, and the copy and sync figures they give
stitch-replay's cost file. Used by gpu_report.py; standard library only.

  compaction_cost/device_copy/<S>MiB   Backend::copy (cuMemcpyDtoDAsync), device time by events
  compaction_cost/to_host|from_host/<S>MiB   staging's copies (cuMemcpyDtoH/HtoD), host time
  compaction_cost/compact/room|full    one request that compacts: host wall time, with counters
                                       pages, staged, compacted_bytes, served_bytes and, per kind
                                       of back-end call, <kind>_calls and <kind>_ns
  compaction_cost/copies/room          the same, timed as the summed device time of its copies
                                       (bytes_per_second: the bandwidth of compaction's copies)
"""
from gpu_report_format import counter, error_lines, fmt_bytes, fmt_ns, good, num3

GOAL = 0.5  # compaction's copies at half the device's copy bandwidth or more
CALLS = ["sync_device", "create", "reserve", "map", "copy", "sync_stream", "unmap",
         "release_reservation", "release", "copy_to_host", "copy_from_host"]
CALL_NAMES = {"sync_device": "cuCtxSynchronize", "create": "cuMemCreate",
              "reserve": "cuMemAddressReserve", "map": "cuMemMap + cuMemSetAccess",
              "copy": "cuMemcpyDtoDAsync", "sync_stream": "cuStreamSynchronize",
              "unmap": "cuMemUnmap", "release_reservation": "cuMemAddressFree",
              "release": "cuMemRelease", "copy_to_host": "cuMemcpyDtoH",
              "copy_from_host": "cuMemcpyHtoD"}
GIB = float(1 << 30)
MIB = float(1 << 20)

# Synthetic compaction_cost entries for gpu_report.py's self-test: round numbers chosen so that
# the figures are easy to check by hand. They are not measurements.
SELF_TEST_BENCHMARKS = [
    {"name": "compaction_cost/device_copy/4MiB/iterations:50/manual_time", "run_type": "iteration",
     "real_time": 4.0, "time_unit": "us", "bytes": 4194304, "bytes_per_second": 4194304 / 4e-6},
    {"name": "compaction_cost/device_copy/1024MiB/iterations:10/manual_time",
     "run_type": "iteration", "real_time": 500.0, "time_unit": "us", "bytes": 1073741824,
     "bytes_per_second": 1073741824 / 500e-6},
    {"name": "compaction_cost/to_host/4MiB/iterations:10/manual_time", "run_type": "iteration",
     "real_time": 400.0, "time_unit": "us", "bytes": 4194304, "bytes_per_second": 4194304 / 400e-6},
    {"name": "compaction_cost/compact/room/iterations:5/manual_time", "run_type": "iteration",
     "real_time": 8000.0, "time_unit": "us", "pages": 100.0, "staged": 0.0,
     "compacted_bytes": 419430400.0, "device_copy_bytes": 419430400.0,
     "served_bytes": 1610612736.0, "sync_device_calls": 1.0, "sync_device_ns": 20000.0,
     "copy_calls": 100.0, "copy_ns": 300000.0, "map_calls": 300.0, "map_ns": 3000000.0},
    {"name": "compaction_cost/copies/room/iterations:5/manual_time", "run_type": "iteration",
     "real_time": 250.0, "time_unit": "us", "device_copy_bytes": 419430400.0,
     "bytes_per_second": 419430400.0 / 250e-6},
    {"name": "compaction_cost/compact/full/iterations:5/manual_time", "run_type": "iteration",
     "error_occurred": True, "error_message": "the request was served without compaction"},
]
SELF_TEST_EXPECT = [
    ("| 4 MiB | 4 µs (1049 GB/s) | 400 µs (10.5 GB/s) | — |", "compaction copy table"),
    ("Compaction's copies: **1678 GB/s, 78% of the device's 2147 GB/s** (1 GiB copies; "
     "goal: 50% or more)", "compaction copy bandwidth"),
    ("| room | 1.5 GiB | 100 | 0 | 400 MiB | 8 ms | 20.5 ms | 80 µs |", "compaction table"),
    ("| cuMemMap + cuMemSetAccess | 300 | 3 ms | 10 µs | 37.5% |", "compaction calls"),
    ("- `compaction_cost/compact/full` failed: the request was served without compaction",
     "compaction error"),
]


def _rows(res, op):
    """{label: row} for compaction_cost/<op>/<label> in `res` (a gpu_report.Results)."""
    return {k[2]: row for k, row in res.rows.items()
            if len(k) == 3 and k[0] == "compaction_cost" and k[1] == op}




def _mib(label):
    try:
        return int(label[:-len("MiB")]) if label.endswith("MiB") else None
    except ValueError:
        return None


def _gbps(row):
    bps = counter(row, "bytes_per_second")
    return None if bps is None else bps / 1e9


def _fmt_gbps(x):
    return "n/a" if x is None else f"{num3(x)} GB/s"


def _cell(row):
    if row is None:
        return "—"
    if row["error"]:
        return "error"
    return f"{fmt_ns(row.get('time_ns'))} ({_fmt_gbps(_gbps(row))})"


def device_bandwidth(res):
    """(GB/s, MiB) of the largest device_copy that ran, or (None, None)."""
    best = None
    for label, row in _rows(res, "device_copy").items():
        mib = _mib(label)
        if mib is not None and _gbps(row) is not None and (best is None or mib > best[1]):
            best = (_gbps(row), mib)
    return best or (None, None)


def copies_share(res):
    """(compaction's copies in GB/s, their share of the device's bandwidth, the device's GB/s)."""
    mine = _gbps(_rows(res, "copies").get("room"))
    dev, _ = device_bandwidth(res)
    share = mine / dev if mine is not None and dev else None
    return mine, share, dev


def per_gib(row):
    """Host time of the whole compaction per GiB copied (ns), or None."""
    copied = counter(row, "compacted_bytes")
    t = row.get("time_ns") if good(row) else None
    return t / (copied / GIB) if t is not None and copied else None


def section(res, lines):
    lines.append("## Compaction cost")
    lines.append("")
    lines.append(
        "What compaction costs on this GPU (benchmarks/gpu/compaction_cost.cpp). The scenario of "
        "the compaction tests under a 2 GiB cap: a live 1.5-granule block at the start of every "
        "20 MiB coarse page, the rest of each page freed; one request for every granule free of "
        "live data, which only compaction can serve. *room*: one coarse page of room under the "
        "cap (fresh device pages take the live data); *full*: none (the first page is staged "
        "through host memory). Beside it, the device's own copies of the same driver call.")
    lines.append("")
    ops = {op: _rows(res, op) for op in ("device_copy", "to_host", "from_host", "compact", "copies")}
    if not any(ops.values()):
        lines.append("No results.")
        lines.append("")
        return
    sizes = sorted({label for op in ("device_copy", "to_host", "from_host") for label in ops[op]},
                   key=lambda s: (_mib(s) is None, _mib(s) or 0, s))
    if sizes:
        lines.append("| copy size | device to device (cuMemcpyDtoDAsync, device time) | "
                     "to host (cuMemcpyDtoH) | from host (cuMemcpyHtoD) |")
        lines.append("|---|---|---|---|")
        for s in sizes:
            mib = _mib(s)
            label = fmt_bytes(float(mib) * MIB) if mib is not None else s
            lines.append(f"| {label} | " + " | ".join(
                _cell(ops[op].get(s)) for op in ("device_copy", "to_host", "from_host")) + " |")
        lines.append("")
    mine, share, dev = copies_share(res)
    _, dev_mib = device_bandwidth(res)
    if mine is not None:
        if share is not None:
            head = (f"**{_fmt_gbps(mine)}, {share * 100:.0f}% of the device's {_fmt_gbps(dev)}** "
                    f"({fmt_bytes(float(dev_mib) * MIB)} copies; goal: {GOAL * 100:.0f}% or more)")
        else:
            head = f"**{_fmt_gbps(mine)}** (no device copy ran to compare with)"
        lines.append(f"Compaction's copies: {head}: the summed device time of every copy of the "
                     "room variant, from CUDA events around each.")
        lines.append("")
    compact = ops["compact"]
    if compact:
        lines.append("| variant | served | pages | staged | copied | whole request | per GiB copied "
                     "| per page |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for variant in sorted(compact, key=lambda v: (v != "room", v)):
            row = compact[variant]
            if not good(row):
                lines.append(f"| {variant} | error | | | | | | |")
                continue
            pages = counter(row, "pages")
            t = row.get("time_ns")
            lines.append("| " + " | ".join([
                variant, fmt_bytes(counter(row, "served_bytes")),
                "n/a" if pages is None else f"{pages:.3g}",
                "n/a" if counter(row, "staged") is None else f"{counter(row, 'staged'):.3g}",
                fmt_bytes(counter(row, "compacted_bytes")), fmt_ns(t), fmt_ns(per_gib(row)),
                fmt_ns(t / pages if t is not None and pages else None)]) + " |")
        lines.append("")
        lines.append("The whole request is host wall time: the device sync, per page the fresh "
                     "pages, the copies and the remap, then the stitch that serves it. Its "
                     "back-end calls (per request, host time):")
        lines.append("")
        for variant in sorted(compact, key=lambda v: (v != "room", v)):
            row = compact[variant]
            if not good(row):
                continue
            total = row.get("time_ns")
            lines.append(f"*{variant}*:")
            lines.append("")
            lines.append("| call | calls | time | per call | share of the request |")
            lines.append("|---|---|---|---|---|")
            for call in CALLS:
                n, ns = counter(row, call + "_calls"), counter(row, call + "_ns")
                if not n:
                    continue
                share_s = f"{ns / total * 100:.3g}%" if ns is not None and total else "n/a"
                lines.append(f"| {CALL_NAMES[call]} | {n:.3g} | {fmt_ns(ns)} | {fmt_ns(ns / n)} | "
                             f"{share_s} |")
            lines.append("")
    error_lines(lines, [(f"compaction_cost/{op}/{label}", row["error"])
                        for op, rows in sorted(ops.items())
                        for label, row in sorted(rows.items()) if row["error"]])


def status(res):
    """(status, detail) for gpu-check.sh's step log: ok, or failed with the reason."""
    rows = [(op, label, row) for op in ("device_copy", "to_host", "from_host", "compact", "copies")
            for label, row in _rows(res, op).items()]
    if not rows:
        return "failed", "no compaction_cost results in the benchmark JSON"
    bad = [(op, label, row["error"]) for op, label, row in rows if row["error"]]
    if bad:
        op, label, err = bad[0]
        return "failed", f"{len(bad)} of {len(rows)} failed; compaction_cost/{op}/{label}: {err}"
    mine, share, dev = copies_share(res)
    room = _rows(res, "compact").get("room")
    parts = [f"{len(rows)} results"]
    if share is not None:
        parts.append(f"copies at {_fmt_gbps(mine)}, {share * 100:.0f}% of the device's {_fmt_gbps(dev)}")
    if good(room):
        parts.append(f"compaction {fmt_ns(per_gib(room))} per GiB copied")
    return "ok", "; ".join(parts)


def measured_costs(res, fit_cost):
    """{call: {"per_call_us", "per_mib_us"}} for stitch-replay --costs: the device copy and the
    staging copies fitted over their sizes (`fit_cost(points)`: gpu_report's least squares over
    (MiB, µs) points), the device sync from the compactions' own calls."""
    costs = {}
    for name, ops in (("cuMemcpyDtoDAsync", ("device_copy",)),
                      ("cuMemcpyDtoH/HtoD", ("to_host", "from_host"))):
        points = []
        for op in ops:
            for label, row in _rows(res, op).items():
                mib = _mib(label)
                if mib and good(row) and row.get("time_ns") == row.get("time_ns"):
                    points.append((float(mib), row["time_ns"] / 1000.0))
        if points:
            per_call, per_mib = fit_cost(points)
            costs[name] = {"per_call_us": round(per_call, 3), "per_mib_us": round(per_mib, 4)}
    room = _rows(res, "compact").get("room")
    n, ns = counter(room, "sync_device_calls"), counter(room, "sync_device_ns")
    if n and ns is not None:
        costs["cuCtxSynchronize"] = {"per_call_us": round(ns / n / 1000.0, 3), "per_mib_us": 0.0}
    return costs

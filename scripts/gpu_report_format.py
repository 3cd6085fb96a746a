"""scripts/gpu_report_format.py — how the GPU report writes numbers: times, byte counts,
stitch ÷ peer ratios and failed benchmarks (shared by gpu_report.py, gpu_report_stitch.py and
gpu_report_compaction.py). Standard library only."""
import math


def fmt_ns(ns):
    if ns is None or not isinstance(ns, (int, float)) or math.isnan(ns):
        return "n/a"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.3g} ns"


def fmt_bytes(b):
    if b is None or not isinstance(b, (int, float)) or math.isnan(b) or b < 0:
        return "n/a"
    if b >= 1 << 30:
        return f"{b / (1 << 30):.3g} GiB"
    if b >= 1 << 20:
        return f"{b / (1 << 20):.3g} MiB"
    return f"{b / (1 << 10):.3g} KiB"


def num3(x):
    """Three significant digits, without exponents for large values."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.3g}"


def fmt_ratio(r, better, worse):
    """'0.25× (4× faster)' — r is stitch ÷ peer."""
    if r is None or r <= 0 or math.isnan(r):
        return "n/a"
    if abs(r - 1.0) < 0.005:
        return f"{num3(r)}× (same)"
    if r < 1:
        return f"{num3(r)}× ({num3(1 / r)}× {better})"
    return f"{num3(r)}× ({num3(r)}× {worse})"


def ratio(a, b):
    if a is None or b is None:
        return None
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return None
    if b <= 0 or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def error_lines(lines, failures):
    """Appends one line per failed benchmark ((name, error) pairs), then a blank line if any."""
    for name, err in failures:
        lines.append(f"- `{name}` failed: {err}")
    if failures:
        lines.append("")


def good(row):
    """A benchmark row that ran without an error."""
    return row is not None and not row["error"]


def counter(row, name):
    """Counter `name` of a good row (None otherwise, or when it has none)."""
    return (row.get("counters") or {}).get(name) if good(row) else None

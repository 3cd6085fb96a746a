"""stitch-replay's start state and PyTorch baseline against an independent computation.

For every real PyTorch snapshot (STITCH_TRACES_DIR, default /work/shared/traces; skipped when
absent) and the shipped generated traces, this file computes from the pickle itself, in Python,
by the rules of docs/fragmentation.md ("The state at the start"):
- the memory live at the start and the peak of live requested bytes (that memory included);
- reserved at the start (the dump's segments minus the trace's net segment events) and
  PyTorch's true peak reserved (that plus the running maximum of the segment events);
and checks stitch-replay's JSON against it, then checks that the fidelity replay is within 1% of
the true peak. STITCH_REPLAY names the stitch-replay binary (set by ctest).
"""

import json
import os
import pickle
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPLAY = os.environ.get("STITCH_REPLAY", "")
REAL = Path(os.environ.get("STITCH_TRACES_DIR", "/work/shared/traces"))


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):  # a snapshot is plain data: refuse every global
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def _load(path):
    with open(path, "rb") as f:
        return _PlainData(f).load()


def expected(path):
    """Per device with events: what the rules give, computed here from the raw pickle."""
    snap = _load(path)
    segments = snap["segments"] if isinstance(snap, dict) else snap
    traces = snap.get("device_traces", []) if isinstance(snap, dict) else []
    out = {}
    for dev, trace in enumerate(traces):
        acting = [e for e in trace if e["action"] not in ("snapshot", "oom")]
        if not acting:
            continue
        release = ("free_completed" if any(e["action"] == "free_completed" for e in acting)
                   else "free_requested")
        created = [(e["addr"], e["addr"] + e["size"]) for e in acting
                   if e["action"] in ("segment_alloc", "segment_map")]
        allocated = {e["addr"] for e in acting if e["action"] == "alloc"}
        live, start = set(), {}
        for e in acting:
            if e["action"] == "alloc":
                live.add(e["addr"])
            elif e["action"] == release:
                if e["addr"] in live:
                    live.discard(e["addr"])
                else:
                    start.setdefault(e["addr"], e["size"])
        for s in segments:
            if s.get("device", 0) != dev:
                continue
            addr = s["address"]
            for b in s["blocks"]:
                a = b.get("address", addr)
                addr = a + b["size"]
                if b["state"] in ("inactive", "unmapped") or a in allocated or a in start:
                    continue
                if any(lo <= a < hi for lo, hi in created):
                    continue
                start[a] = b.get("requested_size") or b["size"]
        cur = peak = sum(start.values())
        sizes = dict(start)
        for e in acting:
            if e["action"] == "alloc":
                sizes[e["addr"]] = e["size"]
                cur += e["size"]
                peak = max(peak, cur)
            elif e["action"] == release and e["addr"] in sizes:
                cur -= sizes.pop(e["addr"])
        run = top = 0
        segment_events = False
        for e in acting:
            if e["action"] in ("segment_alloc", "segment_map"):
                run += e["size"]
                segment_events = True
            elif e["action"] in ("segment_free", "segment_unmap"):
                run -= e["size"]
                segment_events = True
            top = max(top, run)
        reserved_start = sum(s["total_size"] for s in segments if s.get("device", 0) == dev) - run
        out[dev] = {"live_at_start": sum(start.values()), "initial_blocks": len(start),
                    "peak_requested": peak, "reserved_at_start": reserved_start,
                    "recorded_peak_reserved": reserved_start + top if segment_events else None}
    return out


def traces():
    found = sorted((ROOT / "traces").glob("*.pickle"))
    if REAL.is_dir():
        found += sorted(REAL.glob("*.pickle"))
    return found


@pytest.mark.skipif(not REPLAY, reason="STITCH_REPLAY (the stitch-replay binary) not set")
@pytest.mark.parametrize("path", traces(), ids=lambda p: p.stem)
def test_start_state_and_baseline_match_an_independent_computation(path):
    out = subprocess.run([REPLAY, "--json", "--no-progress", "--config", "", str(path)],
                         check=True, capture_output=True, text=True).stdout
    reports = {r["device"]: r for r in json.loads(out)}
    want = expected(path)
    assert set(reports) == set(want)
    for dev, w in want.items():
        r = reports[dev]
        assert r["live_at_start"] == w["live_at_start"]
        assert r["initial_blocks"] == w["initial_blocks"]
        assert r["reserved_at_start"] == w["reserved_at_start"]
        assert r["recorded_peak_reserved"] == w["recorded_peak_reserved"]
        assert r["configs"][0]["peak_requested"] == w["peak_requested"]
        if w["recorded_peak_reserved"] is not None:
            f = r["fidelity"]
            assert f["recorded_peak_reserved"] == w["recorded_peak_reserved"]
            assert abs(f["replayed_peak_reserved"] - w["recorded_peak_reserved"]) <= 0.01 * w["recorded_peak_reserved"]
        else:
            assert "fidelity" not in r

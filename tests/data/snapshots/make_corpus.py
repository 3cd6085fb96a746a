#!/usr/bin/env python3
"""Writes the snapshot-reader corpus (tests/data/snapshots): PyTorch-style memory snapshots as
Python's own pickler writes them, in protocols 2 to 5, with what real snapshots carry besides
the fields stitch reads (unknown keys, wide integers in metadata, tuples, None), plus broken and
hostile files. Deterministic: rerun it and the files come out the same.

  good/NAME.pickle + good/NAME.facts  a snapshot that must load; the .facts line per device with
                                      events gives the event count and the start state as Python
                                      computes it from the same data (see facts() below)
  bad/NAME.pickle + bad/NAME.txt      a file that must be refused; the .txt holds a piece of the
                                      error message (the reader's message also names the file)
"""
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def frame(name, filename, line):
    return {"name": name, "filename": filename, "line": line}


def snapshot(wide_meta):
    """A two-device snapshot: device 0 recorded mid-run (weights live before the trace, a warm
    cache given back), device 1 from empty, on two streams."""
    unknown_line = (1 << 64) - 1  # how PyTorch writes an unknown line
    line = (1 << 70) if wide_meta else 12
    frames = [frame("forward", "model.py", line), frame("??", "??", unknown_line),
              frame("c10::cuda::CUDACachingAllocator::malloc", "", 0)]
    w = 0x7F0000000000
    seg0 = {"device": 0, "address": w, "total_size": 20 * MiB, "allocated_size": 8 * MiB,
            "active_size": 8 * MiB, "requested_size": 8 * MiB - 100, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": frames,
            "blocks": [{"address": w, "size": 8 * MiB, "requested_size": 8 * MiB - 100,
                        "state": "active_allocated", "frames": frames},
                       {"address": w + 8 * MiB, "size": 12 * MiB, "requested_size": 0,
                        "state": "inactive", "frames": []}]}
    s1 = 0x55AA00001234 if not wide_meta else (1 << 72) + 0x1234  # a stream id
    seg1 = {"device": 1, "address": 0x7E0000000000, "total_size": 2 * MiB, "allocated_size": 512,
            "active_size": 512, "requested_size": 200, "stream": s1 & ((1 << 64) - 1),
            "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
            "blocks": [{"address": 0x7E0000000000, "size": 512, "requested_size": 200,
                        "state": "active_allocated"},
                       {"address": 0x7E0000000200, "size": 2 * MiB - 512, "requested_size": 0,
                        "state": "inactive"}]}
    t = 1748732594962743 if not wide_meta else (1 << 80)

    def ev(action, addr, size, stream=0, time=t):
        return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time,
                "frames": frames, "compile_context": "N/A", "user_metadata": ""}

    d0 = [ev("segment_free", 0x7F1000000000, 20 * MiB), ev("segment_free", 0x7F2000000000, 40 * MiB),
          ev("alloc", w + 8 * MiB, 4 * MiB), ev("free_requested", w + 8 * MiB, 4 * MiB),
          ev("free_completed", w + 8 * MiB, 4 * MiB),
          {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t, "frames": []}]
    d1 = [ev("segment_alloc", 0x7E0000000000, 2 * MiB, s1, -5),
          ev("alloc", 0x7E0000000000, 200, s1), ev("alloc", 0x7E0000000200, 1000, s1),
          ev("free_requested", 0x7E0000000200, 1000, s1), ev("free_completed", 0x7E0000000200, 1000, s1),
          {"action": "oom", "device_free": 1 << 30, "size": 20 * MiB, "stream": s1, "time_us": t,
           "frames": None}]
    if wide_meta:
        for e in d1:
            if "stream" in e:
                e["stream"] = s1  # wider than 64 bits: an id, read by its low 64 bits
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "backend:native,max_non_split_rounding_mb:40,"
                                           "pinned_use_cuda_host_register:True",
                "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": False, "pinned_num_register_threads": 1,
                "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": True,
                "graph_capture_record_stream_reuse": False, "a_future_setting": [1, 2, 3],
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
    return {"segments": [seg0, seg1], "device_traces": [d0, d1], "allocator_settings": settings,
            "external_annotations": [{"device": 0, "stage": "START", "name": "step"}],
            "a_future_key": {"nested": (1, None, 2.5)}}


def facts(snap):
    """Per device with events: the event count (snapshot entries left out) and the start state,
    by the rules of docs/fragmentation.md, computed here independently of stitch."""
    out = {}
    for dev, trace in enumerate(snap["device_traces"]):
        events = [e for e in trace if e["action"] != "snapshot"]
        if not [e for e in events if e["action"] != "oom"]:
            continue
        acting = [e for e in events if e["action"] != "oom"]
        done = any(e["action"] == "free_completed" for e in acting)
        release = "free_completed" if done else "free_requested"
        created = [(e["addr"], e["addr"] + e["size"]) for e in acting
                   if e["action"] in ("segment_alloc", "segment_map")]
        allocated = {e["addr"] for e in acting if e["action"] == "alloc"}
        live, initial = set(), {}
        for e in acting:
            if e["action"] == "alloc":
                live.add(e["addr"])
            elif e["action"] == release:
                if e["addr"] in live:
                    live.discard(e["addr"])
                else:
                    initial.setdefault(e["addr"], e["size"])
        for s in snap["segments"]:
            if s["device"] != dev:
                continue
            for b in s["blocks"]:
                a = b["address"]
                if b["state"] in ("inactive", "unmapped") or a in allocated or a in initial:
                    continue
                if any(lo <= a < hi for lo, hi in created):
                    continue
                initial[a] = b["requested_size"] or b["size"]
        net, run, top = 0, 0, 0
        for e in acting:
            if e["action"] in ("segment_alloc", "segment_map"):
                run += e["size"]
            elif e["action"] in ("segment_free", "segment_unmap"):
                run -= e["size"]
            top = max(top, run)
        dump = sum(s["total_size"] for s in snap["segments"] if s["device"] == dev)
        out[dev] = {"events": len(events), "initial_blocks": len(initial),
                         "live_at_start": sum(initial.values()), "reserved_at_start": dump - run,
                         "recorded_peak_reserved": dump - run + top}
    return out


def write_facts(path, per_device):
    with open(path, "w") as f:
        for dev, fact in sorted(per_device.items()):
            f.write(" ".join([f"device={dev}"] + [f"{k}={v}" for k, v in sorted(fact.items())]) + "\n")


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    good = os.path.join(HERE, "good")
    bad = os.path.join(HERE, "bad")
    os.makedirs(good, exist_ok=True)
    os.makedirs(bad, exist_ok=True)
    for wide in (False, True):
        snap = snapshot(wide)
        for proto in (2, 3, 4, 5):
            name = f"two-devices-p{proto}" + ("-wide-metadata" if wide else "")
            write(os.path.join(good, name + ".pickle"), pickle.dumps(snap, protocol=proto))
            write_facts(os.path.join(good, name + ".facts"), facts(snap))
    # A bare list of segments (old _snapshot() output) has no trace: it loads, with no device.
    write(os.path.join(good, "segments-only-p4.pickle"), pickle.dumps(snapshot(False)["segments"], protocol=4))
    write_facts(os.path.join(good, "segments-only-p4.facts"), {})

    ok = pickle.dumps(snapshot(False), protocol=4)
    cases = {
        "truncated": (ok[: len(ok) // 2], "truncated"),
        "global": (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.", "is not allowed"),
        "not-a-pickle": (b"PK\x03\x04 this is a zip file", "offset 0"),
        "wide-size": (pickle.dumps({"segments": [dict(snapshot(False)["segments"][0], total_size=1 << 70)],
                                    "device_traces": []}, protocol=4),
                      "segments[0].total_size: int 1180591620717411303424 does not fit in 64 bits"),
        "wide-address": (pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": -(1 << 65), "size": 512, "stream": 0}]]}, protocol=4),
                         "device_traces[0][0].addr: int -36893488147419103232 does not fit in 64 bits"),
        "size-not-int": (pickle.dumps({"segments": [dict(snapshot(False)["segments"][0], total_size="big")]},
                                      protocol=4), "segments[0].total_size: expected int, got str"),
    }
    for name, (data, message) in cases.items():
        write(os.path.join(bad, name + ".pickle"), data)
        with open(os.path.join(bad, name + ".txt"), "w") as f:
            f.write(message + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

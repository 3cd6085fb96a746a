#!/usr/bin/env python3
"""Checks stitch's memory snapshots the way PyTorch's viewers read them.

PyTorch has two readers of a snapshot pickle (torch.cuda.memory._dump_snapshot):
  * the web viewer, pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js), which parses the
    pickle with its own small JavaScript unpickler and then replays the trace backwards from the
    segments to draw any past state;
  * the CLI, python -m torch.cuda._memory_viz {segments,memory,stats,trace,...}, which walks
    snapshot['segments'][i]['blocks'] and snapshot['device_traces'].
This script needs neither torch nor a browser: it loads the pickle with a restricted Unpickler
(find_class raises, so nothing can be imported or called), checks that only opcodes the
JavaScript unpickler implements are used, checks keys and types, and re-enacts what both readers
do with the data (tiling of blocks, the backward replay, the segment summary's accounting, the
OOM entries' device_free) so that a file that passes here opens in them.

Usage:
  check_snapshot_schema.py --writer PATH/stitch_tests   # writes samples with the gtest, checks them
  check_snapshot_schema.py FILE.pickle [FILE.json ...]  # checks files (a .json is compared with
                                                        # the .pickle of the same name if present)
Exit status 0 when every file passes.
"""

import io
import json
import os
import pickle
import pickletools
import subprocess
import sys
import tempfile

# Opcodes implemented by the unpickler in torch/utils/viz/MemoryViz.js.
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST",
    "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "BININT",
    "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE",
    "NEWTRUE", "NEWFALSE", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}
SEGMENT_KEYS = ["device", "address", "total_size", "allocated_size", "active_size",
                "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
                "frames", "blocks"]
BLOCK_KEYS = ["address", "size", "requested_size", "state", "frames"]
SETTINGS_KEYS = ["PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments", "roundup_power2_divisions"]


class CheckError(Exception):
    pass


def require(cond, message):
    if not cond:
        raise CheckError(message)


class NoGlobals(pickle.Unpickler):
    """Plain data only: any attempt to import or call something fails."""

    def find_class(self, module, name):
        raise CheckError(f"the pickle references the global {module}.{name}")


def load_pickle(data):
    for op, _arg, pos in pickletools.genops(data):
        require(op.name in VIEWER_OPCODES,
                f"opcode {op.name} at offset {pos} is not implemented by MemoryViz.js")
        if op.name == "PROTO":
            require(2 <= _arg <= 4, f"protocol {_arg}: MemoryViz.js accepts 2 to 4")
    return NoGlobals(io.BytesIO(data)).load()


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_frames(frames, where):
    require(isinstance(frames, list), f"{where}: frames is not a list")
    for i, f in enumerate(frames):
        require(isinstance(f, dict), f"{where}.frames[{i}] is not a dict")
        require(isinstance(f.get("name"), str) and isinstance(f.get("filename"), str)
                and is_int(f.get("line")), f"{where}.frames[{i}] needs name, filename, line")


def check_schema(snap, strict_keys):
    require(isinstance(snap, dict), "the snapshot is not a dict")
    for key in ("segments", "device_traces"):
        require(key in snap, f"missing top-level key {key!r}")
    for si, seg in enumerate(snap["segments"]):
        where = f"segments[{si}]"
        if strict_keys:
            require(list(seg.keys()) == SEGMENT_KEYS, f"{where}: keys {list(seg.keys())}")
        for k in ("device", "address", "total_size", "allocated_size", "active_size",
                  "requested_size", "stream"):
            require(is_int(seg[k]), f"{where}.{k} is not an int")
        require(seg["segment_type"] in ("small", "large"), f"{where}.segment_type")
        require(seg["segment_pool_id"] == (0, 0), f"{where}.segment_pool_id")
        require(isinstance(seg["is_expandable"], bool), f"{where}.is_expandable")
        check_frames(seg.get("frames", []), where)
        for bi, b in enumerate(seg["blocks"]):
            bw = f"{where}.blocks[{bi}]"
            if strict_keys:
                require(list(b.keys()) == BLOCK_KEYS, f"{bw}: keys {list(b.keys())}")
            require(all(is_int(b[k]) for k in ("address", "size", "requested_size")), f"{bw}: ints")
            require(b["state"] in STATES, f"{bw}.state {b['state']!r}")
            check_frames(b["frames"], bw)
    for d, trace in enumerate(snap["device_traces"]):
        for i, e in enumerate(trace):
            where = f"device_traces[{d}][{i}]"
            require(e["action"] in ACTIONS, f"{where}.action {e['action']!r}")
            addr_key = "device_free" if e["action"] == "oom" else "addr"
            require(is_int(e.get(addr_key)), f"{where}.{addr_key} is not an int")
            require(is_int(e["size"]) and is_int(e["stream"]), f"{where}: size/stream")
            if "time_us" in e:
                require(is_int(e["time_us"]), f"{where}.time_us")
            check_frames(e.get("frames", []), where)
    settings = snap.get("allocator_settings")
    if strict_keys:
        require(isinstance(settings, dict), "allocator_settings missing")
    if settings is not None:
        for k in SETTINGS_KEYS:
            require(k in settings, f"allocator_settings.{k} missing")
        require(is_int(settings["max_split_size"]), "allocator_settings.max_split_size")
        require(isinstance(settings["garbage_collection_threshold"], float),
                "allocator_settings.garbage_collection_threshold")
        rp = settings["roundup_power2_divisions"]
        require(isinstance(rp, dict) and all(k == str(1 << i) for i, k in enumerate(rp)),
                "allocator_settings.roundup_power2_divisions keys")


def check_cli_reader(snap):
    """What torch.cuda._memory_viz does with the data: its segment summary asserts that every
    segment's bytes are allocated (requested) + internal + external free; its trace printer reads
    addr/size and, for oom, device_free."""
    for si, seg in enumerate(snap["segments"]):
        allocated = internal = external = 0
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                allocated += b["requested_size"]
                internal += b["size"] - b["requested_size"]
            else:
                external += b["size"]
        require(allocated + internal + external == seg["total_size"],
                f"segments[{si}]: the segment summary's accounting does not add up")
    for trace in snap["device_traces"]:
        for e in trace:
            if e["action"] == "oom":
                require(is_int(e["device_free"]) and is_int(e["size"]), "oom entry")
            else:
                require(is_int(e["addr"]) and is_int(e["size"]), "trace entry")


def check_web_viewer(snap):
    """Re-enacts MemoryViz.js: annotate_snapshot (block addresses recomputed from the segment
    start), then for every event index the backward replay of the Allocator State History view and
    the lookup of each live block's segment, all of which throw in the browser if the data
    disagree."""
    for si, seg in enumerate(snap["segments"]):
        addr = seg["address"]
        for bi, b in enumerate(seg["blocks"]):
            require(b["address"] == addr,
                    f"segments[{si}].blocks[{bi}]: blocks must tile the segment in address order")
            addr += b["size"]
        require(addr == seg["address"] + seg["total_size"], f"segments[{si}]: blocks != total_size")

    devices = {seg["device"] for seg in snap["segments"]}
    devices |= {d for d, t in enumerate(snap["device_traces"]) if t}
    for device in sorted(devices):
        trace = snap["device_traces"][device] if device < len(snap["device_traces"]) else []
        # annotate_snapshot: a free_requested directly followed by the free_completed of the same
        # address becomes one 'free' event.
        events = []
        for e in trace:
            if (e["action"] == "free_completed" and events and events[-1]["action"] == "free_requested"
                    and events[-1]["addr"] == e["addr"]):
                events[-1] = dict(events[-1], action="free")
                continue
            events.append(dict(e))
        segments = sorted(([s["address"], s["total_size"], s["stream"]]
                           for s in snap["segments"] if s["device"] == device), key=lambda s: s[0])
        blocks = {}
        for s in snap["segments"]:
            if s["device"] != device:
                continue
            for b in s["blocks"]:
                if b["state"] in ("active_allocated", "active_pending_free"):
                    blocks[b["address"]] = [b["size"], b["state"] == "active_pending_free"]

        def state_at(idx):
            segs = [list(s) for s in segments]
            live = {a: list(v) for a, v in blocks.items()}
            for i in range(len(events) - 1, idx, -1):
                e = events[i]
                a, size, act = e.get("addr"), e["size"], e["action"]
                if act == "free":
                    live[a] = [size, False]
                elif act == "free_requested":
                    require(a in live, f"device {device} event {i}: free_requested of an unknown block")
                    live[a][1] = False
                elif act == "free_completed":
                    live[a] = [size, True]
                elif act == "alloc":
                    live.pop(a, None)
                elif act in ("segment_free", "segment_unmap"):
                    segs.append([a, size, e["stream"]])
                    segs.sort(key=lambda s: s[0])
                    if act == "segment_unmap":  # merged with contiguous runs of the same stream
                        merged = []
                        for s in segs:
                            if merged and merged[-1][0] + merged[-1][1] == s[0] and merged[-1][2] == s[2]:
                                merged[-1][1] += s[1]
                            else:
                                merged.append(s)
                        segs = merged
                elif act == "segment_alloc":
                    found = [s for s in segs if s[0] == a]
                    require(found, f"device {device} event {i}: segment_alloc of a segment not present")
                    segs.remove(found[0])
                elif act == "segment_map":
                    holder = [s for s in segs if s[0] <= a and a + size <= s[0] + s[1]]
                    require(holder, f"device {device} event {i}: segment_map of a range no segment holds")
                    s = holder[0]
                    segs.remove(s)
                    if a > s[0]:
                        segs.append([s[0], a - s[0], s[2]])
                    if a + size < s[0] + s[1]:
                        segs.append([a + size, s[0] + s[1] - a - size, s[2]])
                    segs.sort(key=lambda s: s[0])
            for a, (size, _pending) in live.items():
                require(any(s[0] <= a < s[0] + s[1] for s in segs),
                        f"device {device}: after replaying back to event {idx}, block {a:#x} lies "
                        f"in no segment")
            return segs, live

        # Every index the user can click (all of them for small traces, a sample for big ones).
        n = len(events)
        indices = range(-1, n) if n <= 400 else sorted({-1, n - 1, *range(0, n, max(1, n // 200))})
        for idx in indices:
            state_at(idx)


def normalize(v):
    if isinstance(v, (list, tuple)):
        return [normalize(x) for x in v]
    if isinstance(v, dict):
        return {k: normalize(x) for k, x in v.items()}
    return v


def check_json_twin(json_path, snap_from_pickle):
    with open(json_path, encoding="utf-8") as f:
        j = json.load(f)
    p = normalize(snap_from_pickle)
    # The JSON may have been dumped after the pickle: its traces then end with more `snapshot`
    # entries; everything else is identical.
    require(j["segments"] == p["segments"], f"{json_path}: segments differ from the pickle's")
    for d, (jt, pt) in enumerate(zip(j["device_traces"], p["device_traces"])):
        require(jt[:len(pt)] == pt, f"{json_path}: device_traces[{d}] differs from the pickle's")
        require(all(e["action"] == "snapshot" for e in jt[len(pt):]), f"{json_path}: extra events")
    require(j["allocator_settings"] == p["allocator_settings"], f"{json_path}: settings differ")


def check_file(path, strict_keys=True):
    with open(path, "rb") as f:
        data = f.read()
    snap = load_pickle(data)
    check_schema(snap, strict_keys)
    check_cli_reader(snap)
    check_web_viewer(snap)
    twin = os.path.splitext(path)[0] + ".json"
    if os.path.exists(twin):
        check_json_twin(twin, snap)
    return snap


def main(argv):
    if len(argv) >= 2 and argv[0] == "--writer":
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, STITCH_SNAPSHOT_SAMPLE_DIR=tmp)
            r = subprocess.run([argv[1], "--gtest_filter=SnapshotFile.WritesSamplesForThePythonCheck"],
                               env=env, capture_output=True, text=True)
            if r.returncode != 0:
                print(r.stdout, r.stderr, sep="\n")
                print("FAIL: the sample writer failed")
                return 1
            files = sorted(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".pickle"))
            if not files:
                print("FAIL: the sample writer wrote no pickle")
                return 1
            return check_all(files, strict_keys=True)
    strict = "--lenient" not in argv  # --lenient: PyTorch's own files (no allocator_settings, ...)
    return check_all([a for a in argv if not a.startswith("--")], strict_keys=strict)


def check_all(files, strict_keys):
    failed = 0
    for path in files:
        try:
            snap = check_file(path, strict_keys)
            events = sum(len(t) for t in snap["device_traces"])
            print(f"ok   {os.path.basename(path)}: {len(snap['segments'])} segments, {events} events")
        except (CheckError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as e:
            failed += 1
            print(f"FAIL {path}: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""fuzz/make_capi_seeds.py — writes the seed corpus of fuzz_capi_ops (fuzz/corpus/capi_ops/).

Each seed is a short, readable scenario in the fuzzer's input format (see the top comment of
fuzz/fuzz_capi_ops.cpp and its Op enum): a head byte (devices, starting configuration), a
capacity byte, then opcode bytes with their arguments. Rerun after changing the format:
    python3 fuzz/make_capi_seeds.py
"""
import os
import struct

(MALLOC, _MALLOC2, FREE, _FREE2, RECORD, EMPTY_CACHE, TOGGLE_HOLD, FRACTION, CONFIGURE,
 FAULT, BAD_INPUT, DIAGNOSTICS) = range(12)
# SimCall kinds (stitch/sim_backend.hpp)
ALLOCATE, DEALLOCATE, RESERVE, RELEASE_RESERVATION, CREATE_PHYSICAL, RELEASE_PHYSICAL, MAP, UNMAP, \
    CREATE_EVENT, DESTROY_EVENT, RECORD_EVENT, QUERY_EVENT, SYNC_EVENT, SYNC_STREAM, SET_ACCESS, \
    COPY, COPY_TO_HOST, COPY_FROM_HOST, SYNC_DEVICE = range(19)
SMALL, MEDIUM, LARGE, HUGE = range(4)  # size classes of size_of()


def head(devices, start_config, capacity_step):
    """devices 1-3; start_config 0 plain, 1 expandable, 2 stitching, 3 stitch_before_grow,
    4 stitching with compaction."""
    return bytes([(devices - 1) + 3 * start_config, capacity_step])


def malloc(device, stream, cls, value):
    return bytes([MALLOC, device, stream, cls]) + struct.pack("<H", value)


def free(slot, mode=0):
    return bytes([FREE, slot, mode])


def record(slot, stream):
    return bytes([RECORD, slot, stream])


def empty_cache(device_plus_one=0):
    return bytes([EMPTY_CACHE, device_plus_one])


def hold(stream):
    return bytes([TOGGLE_HOLD, stream - 1])


def fraction(device, eighths):
    return bytes([FRACTION, device, eighths - 1])


def configure(index):
    return bytes([CONFIGURE, index])


def fault(call, nth, oom):
    return bytes([FAULT, call, nth - 1, 0 if oom else 1])


def bad(kind, arg=0):
    return bytes([BAD_INPUT, kind, arg])


def diag(kind, arg=0):
    return bytes([DIAGNOSTICS, kind, arg])


def compaction_seed():
    """Pairs of blocks that fill 20 MiB coarse pages exactly (4 MiB then 16 MiB) on a 256 MiB
    device, and a last 4 MiB block; every 16 MiB one freed (the fuzzer frees live slot i, moving the last one into it),
    then 64 MiB requests that only compaction can serve: one plain, then one each with a fault
    in the device sync, the device copy and the copy out to the host."""
    out = head(1, 4, 2)
    live = []
    for k in range(12):
        out += malloc(0, 1, HUGE, 3) + malloc(0, 1, HUGE, 15)
        live += [("head", k), ("tail", k)]
    out += malloc(0, 1, HUGE, 3)  # 244 MiB in all: 12 MiB of fresh pages left
    live.append(("head", 12))
    while any(kind == "tail" for kind, _ in live):
        i = next(n for n, (kind, _) in enumerate(live) if kind == "tail")
        out += free(i)
        live[i] = live[-1]
        live.pop()
    out += malloc(0, 1, HUGE, 63)
    for call in (SYNC_DEVICE, COPY, COPY_TO_HOST):
        out += fault(call, 1, False) + malloc(0, 1, HUGE, 63)
    return out + free(0) + free(0) + empty_cache()


SEEDS = {
    "plain_two_devices": head(2, 0, 1) + malloc(0, 1, SMALL, 1000) + malloc(1, 2, MEDIUM, 9)
    + malloc(0, 1, LARGE, 30) + record(0, 3) + free(0) + free(0, 1) + empty_cache()
    + malloc(1, 0, HUGE, 20) + diag(0, 0) + diag(1, 1) + free(0) + empty_cache(2),
    "held_streams": head(2, 0, 0) + hold(2) + malloc(0, 2, LARGE, 50) + record(0, 2)
    + malloc(0, 1, LARGE, 40) + free(0, 1) + malloc(0, 1, LARGE, 50) + hold(2)
    + malloc(0, 1, LARGE, 50) + free(1) + free(0) + empty_cache(),
    "expandable": head(1, 1, 0) + malloc(0, 1, HUGE, 10) + malloc(0, 2, HUGE, 12)
    + malloc(0, 1, MEDIUM, 3) + free(0) + malloc(0, 1, HUGE, 30) + empty_cache(1)
    + configure(5) + malloc(0, 3, LARGE, 100) + free(1) + free(0),
    "stitching_oom": head(1, 2, 0) + malloc(0, 1, HUGE, 15) + malloc(0, 2, HUGE, 15)
    + malloc(0, 1, HUGE, 15) + free(0) + free(1) + malloc(0, 3, HUGE, 40) + malloc(0, 3, HUGE, 63)
    + free(0) + empty_cache(),
    "faults": head(2, 0, 0) + fault(ALLOCATE, 1, True) + malloc(0, 1, LARGE, 20)
    + fault(CREATE_EVENT, 1, False) + malloc(0, 1, SMALL, 100) + record(0, 2) + free(0)
    + fault(DEALLOCATE, 1, False) + empty_cache() + fault(SYNC_STREAM, 1, False) + free(0)
    + empty_cache(),
    "expandable_faults": head(1, 1, 0) + fault(MAP, 2, False) + malloc(0, 1, HUGE, 8)
    + malloc(0, 1, HUGE, 8) + fault(UNMAP, 1, False) + free(0) + empty_cache()
    + fault(CREATE_PHYSICAL, 1, True) + malloc(0, 2, HUGE, 4) + fault(RELEASE_PHYSICAL, 1, False)
    + free(0) + empty_cache(),
    "bad_inputs": head(2, 0, 0) + malloc(0, 1, MEDIUM, 40) + malloc(1, 2, SMALL, 700)
    + b"".join(bad(k, a) for k in range(14) for a in (0, 1)) + free(0) + bad(2, 0) + free(0),
    "config_changes": head(3, 0, 2) + malloc(2, 1, LARGE, 70) + configure(0) + configure(2)
    + malloc(1, 2, HUGE, 5) + configure(4) + configure(8) + configure(9) + fraction(0, 4)
    + malloc(0, 1, HUGE, 60) + configure(11) + configure(16) + malloc(0, 0, SMALL, 3) + free(2)
    + configure(17) + configure(12) + free(0) + free(0) + empty_cache(),
    "compaction": compaction_seed(),
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "capi_ops")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {out}")


if __name__ == "__main__":
    main()

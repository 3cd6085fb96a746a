"""memory_stats(): PyTorch's keys, values that agree with a recount, peaks, empty_cache."""

import random

import pytest

import stitch
from conftest import SIM_CAPACITY

# torch.cuda.memory_stats() keys of the native allocator (PyTorch 2.x; research notes section 4.1:
# `_cuda_memoryStats` in torch/csrc/cuda/Module.cpp, flattened and sorted by torch/cuda/memory.py).
# Written out by hand on purpose: this list is the contract, not stitch's own key table.
PYTORCH_MEMORY_STATS_KEYS = [
    "allocation.all.current", "allocation.all.peak", "allocation.all.allocated", "allocation.all.freed",
    "allocation.small_pool.current", "allocation.small_pool.peak", "allocation.small_pool.allocated", "allocation.small_pool.freed",
    "allocation.large_pool.current", "allocation.large_pool.peak", "allocation.large_pool.allocated", "allocation.large_pool.freed",
    "segment.all.current", "segment.all.peak", "segment.all.allocated", "segment.all.freed",
    "segment.small_pool.current", "segment.small_pool.peak", "segment.small_pool.allocated", "segment.small_pool.freed",
    "segment.large_pool.current", "segment.large_pool.peak", "segment.large_pool.allocated", "segment.large_pool.freed",
    "active.all.current", "active.all.peak", "active.all.allocated", "active.all.freed",
    "active.small_pool.current", "active.small_pool.peak", "active.small_pool.allocated", "active.small_pool.freed",
    "active.large_pool.current", "active.large_pool.peak", "active.large_pool.allocated", "active.large_pool.freed",
    "inactive_split.all.current", "inactive_split.all.peak", "inactive_split.all.allocated", "inactive_split.all.freed",
    "inactive_split.small_pool.current", "inactive_split.small_pool.peak", "inactive_split.small_pool.allocated", "inactive_split.small_pool.freed",
    "inactive_split.large_pool.current", "inactive_split.large_pool.peak", "inactive_split.large_pool.allocated", "inactive_split.large_pool.freed",
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
    "allocated_bytes.small_pool.current", "allocated_bytes.small_pool.peak", "allocated_bytes.small_pool.allocated", "allocated_bytes.small_pool.freed",
    "allocated_bytes.large_pool.current", "allocated_bytes.large_pool.peak", "allocated_bytes.large_pool.allocated", "allocated_bytes.large_pool.freed",
    "reserved_bytes.all.current", "reserved_bytes.all.peak", "reserved_bytes.all.allocated", "reserved_bytes.all.freed",
    "reserved_bytes.small_pool.current", "reserved_bytes.small_pool.peak", "reserved_bytes.small_pool.allocated", "reserved_bytes.small_pool.freed",
    "reserved_bytes.large_pool.current", "reserved_bytes.large_pool.peak", "reserved_bytes.large_pool.allocated", "reserved_bytes.large_pool.freed",
    "active_bytes.all.current", "active_bytes.all.peak", "active_bytes.all.allocated", "active_bytes.all.freed",
    "active_bytes.small_pool.current", "active_bytes.small_pool.peak", "active_bytes.small_pool.allocated", "active_bytes.small_pool.freed",
    "active_bytes.large_pool.current", "active_bytes.large_pool.peak", "active_bytes.large_pool.allocated", "active_bytes.large_pool.freed",
    "inactive_split_bytes.all.current", "inactive_split_bytes.all.peak", "inactive_split_bytes.all.allocated", "inactive_split_bytes.all.freed",
    "inactive_split_bytes.small_pool.current", "inactive_split_bytes.small_pool.peak", "inactive_split_bytes.small_pool.allocated", "inactive_split_bytes.small_pool.freed",
    "inactive_split_bytes.large_pool.current", "inactive_split_bytes.large_pool.peak", "inactive_split_bytes.large_pool.allocated", "inactive_split_bytes.large_pool.freed",
    "requested_bytes.all.current", "requested_bytes.all.peak", "requested_bytes.all.allocated", "requested_bytes.all.freed",
    "requested_bytes.small_pool.current", "requested_bytes.small_pool.peak", "requested_bytes.small_pool.allocated", "requested_bytes.small_pool.freed",
    "requested_bytes.large_pool.current", "requested_bytes.large_pool.peak", "requested_bytes.large_pool.allocated", "requested_bytes.large_pool.freed",
    "oversize_allocations.current", "oversize_allocations.peak", "oversize_allocations.allocated", "oversize_allocations.freed",
    "oversize_segments.current", "oversize_segments.peak", "oversize_segments.allocated", "oversize_segments.freed",
    "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
    "num_device_free", "max_split_size",
]
STITCH_EXTRA_KEYS = ["num_invalid_frees"]

SMALL = 1 << 20  # small pool: rounded sizes up to 1 MiB


def rounded(size):
    return max(512, (size + 511) // 512 * 512)


def test_keys_are_exactly_pytorchs_plus_num_invalid_frees():
    stats = stitch.memory_stats()
    assert len(PYTORCH_MEMORY_STATS_KEYS) == 9 * 3 * 4 + 2 * 4 + 6
    assert set(stats) == set(PYTORCH_MEMORY_STATS_KEYS) | set(STITCH_EXTRA_KEYS)
    assert list(stats) == sorted(stats)  # PyTorch returns them sorted
    assert all(isinstance(v, int) for v in stats.values())
    assert stitch.TORCH_MEMORY_STATS_KEYS == tuple(sorted(PYTORCH_MEMORY_STATS_KEYS))


def test_memory_stats_is_one_call_with_the_librarys_keys(no_leaks, monkeypatch):
    """memory_stats() reads every value with one stitch_stats() call (one snapshot under the
    device lock), and its keys are the library's (stitch_stat_key), not a copy."""
    import ctypes
    from stitch import _lib
    L = _lib.lib()
    keys, flags = [], []
    f = ctypes.c_int()
    for i in range(L.stitch_stat_count()):
        keys.append(L.stitch_stat_key(i, ctypes.byref(f)).decode())
        flags.append(f.value)
    assert L.stitch_stat_key(len(keys), None) is None
    assert stitch.MEMORY_STATS_KEYS == tuple(sorted(k for k, x in zip(keys, flags) if x & 2))
    assert stitch.TORCH_MEMORY_STATS_KEYS == tuple(sorted(k for k, x in zip(keys, flags) if x & 1))
    # stitch's own counters are keys of the library, read by name, not in memory_stats().
    for own in ("num_stitches", "num_cache_hits", "num_page_borrows"):
        assert own in keys and own not in stitch.MEMORY_STATS_KEYS
        assert stitch.stat(own) >= 0
    calls = []
    real = L.stitch_stats

    def counted(*args):
        calls.append(args[0])
        return real(*args)

    def forbidden(*args):
        raise AssertionError("memory_stats() read a value with stitch_stat()")

    monkeypatch.setattr(L, "stitch_stats", counted)
    monkeypatch.setattr(L, "stitch_stat", forbidden)
    ptr = stitch.malloc(3 << 20)
    try:
        s = stitch.memory_stats()
        monkeypatch.undo()
        assert calls == [0]
        assert s["allocation.all.current"] >= 1
        # Nothing changed since: each value is what stitch_stat() reads.
        assert s == {k: stitch.stat(k) for k in s}
    finally:
        monkeypatch.undo()
        stitch.free(ptr, 3 << 20)
    # A short buffer gets what fits and the full count, like snprintf; a bad device fails.
    few = (ctypes.c_int64 * 3)()
    assert L.stitch_stats(0, few, 3) == len(keys)
    assert L.stitch_stats(7, few, 3) == -1
    assert "invalid device 7" in _lib.last_error()


def test_unknown_key_raises_but_minus_one_is_a_value():
    with pytest.raises(stitch.StitchError, match="unknown key 'allocation.all.nope'"):
        stitch.stat("allocation.all.nope")
    # max_split_size is -1 when unlimited: a value, not an error (checked in a fresh process,
    # as this session's tests change the setting).
    from conftest import run_python
    r = run_python(["-c", "import stitch; print(stitch.memory_stats()['max_split_size'])"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "-1"


def _snapshot(device=0):
    return stitch.memory_stats(device)


def _delta(after, before, key):
    return after[key] - before[key]


def test_values_agree_with_a_recount_after_random_allocations(no_leaks):
    rng = random.Random(1234)
    base = _snapshot()
    live = {}  # ptr -> size
    try:
        for step in range(600):
            if live and rng.random() < 0.45:
                ptr = rng.choice(list(live))
                stitch.free(ptr, live.pop(ptr))
            else:
                size = rng.choice([rng.randint(1, 4096), rng.randint(4096, SMALL),
                                   rng.randint(SMALL + 1, 12 << 20)])
                live[stitch.malloc(size)] = size
            if step % 100 == 99:
                _check_recount(base, _snapshot(), live)
        _check_recount(base, _snapshot(), live)
    finally:
        for ptr, size in list(live.items()):
            stitch.free(ptr, size)
    end = _snapshot()
    for key in ("allocation.all.current", "allocated_bytes.all.current",
                "requested_bytes.all.current", "active_bytes.all.current"):
        assert end[key] == base[key], key


def _check_recount(base, now, live):
    small = [s for s in live.values() if rounded(s) <= SMALL]
    large = [s for s in live.values() if rounded(s) > SMALL]
    expect = {
        "allocation.all.current": len(live),
        "allocation.small_pool.current": len(small),
        "allocation.large_pool.current": len(large),
        "requested_bytes.all.current": sum(live.values()),
        "requested_bytes.small_pool.current": sum(small),
        "requested_bytes.large_pool.current": sum(large),
        "allocated_bytes.small_pool.current": sum(map(rounded, small)),
        "active.all.current": len(live),
        "active_bytes.small_pool.current": sum(map(rounded, small)),
    }
    for key, value in expect.items():
        assert _delta(now, base, key) == value, key
    # Large blocks may be handed out a little bigger than asked (no split of a remainder that
    # is too small to keep), never smaller.
    assert _delta(now, base, "allocated_bytes.large_pool.current") >= 0
    for stat in ("allocation", "allocated_bytes", "reserved_bytes", "segment", "requested_bytes"):
        for part in ("current", "allocated", "freed"):  # peaks are not additive
            assert now[f"{stat}.all.{part}"] == (
                now[f"{stat}.small_pool.{part}"] + now[f"{stat}.large_pool.{part}"]
            ), f"{stat}.*.{part}"
        for pool in ("all", "small_pool", "large_pool"):
            k = f"{stat}.{pool}"
            assert now[f"{k}.current"] == now[f"{k}.allocated"] - now[f"{k}.freed"], k
            assert now[f"{k}.peak"] >= now[f"{k}.current"], k
    assert now["reserved_bytes.all.current"] >= now["allocated_bytes.all.current"]
    assert now["allocated_bytes.all.current"] >= now["requested_bytes.all.current"]
    assert now["reserved_bytes.all.current"] <= SIM_CAPACITY


def test_helpers_match_the_keys(no_leaks):
    ptr = stitch.malloc(5 << 20)
    s = stitch.memory_stats()
    assert stitch.memory_allocated() == s["allocated_bytes.all.current"]
    assert stitch.memory_reserved() == s["reserved_bytes.all.current"]
    assert stitch.max_memory_allocated() == s["allocated_bytes.all.peak"]
    assert stitch.max_memory_reserved() == s["reserved_bytes.all.peak"]
    stitch.free(ptr, 5 << 20)


def test_reset_peak_sets_peaks_to_current(no_leaks):
    ptr = stitch.malloc(8 << 20)
    stitch.free(ptr, 8 << 20)
    assert stitch.max_memory_allocated() >= 8 << 20
    stitch.reset_peak_memory_stats()
    s = stitch.memory_stats()
    for key in s:
        if key.endswith(".peak"):
            assert s[key] == s[key[: -len("peak")] + "current"], key


def test_empty_cache_returns_free_segments(no_leaks):
    ptr = stitch.malloc(30 << 20)
    stitch.free(ptr, 30 << 20)
    assert stitch.memory_reserved() >= 30 << 20
    device_frees = stitch.stat("num_device_free")
    stitch.empty_cache()
    s = stitch.memory_stats()
    assert s["allocation.all.current"] == 0
    assert s["reserved_bytes.all.current"] == 0
    assert s["segment.all.current"] == 0
    assert s["num_device_free"] > device_frees


def test_devices_have_their_own_statistics(no_leaks):
    d0 = stitch.memory_stats(0)
    ptr = stitch.malloc(3 << 20, device=1)
    d1 = stitch.memory_stats(1)
    assert stitch.memory_stats(0)["allocation.all.current"] == d0["allocation.all.current"]
    assert d1["allocation.all.current"] >= 1
    assert d1["requested_bytes.large_pool.current"] >= 3 << 20
    stitch.free(ptr, 3 << 20, device=1)
    stitch.empty_cache(1)
    assert stitch.memory_reserved(1) == 0

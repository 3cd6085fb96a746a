"""The ctypes bindings: configuration, malloc/free, errors carrying stitch's messages."""

import ctypes

import pytest

import stitch
from stitch import _lib
from conftest import SIM_CAPACITY, run_python


def test_library_is_libstitch_with_the_whole_c_api(sim_allocator):
    lib = _lib.lib()
    for name in (
        "stitch_malloc", "stitch_free", "stitch_configure", "stitch_record_stream",
        "stitch_empty_cache", "stitch_set_memory_fraction", "stitch_stat",
        "stitch_reset_peak_stats", "stitch_last_error",
    ):
        assert hasattr(lib, name), name
    assert stitch.library_path() == sim_allocator


def test_malloc_free_round_trip_keeps_data(no_leaks):
    size = 3 * 4096 + 17
    ptr = stitch.malloc(size)
    assert ptr != 0 and ptr % 512 == 0
    # The simulated device is host memory: the bytes can be written and read back.
    pattern = bytes(range(256)) * (size // 256) + bytes(size % 256)
    ctypes.memmove(ptr, pattern, size)
    assert ctypes.string_at(ptr, size) == pattern
    stitch.free(ptr, size)


def test_many_allocations_are_distinct_and_aligned(no_leaks):
    sizes = [1, 511, 512, 513, 4096, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 5 << 20, 25 << 20]
    ptrs = [stitch.malloc(s) for s in sizes]
    assert all(p % 512 == 0 for p in ptrs)
    spans = sorted((p, p + s) for p, s in zip(ptrs, sizes))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    for p, s in zip(ptrs, sizes):
        stitch.free(p, s)


def test_size_zero_is_null_without_error(no_leaks):
    assert stitch.malloc(0) == 0
    stitch.free(0, 0)  # NULL does nothing


def test_other_device_and_device_spellings(no_leaks):
    before0 = stitch.stat("allocation.all.current", 0)
    ptr = stitch.malloc(4096, device="cuda:1")
    assert stitch.stat("allocation.all.current", 1) >= 1
    assert stitch.stat("allocation.all.current", 0) == before0
    stitch.free(ptr, 4096, device=1)
    with pytest.raises(ValueError):
        stitch.malloc(1, device="cpu")


def test_double_free_raises_with_stitchs_message_and_counts(no_leaks):
    ptr = stitch.malloc(1000)
    stitch.free(ptr, 1000)
    invalid = stitch.stat("num_invalid_frees")
    with pytest.raises(stitch.StitchError, match="not a live allocation") as info:
        stitch.free(ptr, 1000)
    assert hex(ptr) in str(info.value)
    assert not isinstance(info.value, stitch.OutOfMemoryError)
    assert stitch.stat("num_invalid_frees") == invalid + 1


def test_wrong_size_free_changes_nothing(no_leaks):
    ptr = stitch.malloc(1000)
    with pytest.raises(stitch.StitchError, match="allocated with size 1000"):
        stitch.free(ptr, 999)
    stitch.free(ptr, 1000)  # still live: the rejected free changed nothing


def test_unknown_pointer_free_raises():
    with pytest.raises(stitch.StitchError):
        stitch.free(0x1000, 16)


def test_bad_device_raises():
    with pytest.raises(stitch.StitchError, match="invalid device 7"):
        stitch.malloc(16, device=7)


def test_bad_configuration_key_names_the_key():
    with pytest.raises(stitch.StitchError, match="unknown key 'no_such_key'"):
        stitch.configure("no_such_key:1")


def test_bad_configuration_value_names_the_key():
    with pytest.raises(stitch.StitchError, match="expandable_segments"):
        stitch.configure("expandable_segments:maybe")


def test_fixed_keys_cannot_change_after_first_use():
    stitch.malloc(0)  # ensure the allocator exists (size 0 still creates it)
    ptr = stitch.malloc(512)
    stitch.free(ptr, 512)
    with pytest.raises(stitch.StitchError, match="fixed once the allocator exists"):
        stitch.configure("backend:cuda")
    stitch.configure("max_split_size_mb:64")  # tunables can
    assert stitch.stat("max_split_size") == 64 << 20
    stitch.configure("max_split_size_mb:" + str(1 << 40))  # back to effectively unlimited
    stitch.configure("garbage_collection_threshold:0.9")


def test_last_error_is_kept_until_the_next_failure():
    with pytest.raises(stitch.StitchError):
        stitch.configure("nope:1")
    first = _lib.last_error()
    assert "nope" in first
    assert _lib.lib().stitch_stat(0, b"num_ooms") >= 0  # a successful call keeps the message
    assert _lib.lib().stitch_reset_peak_stats(-1) == 0
    assert _lib.last_error() == first
    with pytest.raises(stitch.StitchError, match="other"):
        stitch.configure("other:1")  # the next failure replaces it
    assert "other" in _lib.last_error()
    _lib.clear_error()
    assert _lib.last_error() == ""


def test_record_stream_on_live_pointer_and_error_on_interior_pointer(no_leaks):
    ptr = stitch.malloc(4096)
    stitch.record_stream(ptr, None)
    with pytest.raises(stitch.StitchError, match="not a live allocation"):
        stitch.record_stream(ptr + 512, None)
    stitch.free(ptr, 4096)


def test_memory_fraction_range_is_checked():
    with pytest.raises(stitch.StitchError, match=r"\[0, 1\]"):
        stitch.set_memory_fraction(1.5)
    stitch.set_memory_fraction(1.0)


def test_out_of_memory_raises_the_report(no_leaks):
    ooms = stitch.stat("num_ooms")
    with pytest.raises(stitch.OutOfMemoryError) as info:
        stitch.malloc(2 * SIM_CAPACITY)
    e = info.value
    assert isinstance(e, stitch.StitchError) and isinstance(e, MemoryError)
    text = str(e)
    assert text.startswith("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "GPU 0 has a total capacity of" in text
    assert "Verdict:" in text
    assert stitch.stat("num_ooms") == ooms + 1


def test_out_of_memory_under_a_memory_fraction(no_leaks):
    try:
        stitch.set_memory_fraction(0.25)
        with pytest.raises(stitch.OutOfMemoryError, match="The memory fraction allows"):
            stitch.malloc(SIM_CAPACITY // 2)
        ptr = stitch.malloc(64 << 20)  # within the cap
        stitch.free(ptr, 64 << 20)
    finally:
        stitch.set_memory_fraction(1.0)


def test_configuration_from_the_environment_and_early_configure():
    # A fresh process: fixed keys from STITCH_ALLOC_CONF and configure() before first use.
    code = (
        "import stitch\n"
        "stitch.configure('sim_devices:3')\n"
        "p = stitch.malloc(100, device=2); stitch.free(p, 100, device=2)\n"
        "try:\n"
        "    stitch.malloc(65 << 20)\n"
        "except stitch.OutOfMemoryError as e:\n"
        "    print('OOM', str(e).splitlines()[0])\n"
    )
    r = run_python(["-c", code], env={"STITCH_ALLOC_CONF": "backend:sim,sim_capacity_mb:64"})
    assert r.returncode == 0, r.stderr
    assert "OOM CUDA out of memory. Tried to allocate 66.00 MiB" in r.stdout


def test_bad_environment_configuration_is_reported():
    r = run_python(
        ["-c", "import stitch; stitch.malloc(1)"],
        env={"STITCH_ALLOC_CONF": "backend:sim,bogus:1"},
    )
    assert r.returncode != 0
    assert "STITCH_ALLOC_CONF: stitch config: unknown key 'bogus'" in r.stderr


def test_missing_library_is_a_clear_error(tmp_path):
    r = run_python(
        ["-c", "import stitch; stitch.malloc(1)"],
        env={"STITCH_LIBRARY": str(tmp_path / "nope.so")},
    )
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and "nope.so" in r.stderr


def test_config_and_device_count_describe_the_session_allocator():
    conf = stitch.config()
    assert conf.startswith("backend:sim,sim_capacity_mb:1024") and "sim_devices:2" in conf
    assert stitch.device_count() == 2
    stitch.configure(conf)  # what config() prints is accepted back


def test_device_count_without_a_driver_fails_with_stitchs_message():
    env = {"STITCH_ALLOC_CONF": "", "STITCH_CUDA_DRIVER": "/nonexistent/libcuda.so.1"}
    r = run_python(["-c", "import stitch\ntry:\n    stitch.device_count()\nexcept stitch.StitchError as e:\n    print('ERR', e)"], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR backend:cuda: no CUDA device (cannot open the CUDA driver /nonexistent/libcuda.so.1")


def test_memory_fraction_and_accumulated_stats(no_leaks):
    assert stitch.get_memory_fraction(0) == 1.0
    stitch.set_memory_fraction(0.25, 1)
    try:
        assert stitch.get_memory_fraction(1) == pytest.approx(0.25)
    finally:
        stitch.set_memory_fraction(1.0, 1)
    ptr = stitch.malloc(4096, device=1)
    stitch.free(ptr, 4096, device=1)
    assert stitch.stat("allocation.all.allocated", 1) >= 1
    stitch.reset_accumulated_memory_stats(1)
    assert stitch.stat("allocation.all.allocated", 1) == 0
    assert stitch.stat("allocation.all.freed", 1) == 0

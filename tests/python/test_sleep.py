"""Region tags, sleep, wake, trim and residency from Python (docs/sleep.md), on the session's
simulated device through the real library: stitch.region/sleep/wake/trim/residency, the
stitch.torch wrappers, and stitch.torch.memory_saver (the torch_memory_saver drop-in).

On backend:sim device pointers are host memory: the tests write and read blocks with ctypes.
Tags live as long as the allocator (the whole session), so every test uses tags of its own, frees
what it allocates and leaves nothing asleep.
"""

import ctypes
import sys
import threading

import pytest

import stitch
import stitch.torch as st
from conftest import load_fake_torch, run_python
from stitch.torch import memory_saver as ms

MiB = 1 << 20


@pytest.fixture(autouse=True)
def awake_and_freed(no_leaks):
    """Every test frees its blocks (no_leaks) and leaves no tag asleep."""
    yield
    stitch.wake()
    for d in (0, 1):
        assert stitch.stat("sleeping_bytes.current", d) == 0


def _tag(res, tag):
    """The entry of ``tag`` in one device's residency, or None."""
    for t in res["tags"]:
        if t["tag"] == tag:
            return t
    return None


def _state(tag, device=0):
    entry = _tag(stitch.residency(device), tag)
    return None if entry is None else entry["state"]


def _alloc(size, tag=None, backup=False, device=0):
    if tag is None:
        return stitch.malloc(size, device)
    with stitch.region(tag, backup=backup):
        return stitch.malloc(size, device)


def _fill(ptr, size, seed):
    data = bytes((seed + i * 7) % 251 for i in range(size))
    ctypes.memmove(ptr, data, size)
    return data


# ---- stitch.region, residency ----------------------------------------------------------------


def test_region_tags_the_block_and_residency_shows_it():
    untagged_before = stitch.residency(0)["untagged"]["live_bytes"]
    with stitch.region("py-region") as r:
        assert r.tag == "py-region" and r.backup is False
        p = stitch.malloc(3 * MiB, 0)
    q = stitch.malloc(MiB, 0)  # after the block: untagged
    try:
        res = stitch.residency(0)
        assert res["device"] == 0
        entry = _tag(res, "py-region")
        assert entry is not None and entry["state"] == "awake"
        assert entry["live_bytes"] == 3 * MiB
        assert entry["reserved_bytes"] >= 3 * MiB and entry["segments"] >= 1
        assert entry["sleeping_bytes"] == 0 and entry["host_backup_bytes"] == 0
        assert res["untagged"]["live_bytes"] == untagged_before + MiB
        for key in ("reserved_bytes", "allocated_bytes", "sleeping_bytes", "host_backup_bytes",
                    "device_free_bytes", "device_total_bytes", "private_pools"):
            assert key in res
        assert res["device_total_bytes"] == 1024 * MiB
    finally:
        stitch.free(p, 3 * MiB, 0)
        stitch.free(q, MiB, 0)
    assert _tag(stitch.residency(0), "py-region")["live_bytes"] == 0


def test_residency_of_every_device():
    res = stitch.residency()  # -1: every device
    assert [d["device"] for d in res["devices"]] == [0, 1]
    assert stitch.residency(None).keys() == res.keys()
    assert stitch.residency("cuda:1")["device"] == 1


def test_regions_nest_and_decorate():
    @stitch.region("py-outer")
    def make():
        a = stitch.malloc(MiB, 0)
        with stitch.region("py-inner"):
            b = stitch.malloc(2 * MiB, 0)
        c = stitch.malloc(MiB, 0)
        return a, b, c

    a, b, c = make()
    try:
        res = stitch.residency(0)
        assert _tag(res, "py-outer")["live_bytes"] == 2 * MiB
        assert _tag(res, "py-inner")["live_bytes"] == 2 * MiB
    finally:
        stitch.free(a, MiB, 0)
        stitch.free(b, 2 * MiB, 0)
        stitch.free(c, MiB, 0)


def test_region_refuses_bad_tags():
    with pytest.raises(stitch.StitchError, match="comma"):
        with stitch.region("a,b"):
            pass
    with pytest.raises(stitch.StitchError):
        with stitch.region(""):
            pass
    with pytest.raises(TypeError):
        stitch.region(b"weights")
    # A refused region leaves nothing open: this allocation is untagged.
    before = stitch.residency(0)["untagged"]["live_bytes"]
    p = stitch.malloc(MiB, 0)
    assert stitch.residency(0)["untagged"]["live_bytes"] == before + MiB
    stitch.free(p, MiB, 0)


def test_regions_are_per_thread():
    got = {}
    with stitch.region("py-thread"):
        t = threading.Thread(target=lambda: got.setdefault("p", stitch.malloc(2 * MiB, 0)))
        before = stitch.residency(0)["untagged"]["live_bytes"]
        t.start()
        t.join()
        mine = stitch.malloc(MiB, 0)
    try:
        res = stitch.residency(0)
        assert _tag(res, "py-thread")["live_bytes"] == MiB  # only this thread's block
        assert res["untagged"]["live_bytes"] == before + 2 * MiB  # the other thread's
    finally:
        stitch.free(got["p"], 2 * MiB, 0)
        stitch.free(mine, MiB, 0)


# ---- sleep and wake --------------------------------------------------------------------------


def test_sleep_gives_memory_back_and_wake_restores_it():
    p = _alloc(8 * MiB, "py-sleep")
    try:
        entry = _tag(stitch.residency(0), "py-sleep")
        tag_reserved = entry["reserved_bytes"]
        reserved = stitch.stat("reserved_bytes.all.current", 0)
        allocated = stitch.stat("allocated_bytes.all.current", 0)
        sleeps, wakes = stitch.stat("num_sleeps", 0), stitch.stat("num_wakes", 0)
        free_before = stitch.residency(0)["device_free_bytes"]

        res = stitch.sleep("py-sleep")
        dev0 = res["devices"][0]  # device -1: every device
        asleep = _tag(dev0, "py-sleep")
        assert asleep["state"] == "asleep"
        assert asleep["sleeping_bytes"] == 8 * MiB and asleep["reserved_bytes"] == 0
        assert asleep["host_backup_bytes"] == 0  # no backup asked for
        assert stitch.stat("reserved_bytes.all.current", 0) == reserved - tag_reserved
        assert stitch.stat("allocated_bytes.all.current", 0) == allocated  # still live
        assert stitch.stat("sleeping_bytes.current", 0) == 8 * MiB
        assert stitch.stat("sleeping_bytes.peak", 0) >= 8 * MiB
        assert stitch.stat("num_sleeps", 0) == sleeps + 1
        assert dev0["device_free_bytes"] == free_before + tag_reserved

        # A tag asleep already is left alone.
        stitch.sleep(["py-sleep"])
        assert stitch.stat("num_sleeps", 0) == sleeps + 1

        stitch.wake("py-sleep")
        assert _state("py-sleep") == "awake"
        assert stitch.stat("reserved_bytes.all.current", 0) == reserved
        assert stitch.stat("sleeping_bytes.current", 0) == 0
        assert stitch.stat("num_wakes", 0) == wakes + 1
        # The block is usable again at its address.
        data = _fill(p, 4096, 3)
        assert ctypes.string_at(p, 4096) == data
    finally:
        stitch.free(p, 8 * MiB, 0)


def test_backed_up_contents_survive_sleep_and_wake():
    size = 2 * MiB + 4096
    w = _alloc(size, "py-weights", backup=True)    # the region's own backup flag
    kv = _alloc(size, "py-kv")                       # backed up by sleep(backup=...)
    try:
        w_data, kv_data = _fill(w, size, 11), _fill(kv, size, 29)
        res = stitch.sleep(("py-weights", "py-kv"), backup="py-kv", device=0)
        assert res["device"] == 0  # one device: its own residency
        assert _tag(res, "py-weights")["host_backup_bytes"] == size
        assert _tag(res, "py-kv")["host_backup_bytes"] == size
        assert res["host_backup_bytes"] >= 2 * size
        # Wake one tag at a time: weights first.
        stitch.wake("py-weights", device=0)
        assert _state("py-weights") == "awake" and _state("py-kv") == "asleep"
        assert ctypes.string_at(w, size) == w_data
        stitch.wake(["py-kv"], device=0)
        assert ctypes.string_at(kv, size) == kv_data
        assert stitch.residency(0)["host_backup_bytes"] == 0  # backups freed at the wake
    finally:
        stitch.free(w, size, 0)
        stitch.free(kv, size, 0)


def test_allocating_under_a_sleeping_tag_raises():
    p = _alloc(MiB, "py-asleep")
    try:
        stitch.sleep("py-asleep")
        with pytest.raises(stitch.StitchError, match="py-asleep.*asleep"):
            with stitch.region("py-asleep"):
                stitch.malloc(4096, 0)
        stitch.wake("py-asleep")
        q = _alloc(4096, "py-asleep")
        stitch.free(q, 4096, 0)
    finally:
        stitch.free(p, MiB, 0)


def test_an_unknown_tag_raises_with_its_name():
    p = _alloc(MiB, "py-known")
    try:
        with pytest.raises(stitch.StitchError, match="py-nevr-used"):
            stitch.sleep("py-nevr-used")
        # All or nothing: the known tag in the same call did not sleep.
        with pytest.raises(stitch.StitchError, match="py-nevr-used"):
            stitch.sleep(["py-known", "py-nevr-used"])
        assert _state("py-known") == "awake"
        with pytest.raises(stitch.StitchError, match="py-nevr-used"):
            stitch.sleep("py-known", backup="py-nevr-used")
        with pytest.raises(stitch.StitchError, match="py-nevr-used"):
            stitch.wake("py-nevr-used")
        assert not isinstance(_catch(stitch.wake, "py-nevr-used"), stitch.OutOfMemoryError)
    finally:
        stitch.free(p, MiB, 0)


def _catch(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return e
    return None


def test_tag_arguments():
    p = _alloc(MiB, "py-args-a")
    q = _alloc(MiB, "py-args-b")
    try:
        stitch.sleep([])  # no tag: nothing sleeps
        stitch.sleep("")
        assert _state("py-args-a") == _state("py-args-b") == "awake"
        stitch.sleep("py-args-a, py-args-b")  # comma-separated in one str
        assert _state("py-args-a") == _state("py-args-b") == "asleep"
        stitch.wake(t for t in ("py-args-a", "py-args-b"))  # any iterable
        assert _state("py-args-a") == _state("py-args-b") == "awake"
        with pytest.raises(TypeError):
            stitch.sleep(b"py-args-a")
        with pytest.raises(TypeError):
            stitch.sleep(["py-args-a", 3])
        with pytest.raises(stitch.StitchError, match="device"):
            stitch.sleep("py-args-a", device=7)
    finally:
        stitch.free(p, MiB, 0)
        stitch.free(q, MiB, 0)


def test_sleep_of_one_device_leaves_the_others_awake():
    p0 = _alloc(MiB, "py-dev", device=0)
    p1 = _alloc(MiB, "py-dev", device=1)
    try:
        stitch.sleep("py-dev", device=1)
        assert _state("py-dev", 0) == "awake" and _state("py-dev", 1) == "asleep"
        assert stitch.stat("sleeping_bytes.current", 1) == MiB
        stitch.wake(device="cuda:1")
        assert _state("py-dev", 1) == "awake"
    finally:
        stitch.free(p0, MiB, 0)
        stitch.free(p1, MiB, 1)


def test_sleep_everything_then_wake_everything():
    p = _alloc(MiB, "py-all-a")
    q = _alloc(MiB, "py-all-b", device=1)
    try:
        res = stitch.sleep()
        assert _tag(res["devices"][0], "py-all-a")["state"] == "asleep"
        assert _tag(res["devices"][1], "py-all-b")["state"] == "asleep"
        stitch.wake()
        assert _state("py-all-a", 0) == "awake" and _state("py-all-b", 1) == "awake"
    finally:
        stitch.free(p, MiB, 0)
        stitch.free(q, MiB, 1)


def test_a_wake_without_room_raises_oom_and_can_be_retried():
    p = _alloc(64 * MiB, "py-oom")
    try:
        stitch.sleep("py-oom", device=0)
        stitch.empty_cache(0)  # a wake releases the cache before it fails: none to release
        free = stitch.residency(0)["device_free_bytes"]
        hog_size = free - 16 * MiB
        hog = stitch.malloc(hog_size, 0)  # untagged: takes the room the tag needs
        try:
            with pytest.raises(stitch.OutOfMemoryError, match="^CUDA out of memory.*py-oom"):
                stitch.wake("py-oom", device=0)
            assert _state("py-oom") == "asleep"
        finally:
            stitch.free(hog, hog_size, 0)
            stitch.empty_cache(0)
        stitch.wake("py-oom", device=0)
        assert _state("py-oom") == "awake"
    finally:
        stitch.free(p, 64 * MiB, 0)


# ---- trim ------------------------------------------------------------------------------------


def test_trim_stops_at_its_target():
    stitch.empty_cache(0)
    base = stitch.memory_reserved(0)
    seg = 30 * MiB
    blocks = [stitch.malloc(seg, 0) for _ in range(6)]
    for b in blocks:
        stitch.free(b, seg, 0)
    full = stitch.memory_reserved(0)
    assert full >= base + 6 * seg
    keep = base + 100 * MiB
    stitch.trim(keep, 0)
    after = stitch.memory_reserved(0)
    assert keep - seg < after <= keep  # stopped once enough had gone
    stitch.trim(keep, 0)  # at the target already: nothing more goes
    assert stitch.memory_reserved(0) == after
    stitch.trim(0)  # every device, down to nothing cached
    assert stitch.memory_reserved(0) == base
    with pytest.raises(ValueError):
        stitch.trim(-1)
    with pytest.raises(TypeError):
        stitch.trim(1.5)


def test_trim_gives_back_a_tags_cached_memory():
    p = _alloc(8 * MiB, "py-trim")
    stitch.free(p, 8 * MiB, 0)
    assert _tag(stitch.residency(0), "py-trim")["cached_bytes"] > 0
    stitch.trim(0, 0)
    assert _tag(stitch.residency(0), "py-trim")["reserved_bytes"] == 0


# ---- stitch.torch ----------------------------------------------------------------------------


@pytest.fixture
def fake_torch(monkeypatch):
    mod = load_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", mod)
    return mod


def test_torch_functions_without_torch():
    assert "torch" not in sys.modules or not hasattr(sys.modules["torch"], "cuda")
    with st.region("py-torch", backup=True):
        p = stitch.malloc(MiB, 0)
    try:
        data = _fill(p, 4096, 5)
        res = st.sleep("py-torch")
        assert _tag(res["devices"][0], "py-torch")["state"] == "asleep"
        st.wake("py-torch")
        assert ctypes.string_at(p, 4096) == data
        assert _tag(st.residency(0), "py-torch")["state"] == "awake"
    finally:
        stitch.free(p, MiB, 0)
    st.trim(0)


def test_torch_functions_synchronize_only_an_initialized_cuda(fake_torch):
    with st.region("py-torch-sync"):
        p = stitch.malloc(MiB, 0)
    try:
        # CUDA not initialized: no synchronize (the stand-in raises if it is called).
        st.sleep("py-torch-sync")
        st.wake("py-torch-sync")
        st.trim(1 << 40)
        assert fake_torch.state.synchronized == []
        fake_torch.state.cuda_initialized = True
        st.sleep("py-torch-sync", device=0)
        st.wake()
        st.trim(1 << 40, device=1)
        assert fake_torch.state.synchronized == [0, None, 1]
    finally:
        stitch.free(p, MiB, 0)


def test_importing_and_using_them_does_not_import_torch():
    code = (
        "import sys, stitch, stitch.torch, stitch.torch.memory_saver as ms\n"
        "from stitch.torch.memory_saver import torch_memory_saver\n"
        "with stitch.torch.region('w', backup=True):\n"
        "    p = stitch.malloc(1 << 20, 0)\n"
        "with torch_memory_saver.region('kv'):\n"
        "    q = stitch.malloc(1 << 20, 0)\n"
        "stitch.torch.sleep(); stitch.torch.wake('w'); stitch.torch.wake('kv')\n"
        "ms.pause('kv'); ms.resume('kv'); stitch.torch.trim(0)\n"
        "print('torch' in sys.modules)\n"
    )
    r = run_python(["-c", code])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


# ---- stitch.torch.memory_saver -----------------------------------------------------------------


def test_memory_saver_names():
    from stitch.torch.memory_saver import TorchMemorySaver, memory_saver, torch_memory_saver

    assert torch_memory_saver is memory_saver is ms.torch_memory_saver
    assert isinstance(torch_memory_saver, TorchMemorySaver)
    for name in ("region", "pause", "resume", "cuda_graph", "disable", "configure_subprocess"):
        assert callable(getattr(ms, name))
    assert torch_memory_saver.enabled is False  # stitch.torch.enable() was not called here
    with ms.configure_subprocess():
        pass


def test_memory_saver_region_pause_resume_module_functions():
    with ms.region("py-ms-w", enable_cpu_backup=True):
        w = stitch.malloc(MiB, 0)
    with ms.region(tag="py-ms-kv"):
        kv = stitch.malloc(MiB, 0)
    try:
        data = _fill(w, MiB, 17)
        ms.pause("py-ms-kv")
        assert _state("py-ms-kv") == "asleep" and _state("py-ms-w") == "awake"
        ms.pause()  # every tag; a paused one is left alone
        assert _state("py-ms-w") == "asleep"
        ms.resume("py-ms-w")
        assert _state("py-ms-w") == "awake" and _state("py-ms-kv") == "asleep"
        assert ctypes.string_at(w, MiB) == data  # enable_cpu_backup kept it
        ms.resume()
        assert _state("py-ms-kv") == "awake"
        ms.resume()  # nothing paused: nothing to do
        # A tag without allocations is nothing to pause or resume (as in torch_memory_saver),
        # even one whose region was opened; stitch.sleep refuses it.
        ms.pause("py-ms-never")
        ms.resume("py-ms-never")
        with ms.region("py-ms-opened-only"):
            pass
        ms.pause("py-ms-opened-only")
        with pytest.raises(stitch.StitchError, match="py-ms-opened-only"):
            stitch.sleep("py-ms-opened-only")
    finally:
        stitch.free(w, MiB, 0)
        stitch.free(kv, MiB, 0)


def test_memory_saver_singleton_methods():
    from stitch.torch.memory_saver import torch_memory_saver as tms

    with tms.region():  # the default tag
        a = stitch.malloc(MiB, 0)
    try:
        assert _tag(stitch.residency(0), "default")["live_bytes"] == MiB
        tms.pause("default")
        assert _state("default") == "asleep"
        tms.resume("default")
        assert _state("default") == "awake"
    finally:
        stitch.free(a, MiB, 0)


def test_memory_saver_disable_untags_and_reopens():
    with ms.region("py-ms-outer"):
        with ms.region("py-ms-inner", enable_cpu_backup=True):
            with ms.disable():
                before = stitch.residency(0)["untagged"]["live_bytes"]
                u = stitch.malloc(MiB, 0)
                assert stitch.residency(0)["untagged"]["live_bytes"] == before + MiB
            t = stitch.malloc(MiB, 0)  # the inner region again, with its backup flag
        o = stitch.malloc(MiB, 0)
    try:
        assert _tag(stitch.residency(0), "py-ms-inner")["live_bytes"] == MiB
        assert _tag(stitch.residency(0), "py-ms-outer")["live_bytes"] == MiB
        data = _fill(t, MiB, 23)
        ms.pause("py-ms-inner")
        assert _tag(stitch.residency(0), "py-ms-inner")["host_backup_bytes"] == MiB
        ms.resume("py-ms-inner")
        assert ctypes.string_at(t, MiB) == data
    finally:
        for p in (u, t, o):
            stitch.free(p, MiB, 0)
    with ms.disable():  # outside any region: harmless
        pass


def test_memory_saver_cuda_graph(fake_torch):
    g = fake_torch.cuda.CUDAGraph()
    with ms.torch_memory_saver.cuda_graph(g, pool="pool", stream="s", tag="py-ms-graph",
                                          enable_cpu_backup=True):
        p = stitch.malloc(MiB, 0)  # inside the region the capture began in: tagged
    try:
        assert fake_torch.state.captures == [(g, "pool", "s", "global")]
        assert _tag(stitch.residency(0), "py-ms-graph")["live_bytes"] == MiB
    finally:
        stitch.free(p, MiB, 0)
    with ms.cuda_graph(g, capture_error_mode="thread_local"):
        pass
    assert fake_torch.state.captures[-1] == (g, None, None, "thread_local")


def test_memory_saver_settings():
    tms = ms.TorchMemorySaver()
    assert tms.hook_mode is None
    tms.hook_mode = "torch"
    assert tms.hook_mode == "torch"
    with pytest.raises(ValueError):
        tms.hook_mode = "ld_preload"
    with pytest.raises(NotImplementedError):
        tms.memory_margin_bytes = 1 << 30
    with pytest.raises(NotImplementedError):
        tms.get_cpu_backup(None)


# ---- spill to host pages (docs/spill.md) ----------------------------------------------------------


def test_spill_moves_a_spillable_tag_to_host_pages_and_unspill_brings_it_back():
    size = 6 * MiB
    with stitch.region("py-spill-w", spill=True):
        p = stitch.malloc(size)
    with stitch.region("py-spill-kv"):
        q = stitch.malloc(MiB)
    data = _fill(p, size, 5)
    before = stitch.stat("reserved_bytes.all.current")
    res = stitch.spill("py-spill-w", device=0)
    entry = _tag(res, "py-spill-w")
    assert entry["state"] == "spilled" and entry["spill"] is True
    assert entry["spilled_bytes"] >= size
    assert stitch.stat("spilled_bytes.current") >= size
    assert stitch.stat("reserved_bytes.all.current") < before, "the device pages went back"
    assert ctypes.string_at(p, size) == data, "same address, same bytes, on host pages"
    data = _fill(p, size, 9)  # still writable there
    with pytest.raises(stitch.StitchError, match="py-spill-kv"):
        stitch.spill("py-spill-kv")
    stitch.unspill()
    assert stitch.stat("spilled_bytes.current") == 0
    assert _state("py-spill-w") == "awake"
    assert ctypes.string_at(p, size) == data
    stitch.free(p, size)
    stitch.free(q, MiB)


def test_spill_and_unspill_under_stitch_torch():
    with st.region("py-spill-t", spill=True):
        p = stitch.malloc(2 * MiB)
    data = _fill(p, 2 * MiB, 3)
    st.spill("py-spill-t", bytes=MiB)
    assert stitch.stat("spilled_bytes.current") >= MiB
    st.unspill("py-spill-t")
    assert ctypes.string_at(p, 2 * MiB) == data
    stitch.free(p, 2 * MiB)
    assert stitch.stat("num_spills") >= 1 and stitch.stat("num_unspills") >= 1


def test_spill_refuses_bad_arguments():
    with pytest.raises(TypeError):
        stitch.spill("x", bytes=-1)
    with pytest.raises(stitch.StitchError, match="never used"):
        stitch.spill("py-spill-never")


# ---- KV pools (docs/kv.md) ------------------------------------------------------------------------


def test_kv_pool_blocks_arrays_limits_and_sleep():
    before = stitch.stat("kv_bytes.current")
    with stitch.kv.Pool(0, buffers=2, block_bytes=96 * 1024, max_blocks=64, tag="py-kv", backup=True) as pool:
        ids = pool.alloc(5)
        assert ids == [0, 1, 2, 3, 4]
        k = memoryview(pool.buffer(0))  # a NumPy array, or a memoryview without NumPy
        assert k.nbytes == 96 * 1024 * 64
        k[0:96 * 1024 * 5] = b"\x07" * (96 * 1024 * 5)
        memoryview(pool.buffer(1))[: 96 * 1024] = b"\x09" * (96 * 1024)
        assert stitch.stat("kv_bytes.current") > before
        with pytest.raises(stitch.StitchError, match="twice"):
            pool.free([1, 1])
        with pytest.raises(stitch.StitchError, match="not allocated"):
            pool.free([40])
        stitch.sleep("py-kv", device=0)
        with pytest.raises(stitch.StitchError, match="py-kv"):
            pool.alloc(1)
        stitch.wake("py-kv", device=0)
        assert memoryview(pool.buffer(0))[96 * 1024 * 5 - 1] == 7 and memoryview(pool.buffer(1))[0] == 9
        pool.set_limit(1)
        with pytest.raises(stitch.OutOfMemoryError, match="limit"):
            pool.alloc(10)
        pool.set_limit(0)
        assert pool.available() == 59
        pool.free(ids)
        with pytest.raises(stitch.StitchError):
            pool.free([0])
        pool.trim()
        assert stitch.stat("kv_bytes.current") == before
        entry = [p for p in stitch.residency(0)["kv_pools"] if p["tag"] == "py-kv"][0]
        assert entry["live_blocks"] == 0 and entry["page_maps"] >= 1
    assert not [p for p in stitch.residency(0)["kv_pools"] if p["tag"] == "py-kv"]

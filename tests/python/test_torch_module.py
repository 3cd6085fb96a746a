"""stitch.torch: the allocator swap, the MemPool route, OOM translation and the launcher.

Without PyTorch these run against fake_torch.py (the same calls PyTorch's CUDAPluggableAllocator
makes: ctypes symbol lookup, integer hook addresses, the "already initialized" refusal). The last
test runs real PyTorch on a GPU and skips without them.
"""

import importlib.util
import pickle
import sys
import textwrap
from pathlib import Path

import pytest

import stitch
import stitch.torch as st
from stitch import _lib
from stitch._lib import StitchError
from conftest import load_fake_torch, run_python

HERE = Path(__file__).resolve().parent


@pytest.fixture
def fake_torch(monkeypatch):
    """The stand-in torch, in this process, over the session's simulated device (which enable()
    refuses outside the tests)."""
    mod = load_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", mod)
    monkeypatch.setattr(st, "_allocator", None)
    monkeypatch.setattr(st, "_ALLOW_SIM_FOR_TESTS", True)
    return mod


@pytest.fixture
def fake_torch_dir(tmp_path):
    """A directory holding the fake as package `torch`, for subprocesses."""
    d = tmp_path / "fake"
    (d / "torch").mkdir(parents=True)
    (d / "torch" / "__init__.py").write_text((HERE / "fake_torch.py").read_text())
    return d


def test_import_does_not_import_torch():
    r = run_python(["-c", "import sys, stitch, stitch.torch; print('torch' in sys.modules)"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_enable_installs_the_throwing_hooks(fake_torch):
    alloc = st.enable()
    assert fake_torch.state.current is alloc and fake_torch.state.swaps == 1
    assert st.is_enabled() and st.allocator() is alloc
    handle = alloc.allocator()
    assert alloc.names == ("stitch_torch_malloc", "stitch_free")
    assert handle.path == stitch.library_path()
    assert handle.alloc_fn == _lib.hook_address("stitch_torch_malloc")
    assert handle.free_fn == _lib.hook_address("stitch_free")
    assert handle.hooks == {
        "reset": _lib.hook_address("stitch_torch_empty_cache"),
        "memory_fraction": _lib.hook_address("stitch_torch_set_memory_fraction"),
        "record_stream": _lib.hook_address("stitch_torch_record_stream"),
        "begin_allocate_to_pool": _lib.hook_address("stitch_torch_begin_allocate_to_pool"),
        "end_allocate_to_pool": _lib.hook_address("stitch_torch_end_allocate_to_pool"),
        "release_pool": _lib.hook_address("stitch_torch_release_pool"),
    }


def test_enable_twice_is_a_no_op(fake_torch):
    first = st.enable()
    assert st.enable("garbage_collection_threshold:0.8") is first
    assert fake_torch.state.swaps == 1


def test_enable_after_cuda_init_is_refused(fake_torch):
    fake_torch.state.cuda_initialized = True
    with pytest.raises(stitch.StitchError, match="CUDA is already initialized"):
        st.enable()
    assert fake_torch.state.current is None and not st.is_enabled()


def test_enable_reports_pytorchs_refusal(fake_torch):
    fake_torch.state.allocator_initialized = True  # e.g. C++ code initialized the allocator
    with pytest.raises(stitch.StitchError, match="Can't swap an already initialized allocator"):
        st.enable()
    assert not st.is_enabled()


def test_enable_validates_the_configuration_first(fake_torch):
    with pytest.raises(stitch.StitchError, match="unknown key 'bogus'"):
        st.enable("bogus:1")
    assert fake_torch.state.current is None and not st.is_enabled()


@pytest.mark.parametrize("route", ["enable", "mempool"])
def test_backend_sim_is_refused(fake_torch, monkeypatch, route):
    monkeypatch.setattr(st, "_ALLOW_SIM_FOR_TESTS", False)
    with pytest.raises(stitch.StitchError, match="backend:sim, whose memory is host memory"):
        getattr(st, route)()
    assert fake_torch.state.current is None and not fake_torch.state.pools
    assert not st.is_enabled()


ENABLE = textwrap.dedent(
    """
    import torch, stitch, stitch.torch
    try:
        stitch.torch.enable()
    except stitch.StitchError as e:
        print("REFUSED", e)
    print("SWAPS", torch.state.swaps, "ENABLED", stitch.torch.is_enabled())
    """
)


def test_enable_without_a_driver_fails_at_once(fake_torch_dir):
    env = {"STITCH_ALLOC_CONF": "", "STITCH_CUDA_DRIVER": "/nonexistent/libcuda.so.1"}
    r = run_python(["-c", ENABLE], env=env, path=[fake_torch_dir])
    assert r.returncode == 0, r.stderr
    assert "REFUSED stitch.torch.enable(): no usable CUDA device: backend:cuda: no CUDA device" in r.stdout
    assert "/nonexistent/libcuda.so.1" in r.stdout
    assert "SWAPS 0 ENABLED False" in r.stdout


def test_enable_on_the_fake_driver(fake_torch_dir, fake_cuda_env):
    r = run_python(["-c", ENABLE], env=fake_cuda_env, path=[fake_torch_dir])
    assert r.returncode == 0, r.stderr
    assert "REFUSED" not in r.stdout and "SWAPS 1 ENABLED True" in r.stdout


def test_enable_refuses_backend_sim_from_the_environment(fake_torch_dir):
    r = run_python(["-c", ENABLE], env={"STITCH_ALLOC_CONF": "backend:sim"}, path=[fake_torch_dir])
    assert r.returncode == 0, r.stderr
    assert "REFUSED stitch.torch.enable(): the configuration says backend:sim" in r.stdout
    assert "SWAPS 0 ENABLED False" in r.stdout


def test_enable_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    monkeypatch.setattr(st, "_allocator", None)
    with pytest.raises(stitch.StitchError, match="PyTorch is not installed"):
        st.enable()


def test_mempool_uses_the_null_returning_hook(fake_torch):
    pool = st.mempool(use_on_oom=True)
    assert pool.use_on_oom is True
    assert pool.allocator.alloc_fn == _lib.hook_address("stitch_malloc")
    assert pool.allocator.free_fn == _lib.hook_address("stitch_free")
    assert fake_torch.state.current is None  # the process allocator is untouched
    with pytest.raises(stitch.StitchError, match="does not take no_split_please"):
        st.mempool(no_split_please=True)


def test_mempool_after_enable_is_refused(fake_torch):
    st.enable()
    with pytest.raises(stitch.StitchError, match="already serves every allocation"):
        st.mempool()


OOM_TEXT = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ..."


@pytest.mark.parametrize("kind", [RuntimeError, MemoryError])
def test_raise_torch_oom_translates_stitch_reports(fake_torch, kind):
    with pytest.raises(fake_torch.OutOfMemoryError) as info:
        with st.raise_torch_oom():
            raise kind(OOM_TEXT)
    assert str(info.value) == OOM_TEXT
    assert isinstance(info.value.__cause__, kind)


def test_raise_torch_oom_translates_stitch_malloc(fake_torch, no_leaks):
    @st.raise_torch_oom
    def grab():
        return stitch.malloc(1 << 40)

    with pytest.raises(fake_torch.OutOfMemoryError, match="^CUDA out of memory"):
        grab()


def test_raise_torch_oom_leaves_other_errors_alone(fake_torch):
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with st.raise_torch_oom():
            raise RuntimeError("shape mismatch")
    native = fake_torch.OutOfMemoryError("CUDA out of memory. (native)")
    with pytest.raises(fake_torch.OutOfMemoryError) as info:
        with st.raise_torch_oom():
            raise native
    assert info.value is native
    with pytest.raises(ValueError):
        with st.raise_torch_oom():
            raise ValueError(OOM_TEXT)


def test_raise_torch_oom_without_torch_keeps_the_error(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert st.is_stitch_oom(RuntimeError(OOM_TEXT))
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        with st.raise_torch_oom():
            raise RuntimeError(OOM_TEXT)


# ---- the launcher -------------------------------------------------------------------------------

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch, stitch, stitch.torch
    print("NAME", __name__)
    print("ARGV", sys.argv[1:])
    print("PATH0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
    print("ENABLED", stitch.torch.is_enabled(), torch.state.current is stitch.torch.allocator())
    p = stitch.malloc(1000, device=int(os.environ.get("DEV", "0")))
    stitch.free(p, 1000, device=int(os.environ.get("DEV", "0")))
    if "--oom" in sys.argv:
        stitch.malloc(1 << 40)
    sys.exit(int(os.environ.get("EXIT", "0")))
    """
)


@pytest.fixture
def launch(tmp_path, fake_torch_dir, fake_cuda_env):
    """Runs `python -m stitch.torch args` (SCRIPT: the script above) with the stand-in torch on
    backend:cuda over the fake driver; `env` adds to that environment."""

    def run(*args, env=None, cwd=None):
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        argv = [a if a != "SCRIPT" else str(script) for a in args]
        return run_python(["-m", "stitch.torch", *argv], env={**fake_cuda_env, **(env or {})},
                          path=[fake_torch_dir], cwd=cwd)

    return run


def test_launcher_runs_the_script_as_main(launch):
    r = launch("SCRIPT", "--lr", "3", "--", "x", env={"EXIT": "3"})
    assert r.returncode == 3, r.stderr
    assert "NAME __main__" in r.stdout
    assert "ARGV ['--lr', '3', '--', 'x']" in r.stdout
    assert "PATH0 True" in r.stdout
    assert "ENABLED True True" in r.stdout


def test_launcher_runs_a_module(tmp_path, launch):
    (tmp_path / "trainmod.py").write_text(SCRIPT.replace("os.path.dirname(os.path.abspath(__file__))", "sys.path[0]"))
    r = launch("-m", "trainmod", "a", "b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "NAME __main__" in r.stdout and "ARGV ['a', 'b']" in r.stdout
    assert "ENABLED True True" in r.stdout


def test_launcher_honours_stitch_alloc_conf(launch):
    r = launch("SCRIPT", env={"STITCH_ALLOC_CONF": "expandable_segments:True", "DEV": "1"})
    assert r.returncode == 0, r.stderr
    r = launch("SCRIPT", env={"STITCH_ALLOC_CONF": "expandable_segments:True,x:1"})
    assert r.returncode == 1
    assert "STITCH_ALLOC_CONF: stitch config: unknown key 'x'" in r.stderr
    r = launch("SCRIPT", env={"STITCH_ALLOC_CONF": "backend:sim"})
    assert r.returncode == 1
    assert "the configuration says backend:sim" in r.stderr


def test_launcher_spill_option(launch):
    r = launch("--spill", "all", "SCRIPT", env={"DEV": "1"})
    assert r.returncode == 0, r.stderr
    r = launch("--spill=tags", "--conf", "stitching:True", "SCRIPT")
    assert r.returncode == 0, r.stderr
    r = launch("--spill", "some", "SCRIPT")
    assert r.returncode != 0 and "--spill takes tags or all" in r.stderr
    # Without host pages (a driver without HOST_NUMA) spill is refused at configure, clearly.
    r = launch("--spill", "all", "SCRIPT", env={"STITCH_FAKE_CUDA_HOST_NUMA": "0"})
    assert r.returncode != 0 and "spill:all needs host pages" in r.stderr, r.stderr


def test_launcher_conf_option(launch):
    r = launch("--conf", "stitching:True,expandable_segments:True", "SCRIPT", env={"DEV": "1"})
    assert r.returncode == 0, r.stderr
    r = launch("--conf=nope:1", "SCRIPT")
    assert r.returncode == 1 and "unknown key 'nope'" in r.stderr


def test_launcher_translates_oom(launch):
    r = launch("SCRIPT", "--oom")
    assert r.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in r.stderr
    r = launch("--no-oom-translation", "SCRIPT", "--oom")
    assert r.returncode == 1
    assert "stitch.OutOfMemoryError: CUDA out of memory" in r.stderr
    assert "torch.OutOfMemoryError" not in r.stderr


def test_launcher_usage_errors(tmp_path, fake_torch_dir, fake_cuda_env):
    r = run_python(["-m", "stitch.torch", "--help"])
    assert r.returncode == 0 and "torchrun" in r.stdout
    r = run_python(["-m", "stitch.torch"], path=[fake_torch_dir])
    assert r.returncode == 1 and "no script given" in r.stderr
    r = run_python(["-m", "stitch.torch", "--bogus", "x.py"], path=[fake_torch_dir])
    assert r.returncode == 1 and "unknown option --bogus" in r.stderr
    r = run_python(["-m", "stitch.torch", str(tmp_path / "missing.py")], env=fake_cuda_env,
                   path=[fake_torch_dir])
    assert r.returncode == 1 and "can't open file" in r.stderr


def test_launcher_without_torch_fails_clearly(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ImportError('no torch here')\n")
    r = run_python(["-m", "stitch.torch", str(tmp_path / "x.py")], path=[blocker])
    assert r.returncode == 1 and "PyTorch is not installed" in r.stderr


# ---- real PyTorch (GPU machines only) -----------------------------------------------------------

REAL = textwrap.dedent(
    """
    import torch, stitch, stitch.torch
    assert stitch.torch.is_enabled()
    x = torch.randn(1024, 1024, device="cuda")
    y = x @ x
    torch.cuda.synchronize()
    assert stitch.memory_allocated() >= 8 << 20, stitch.memory_allocated()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = y * 2
    y.record_stream(s)
    del x, y, z
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    try:
        with stitch.torch.raise_torch_oom():
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        assert str(e).startswith("CUDA out of memory"), e
        print("TRANSLATED")
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except (RuntimeError, MemoryError) as e:
        print("RAISED", type(e).__name__, str(e).splitlines()[0][:40])
    print("OOMS", stitch.memory_stats()["num_ooms"])
    # PyTorch's memory API answers from stitch.
    assert torch.cuda.memory_allocated() == stitch.memory_allocated()
    assert torch.cuda.memory_stats()["num_ooms"] == 2
    torch.cuda.memory._record_memory_history(max_entries=1000)
    w = torch.randn(256, 256, device="cuda")
    assert "segments" in torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    # A CUDA graph, captured and replayed through stitch's private pools.
    static_x = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_y = static_x @ w
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = static_x @ w + 1
    static_x.copy_(torch.ones_like(static_x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(static_y, torch.ones_like(static_x) @ w + 1)
    del g, static_y
    torch.cuda.empty_cache()
    print("GRAPH ok")
    """
)


def _real_torch_with_cuda():
    if importlib.util.find_spec("torch") is None:
        return False
    r = run_python(["-c", "import torch; print(torch.cuda.is_available())"], env={})
    return r.returncode == 0 and r.stdout.strip() == "True"


@pytest.mark.skipif(not _real_torch_with_cuda(), reason="needs PyTorch with a CUDA device")
def test_real_pytorch_on_a_gpu(tmp_path):
    script = tmp_path / "real.py"
    script.write_text(REAL)
    r = run_python(["-m", "stitch.torch", str(script)], env={"STITCH_ALLOC_CONF": ""},
                   timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TRANSLATED" in r.stdout
    assert "RAISED RuntimeError CUDA out of memory" in r.stdout or "RAISED MemoryError" in r.stdout
    assert "OOMS 2" in r.stdout
    assert "GRAPH ok" in r.stdout


# ---- PyTorch's memory API, served while enabled --------------------------------------------------


def test_pytorchs_memory_api_raises_before_enable_and_answers_after(fake_torch, no_leaks, tmp_path):
    memory_stats = fake_torch.cuda.memory_stats  # imported by name before enable()
    with pytest.raises(RuntimeError, match="does not yet support"):
        memory_stats(0)
    st.enable()
    ptr = stitch.malloc(3 << 20, device=1)
    try:
        for device in (0, 1):
            stats = memory_stats(device)
            assert tuple(stats) == stitch.TORCH_MEMORY_STATS_KEYS  # PyTorch's keys, its order
            assert all(type(v) is int for v in stats.values())
            assert stats == {k: stitch.stat(k, device) for k in stitch.TORCH_MEMORY_STATS_KEYS}
        nested = fake_torch.cuda.memory.memory_stats_as_nested_dict(1)
        assert nested["allocated_bytes"]["all"]["current"] == stitch.memory_allocated(1)
        assert nested["oversize_allocations"]["current"] == 0 and "num_ooms" in nested
        assert fake_torch.cuda.memory_allocated(1) >= 3 << 20
        assert fake_torch.cuda.memory_reserved(1) >= fake_torch.cuda.memory_allocated(1)
        assert fake_torch.cuda.max_memory_allocated(1) >= 3 << 20
    finally:
        stitch.free(ptr, 3 << 20, device=1)
    fake_torch.cuda.reset_peak_memory_stats(1)
    assert fake_torch.cuda.max_memory_allocated(1) == fake_torch.cuda.memory_allocated(1)
    fake_torch.cuda.memory.reset_accumulated_memory_stats(1)
    assert memory_stats(1)["allocation.all.allocated"] == 0
    assert fake_torch.cuda.get_per_process_memory_fraction(0) == 1.0
    stitch.set_memory_fraction(0.5, 0)
    try:
        assert fake_torch.cuda.get_per_process_memory_fraction(0) == pytest.approx(0.5)
    finally:
        stitch.set_memory_fraction(1.0, 0)


@pytest.mark.parametrize("enabled", ["all", True])
def test_pytorchs_snapshot_api_answers_from_stitch(fake_torch, no_leaks, tmp_path, enabled):
    st.enable()
    memory = fake_torch.cuda.memory
    memory._record_memory_history(enabled, max_entries=1000)
    try:
        ptr = stitch.malloc(1 << 20)
        stitch.free(ptr, 1 << 20)
        snap = memory._snapshot()
        memory._dump_snapshot(str(tmp_path / "s.pickle"))
    finally:
        memory._record_memory_history(None if enabled == "all" else False)
    assert {"segments", "device_traces", "allocator_settings"} <= set(snap)
    assert len(snap["device_traces"]) == 2  # every device, as PyTorch's
    assert "alloc" in [e["action"] for e in snap["device_traces"][0]]
    with open(tmp_path / "s.pickle", "rb") as f:
        assert set(pickle.load(f)) == set(snap)
    assert all(not t for t in memory._snapshot()["device_traces"])  # stopped: history discarded


def test_set_allocator_settings_reaches_stitch(fake_torch, monkeypatch):
    """torch.cuda.memory._set_allocator_settings at run time (SGLang and verl toggle
    expandable_segments): stitch's keys reach stitch.configure, PyTorch's pinned-memory keys stay
    PyTorch's, a key stitch cannot apply raises StitchError naming it."""
    seen = []
    monkeypatch.setattr(fake_torch.cuda.memory, "_set_allocator_settings", lambda env: seen.append(env),
                        raising=False)
    st.enable()
    try:
        fake_torch.cuda.memory._set_allocator_settings(
            "expandable_segments:True,pinned_use_cuda_host_register:True,"
            "roundup_power2_divisions:[256:1,512:2,>:4]")
        assert "expandable_segments:True" in stitch.config()
        assert "roundup_power2_divisions" in stitch.config()
        assert seen == ["expandable_segments:True,pinned_use_cuda_host_register:True,"
                        "roundup_power2_divisions:[256:1,512:2,>:4]"]
        fake_torch.cuda.memory._set_allocator_settings("expandable_segments:False")
        assert "expandable_segments:True" not in stitch.config()
        with pytest.raises(StitchError, match="no_such_key"):
            fake_torch.cuda.memory._set_allocator_settings("no_such_key:1")
    finally:
        stitch.configure("expandable_segments:False,roundup_power2_divisions:1")

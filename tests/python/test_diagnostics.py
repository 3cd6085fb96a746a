"""memory_summary(), dump_snapshot() and record_history() (newer C API entry points: skipped
with a reason when the library predates them)."""

import json
import pickle

import pytest

import stitch
from stitch import _lib

from conftest import run_python


def _require(name):
    if not _lib.has(name):
        pytest.skip(f"{stitch.library_path()} does not export {name}")


def test_missing_entry_points_raise_not_implemented(monkeypatch):
    real = _lib.lib()

    class Without:  # the loaded library minus stitch_dump_snapshot
        def __getattr__(self, name):
            if name == "stitch_dump_snapshot":
                raise AttributeError(name)
            return getattr(real, name)

    monkeypatch.setattr(_lib, "_lib", Without())
    with pytest.raises(NotImplementedError, match="does not export stitch_dump_snapshot"):
        stitch.dump_snapshot("/nonexistent/x.pickle")


def test_memory_summary_is_pytorchs_table(no_leaks):
    _require("stitch_memory_summary")
    ptr = stitch.malloc(3 << 20)
    try:
        text = stitch.memory_summary(0)
    finally:
        stitch.free(ptr, 3 << 20)
    assert "memory summary, device ID 0" in text
    for row in ("Allocated memory", "GPU reserved memory", "Allocations", "Oversize allocations"):
        assert row in text, row
    assert "CUDA OOMs:" in text
    assert stitch.memory_summary(1) != text  # device 1's own table
    with pytest.raises(stitch.StitchError, match="invalid device"):
        stitch.memory_summary(9)



def test_memory_summary_abbreviated_leaves_out_the_pool_rows(no_leaks):
    _require("stitch_memory_summary")
    full = stitch.memory_summary(0)
    short = stitch.memory_summary(0, abbreviated=True)
    assert "from large pool" in full and "from small pool" in full
    assert "from large pool" not in short and "from small pool" not in short
    assert "Allocated memory" in short and "GPU reserved memory" in short
    assert stitch.memory_summary(abbreviated=False) == stitch.memory_summary()


def test_dir_shows_the_public_names_only():
    names = dir(stitch)
    for hidden in ("os", "sys", "ctypes", "collections", "Any", "Optional", "Union", "annotations"):
        assert hidden not in names, hidden
    for public in ("malloc", "free", "memory_stats", "memory_summary", "configure", "torch"):
        assert public in names, public

def test_snapshot_pickle_and_json_with_history(tmp_path, no_leaks):
    _require("stitch_dump_snapshot")
    _require("stitch_record_history")
    stitch.record_history(True, max_entries=1000)
    try:
        ptr = stitch.malloc(3 << 20)
        stitch.free(ptr, 3 << 20)
        stitch.dump_snapshot(tmp_path / "s.pickle")
        stitch.dump_snapshot(str(tmp_path / "s.json"))
    finally:
        stitch.record_history(False)
    with open(tmp_path / "s.pickle", "rb") as f:
        snap = pickle.load(f)  # plain builtins only: loads without torch
    assert {"segments", "device_traces"} <= set(snap)
    assert len(snap["device_traces"]) == 2
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert "alloc" in actions
    assert "free_requested" in actions or "free_completed" in actions
    with open(tmp_path / "s.json") as f:
        as_json = json.load(f)
    assert set(as_json) == set(snap)


def test_record_history_off_discards_the_trace(tmp_path, no_leaks):
    _require("stitch_dump_snapshot")
    _require("stitch_record_history")
    stitch.record_history(True)
    ptr = stitch.malloc(4096)
    stitch.free(ptr, 4096)
    stitch.record_history(False)
    stitch.dump_snapshot(tmp_path / "off.pickle")
    with open(tmp_path / "off.pickle", "rb") as f:
        snap = pickle.load(f)
    assert all(not trace for trace in snap["device_traces"])
    with pytest.raises(ValueError):
        stitch.record_history(True, max_entries=-1)


def test_dump_snapshot_error_names_the_path(tmp_path):
    _require("stitch_dump_snapshot")
    with pytest.raises(stitch.StitchError, match="no_such_dir"):
        stitch.dump_snapshot(tmp_path / "no_such_dir" / "s.pickle")


def test_snapshot_settings_are_the_users_configuration(tmp_path):
    # A fresh process: STITCH_ALLOC_CONF, then configure() before and after the first allocation,
    # with the history recorder switched on in between. The snapshot shows the user's settings.
    script = f"""
import pickle, stitch
stitch.configure("max_split_size_mb:64")
stitch.record_history(True, max_entries=1000)
p = stitch.malloc(1 << 20)
stitch.configure("garbage_collection_threshold:0.7,max_split_size_mb:128")
stitch.free(p, 1 << 20)
stitch.dump_snapshot({str(tmp_path / "s.pickle")!r})
print(pickle.load(open({str(tmp_path / "s.pickle")!r}, "rb"))["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"])
"""
    proc = run_python(["-c", script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "backend:sim,sim_capacity_mb:256,max_split_size_mb:128,garbage_collection_threshold:0.7"
    )


def _allocate_here(n):
    return stitch.malloc(n)  # the line the snapshot must name


@pytest.mark.parametrize("stacks", ["python", "all"])
def test_recorded_stacks_have_the_python_frames(tmp_path, no_leaks, stacks):
    stitch.record_history(True, max_entries=100, stacks=stacks)
    try:
        ptr = _allocate_here(1 << 20)
        stitch.free(ptr, 1 << 20)
        stitch.dump_snapshot(tmp_path / "s.pickle")
    finally:
        stitch.record_history(False, stacks="none")
    with open(tmp_path / "s.pickle", "rb") as f:
        snap = pickle.load(f)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["addr"] == ptr]
    assert allocs, "the allocation was not recorded"
    frames = allocs[-1]["frames"]
    here = [fr for fr in frames if fr["name"] == "_allocate_here"]
    assert here, frames
    assert here[0]["filename"] == __file__
    assert here[0]["line"] == _allocate_here.__code__.co_firstlineno + 1
    # Innermost first: the caller (this test) comes after.
    names = [fr["name"] for fr in frames]
    assert names.index("_allocate_here") < names.index(
        "test_recorded_stacks_have_the_python_frames")
    native = [fr for fr in frames if not fr["filename"].endswith(".py")]
    assert bool(native) == (stacks == "all")


def test_record_history_rejects_an_unknown_stack_kind():
    with pytest.raises(ValueError, match="stacks must be one of"):
        stitch.record_history(True, stacks="java")

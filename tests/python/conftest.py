"""Shared setup: the source package (python/) over the libstitch.so named by STITCH_LIBRARY (or
build/libstitch.so), one process-wide allocator on the simulated device for the whole session."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"
# The package under test is the source tree's, even if another stitch is installed.
sys.path.insert(0, str(PYTHON_DIR))

# libstitch builds its allocator at first use from STITCH_ALLOC_CONF plus stitch_configure():
# the outer environment must not leak into it. (Set before the library is loaded.)
os.environ["STITCH_ALLOC_CONF"] = ""
# These tests run stitch.torch against a stand-in torch (fake_torch.py): the pluggable hooks. The
# native backend is tested with the real torch (tests/python_native).
os.environ["STITCH_TORCH_BACKEND"] = "pluggable"

#: The session's allocator: 1 GiB simulated devices, two of them.
SESSION_CONF = "backend:sim,sim_capacity_mb:1024,sim_devices:2"
SIM_CAPACITY = 1024 << 20

import stitch  # noqa: E402
from stitch import _lib  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def sim_allocator():
    """Loads the library (failing, not skipping, when it is missing) and configures the session's
    allocator before anything allocates."""
    path = _lib.library_path()
    stitch.configure(SESSION_CONF)
    return path


@pytest.fixture
def no_leaks():
    """Checks that a test frees what it allocates (the allocator is shared by every test)."""
    before = [stitch.stat("allocation.all.current", d) for d in (0, 1)]
    yield
    after = [stitch.stat("allocation.all.current", d) for d in (0, 1)]
    assert after == before, "the test left allocations behind"


#: The strict fake CUDA driver (tests/fake_cuda) that CTest names; None when it was not built.
FAKE_CUDA = os.environ.get("STITCH_TEST_FAKE_CUDA") or None


@pytest.fixture
def fake_cuda_env():
    """Environment for a subprocess on backend:cuda over the fake driver: two 2 GiB devices."""
    if FAKE_CUDA is None:
        pytest.skip("the fake CUDA driver was not built (STITCH_TEST_FAKE_CUDA is unset)")
    return {
        "STITCH_ALLOC_CONF": "",
        "STITCH_CUDA_DRIVER": FAKE_CUDA,
        "STITCH_FAKE_CUDA_DEVICES": "2",
        "STITCH_FAKE_CUDA_MEMORY_MB": "2048",
    }


def run_python(args, env=None, path=(), cwd=None, timeout=120):
    """Runs `python args...` in a fresh process with the source package importable (after the
    directories in `path`), the session's library and a small simulated device; `env` overrides.
    Returns the CompletedProcess (text; stdout and stderr captured)."""
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(PYTHON_DIR)])
    full["STITCH_LIBRARY"] = _lib.library_path()
    full["STITCH_ALLOC_CONF"] = "backend:sim,sim_capacity_mb:256"
    full.update(env or {})
    return subprocess.run(
        [sys.executable, *args], env=full, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def load_fake_torch():
    """A fresh copy of the stand-in torch (fake_torch.py), as module `torch`."""
    spec = importlib.util.spec_from_file_location("torch", Path(__file__).resolve().parent / "fake_torch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

"""tests/python_native/native_backend_check.py — stitch.torch's native backend with the real torch
(the PyPI CUDA build; no GPU needed): `python -m stitch.torch build-native` builds libstitch_torch
with torch.utils.cpp_extension into a cache and finds it there the second time; enable() installs
it (torch reports the allocator backend "stitch", PyTorch's memory functions are not replaced);
without a compiler enable() falls back to the pluggable hooks with one warning naming what will
not work, and STITCH_TORCH_BACKEND=native turns that into an error.

usage: python native_backend_check.py   (STITCH_LIBRARY names libstitch.so; PYTHONPATH has python/)
exit status 0: every check passed."""

import os
import subprocess
import sys
import tempfile
import time

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what, flush=True)


def run(code, env_extra, timeout=900):
    env = dict(os.environ)
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


ENABLE = """
import warnings, torch, stitch.torch as st
st._ALLOW_SIM_FOR_TESTS = True   # the simulated device: no GPU here
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    try:
        st.enable()
    except Exception as e:
        print("ERROR", type(e).__name__, e)
        raise SystemExit(3)
print("BACKEND", st.backend())
print("TORCH", torch.cuda.memory.get_allocator_backend())
print("REPLACED", torch.cuda.memory_stats.__module__)
for x in w:
    print("WARNING", x.category.__name__, str(x.message).replace(chr(10), " "))
"""

with tempfile.TemporaryDirectory() as cache:
    env = {"STITCH_NATIVE_CACHE": cache, "STITCH_ALLOC_CONF": "backend:sim", "STITCH_TORCH_BACKEND": "auto"}
    # 1. Built ahead, then found in the cache.
    t0 = time.time()
    rc, out, err = run("import sys; from stitch.torch.__main__ import main; main(['build-native'])", env)
    first = time.time() - t0
    path = out.strip().splitlines()[-1] if out.strip() else ""
    check(rc == 0 and os.path.isfile(path) and path.startswith(cache), f"build-native: rc {rc}: {out} {err[-2000:]}")
    t0 = time.time()
    rc, out2, _ = run("from stitch.torch.__main__ import main; main(['build-native'])", env)
    check(rc == 0 and out2.strip().splitlines()[-1] == path, "the second build-native finds the cached library")
    print(f"build-native: {first:.1f} s the first time, {time.time() - t0:.1f} s the second", flush=True)

    # 2. enable() installs it: torch reports stitch's allocator, nothing of torch's is replaced.
    rc, out, err = run(ENABLE, env)
    check(rc == 0, f"enable: rc {rc}: {out} {err[-2000:]}")
    check("BACKEND native" in out, f"native backend: {out}")
    check("TORCH stitch" in out, f"torch's allocator backend is stitch: {out}")
    check("REPLACED torch.cuda.memory" in out, f"torch.cuda.memory_stats is PyTorch's own: {out}")
    check("WARNING" not in out, f"no warning: {out}")

with tempfile.TemporaryDirectory() as cache:
    # 3. No compiler: the pluggable hooks, with one warning naming what will not work.
    env = {"STITCH_NATIVE_CACHE": cache, "STITCH_ALLOC_CONF": "backend:sim", "STITCH_TORCH_BACKEND": "auto",
           "CXX": "/nonexistent/c++", "CC": "/nonexistent/cc"}
    rc, out, err = run(ENABLE, env)
    check(rc == 0, f"fallback enable: rc {rc}: {out} {err[-2000:]}")
    check("BACKEND pluggable" in out, f"pluggable backend: {out}")
    warnings_seen = [l for l in out.splitlines() if l.startswith("WARNING")]
    check(len(warnings_seen) == 1 and "RuntimeWarning" in warnings_seen[0] and "cudnn.benchmark" in warnings_seen[0],
          f"one warning naming what will not work: {warnings_seen}")
    # 4. STITCH_TORCH_BACKEND=native: an error instead.
    env["STITCH_TORCH_BACKEND"] = "native"
    rc, out, err = run(ENABLE, env)
    check(rc == 3 and "STITCH_TORCH_BACKEND=native" in out, f"native required: rc {rc}: {out}")

if failures:
    print(f"native_backend_check: {len(failures)} failed")
    sys.exit(1)
print("native_backend_check: every check passed")

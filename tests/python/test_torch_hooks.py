"""The PyTorch hooks of include/stitch/torch_hooks.h.

PyTorch's CUDAPluggableAllocator stores the alloc hook's address in a
std::function<void*(size_t, int, cudaStream_t)> and calls it from C++; an exception thrown by the
hook unwinds to PyTorch's Python binding. The driver below does exactly that from a separate C++
program (calling a throwing hook through ctypes would abort the interpreter): it proves that the
exception crosses the library boundary with its type (std::bad_alloc for out of memory,
std::runtime_error otherwise) and stitch's report as what().
"""

import os
import shutil
import subprocess

import pytest

from stitch import _lib

DRIVER = r"""
#include <dlfcn.h>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

using MallocFn = void*(std::size_t, int, void*);
using FreeFn = void(void*, std::size_t, int, void*);
using FractionFn = void(double, int);
using RecordFn = void(void*, void*);
using ResetFn = void();
// c10::cuda::MempoolId_t, and cudaStream_t as PyTorch spells them.
struct CUstream_st;
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using BeginFn = void(int, MempoolId, std::function<bool(CUstream_st*)>);
using EndFn = void(int, MempoolId);

static std::string one_line(const char* s) {
  std::string out(s);
  for (char& c : out) if (c == '\n') c = '|';
  return out;
}

template <typename F> static F* sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) { std::printf("missing %s\n", name); std::exit(3); }
  return reinterpret_cast<F*>(p);
}

int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { std::printf("dlopen failed: %s\n", dlerror()); return 2; }
  // As torch/csrc/cuda/CUDAPluggableAllocator.cpp holds them.
  std::function<MallocFn> alloc = sym<MallocFn>(h, "stitch_torch_malloc");
  std::function<FreeFn> release = sym<FreeFn>(h, "stitch_free");
  std::function<FractionFn> fraction = sym<FractionFn>(h, "stitch_torch_set_memory_fraction");
  std::function<RecordFn> record = sym<RecordFn>(h, "stitch_torch_record_stream");
  std::function<ResetFn> reset = sym<ResetFn>(h, "stitch_torch_empty_cache");

  void* p = alloc(4096, 0, nullptr);
  std::printf("alloc %s\n", p ? "ok" : "null");
  std::printf("zero %s\n", alloc(0, 0, nullptr) == nullptr ? "null" : "non-null");
  try {
    alloc(std::size_t(1) << 36, 0, nullptr);
    std::printf("oom no-throw\n");
  } catch (const std::bad_alloc& e) {
    std::printf("oom bad_alloc: %s\n", one_line(e.what()).c_str());
  }
  try {  // what PyTorch's HANDLE_TH_ERRORS sees: a std::exception
    alloc(std::size_t(1) << 36, 0, nullptr);
  } catch (const std::exception& e) {
    std::printf("oom-any exception: %s\n", one_line(e.what()).substr(0, 40).c_str());
  }
  try {
    alloc(4096, 9, nullptr);
    std::printf("device no-throw\n");
  } catch (const std::bad_alloc&) {
    std::printf("device bad_alloc\n");
  } catch (const std::runtime_error& e) {
    std::printf("device runtime_error: %s\n", e.what());
  }
  try {
    fraction(2.0, 0);
    std::printf("fraction no-throw\n");
  } catch (const std::runtime_error& e) {
    std::printf("fraction runtime_error: %s\n", e.what());
  }
  fraction(1.0, 0);
  record(nullptr, nullptr);  // empty tensor: ignored
  record(p, nullptr);
  try {
    record(static_cast<char*>(p) + 512, nullptr);
    std::printf("record no-throw\n");
  } catch (const std::runtime_error& e) {
    std::printf("record runtime_error: %s\n", e.what());
  }
  release(p, 4096, 0, nullptr);
  reset();

  // CUDA graph pools, as CUDAPluggableAllocator::beginAllocateToPool etc. call them.
  std::function<BeginFn> begin = sym<BeginFn>(h, "stitch_torch_begin_allocate_to_pool");
  std::function<EndFn> end = sym<EndFn>(h, "stitch_torch_end_allocate_to_pool");
  std::function<EndFn> release_pool = sym<EndFn>(h, "stitch_torch_release_pool");
  auto* captured = reinterpret_cast<CUstream_st*>(0x70);
  int asked = 0;
  void* before = alloc(1 << 20, 0, captured);
  release(before, 1 << 20, 0, captured);  // cached in the default pool
  begin(0, MempoolId{7, 0}, [&](CUstream_st* s) { ++asked; return s == captured; });
  void* in_pool = alloc(1 << 20, 0, captured);
  void* outside = alloc(1 << 20, 0, reinterpret_cast<void*>(0x80));
  std::printf("pool %s %s\n", in_pool != before ? "own-segment" : "default-block",
              asked > 0 ? "filter-asked" : "filter-unused");
  end(0, MempoolId{7, 0});
  try {
    end(0, MempoolId{7, 0});
    std::printf("end-twice no-throw\n");
  } catch (const std::runtime_error& e) {
    std::printf("end-twice runtime_error: %s\n", e.what());
  }
  release(in_pool, 1 << 20, 0, captured);
  release(outside, 1 << 20, 0, reinterpret_cast<void*>(0x80));
  release_pool(0, MempoolId{7, 0});
  try {
    release_pool(0, MempoolId{7, 0});
    std::printf("release-twice no-throw\n");
  } catch (const std::runtime_error& e) {
    std::printf("release-twice runtime_error: %s\n", e.what());
  }
  std::printf("done\n");
  return 0;
}
"""


def _compiler():
    for c in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


def test_hooks_are_exported():
    for name in _lib.TORCH_HOOKS:
        assert _lib.has(name), name
        assert _lib.hook_address(name) > 0


def test_hooks_throw_through_std_function_like_pytorch_calls_them(tmp_path):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX) to build the hook driver")
    src = tmp_path / "driver.cpp"
    exe = tmp_path / "driver"
    src.write_text(DRIVER)
    build = subprocess.run([cxx, "-std=c++17", "-O1", str(src), "-o", str(exe), "-ldl"],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    env = dict(os.environ, STITCH_ALLOC_CONF="backend:sim,sim_capacity_mb:128")
    r = subprocess.run([str(exe), _lib.library_path()], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert lines["alloc"] == "ok"
    assert lines["zero"] == "null"
    assert lines["oom"].startswith("bad_alloc: CUDA out of memory. Tried to allocate 64.00 GiB")
    assert "Verdict:" in lines["oom"]
    assert lines["oom-any"].startswith("exception: CUDA out of memory")
    assert lines["device"] == "runtime_error: invalid device 9 (backend:sim has 1 device)"
    assert lines["fraction"].startswith("runtime_error: memory fraction must be in [0, 1]")
    assert lines["record"].startswith("runtime_error: record_stream of")
    assert lines["pool"] == "own-segment filter-asked"
    assert lines["end-twice"].startswith("runtime_error: end_allocate_to_pool: no allocation to pool (7, 0)")
    assert lines["release-twice"].startswith("runtime_error: release_pool: device 0 has no pool (7, 0)")
    assert r.stdout.rstrip().endswith("done")

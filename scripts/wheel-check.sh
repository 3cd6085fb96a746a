#!/usr/bin/env bash
# scripts/wheel-check.sh — builds the Python wheel the way a user's `pip install` does, without the
# CUDA toolkit (STITCH_WITH_CUDA=OFF), installs it into a fresh venv and checks it:
#   * the distribution is stitch-allocator (PyPI's "stitch" is another project), import name stitch;
#   * its one libstitch.so links no CUDA library and no libpython, and exports the C API and the
#     PyTorch hooks (graph pools included);
#   * it ships the native PyTorch backend's sources where stitch.torch finds them;
#   * it loads and serves backend:sim, and stitch.torch.enable() refuses backend:sim.
# Needs network access to PyPI (scikit-build-core, and cmake when the system one is older).
# Usage: scripts/wheel-check.sh [source dir: . (default) or python]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="$root/${1:-.}"  # a path for pip (a bare "python" would be a requirement name)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip wheel -q --no-deps -w "$work/dist" -C cmake.define.STITCH_WITH_CUDA=OFF "$src"
wheel="$(ls "$work"/dist/*.whl)"
echo "wheel: $(basename "$wheel")"
case "$(basename "$wheel")" in
  stitch_allocator-*) ;;
  *) echo "FAIL: the wheel is not the stitch-allocator distribution"; exit 1 ;;
esac
"$py" -m pip install -q "$wheel"
lib="$("$py" -c 'import stitch; print(stitch.library_path())')"
case "$lib" in
  "$work"/venv/*) ;;
  *) echo "FAIL: stitch loads $lib, not the installed library"; exit 1 ;;
esac
needed="$(readelf -d "$lib" | awk '/NEEDED/ {print $5}' | tr -d '[]' | tr '\n' ' ')"
echo "libstitch.so needs: $needed"
if echo "$needed" | grep -Eqi 'cuda|nvrtc|python'; then
  echo "FAIL: libstitch.so links a CUDA library or libpython"; exit 1
fi
symbols="$(nm -D --defined-only "$lib")"
for fn in stitch_malloc stitch_free stitch_last_error stitch_clear_error stitch_config stitch_stats \
          stitch_device_count stitch_torch_malloc stitch_torch_begin_allocate_to_pool \
          stitch_torch_end_allocate_to_pool stitch_torch_release_pool; do
  echo "$symbols" | grep -q " T $fn\$" || { echo "FAIL: libstitch.so does not export $fn"; exit 1; }
done
# The native PyTorch backend ships as sources, which stitch.torch finds in the package.
(cd "$work" && "$py" - <<'PY'
from pathlib import Path
import stitch
from stitch.torch import _native
src, include = _native._sources()
pkg = Path(stitch.__file__).resolve().parent
assert src == pkg / "_native_src" / "src" / "torch", src
assert (src / "native_allocator.cpp").is_file() and (include / "stitch" / "torch_native.hpp").is_file()
print("native backend sources:", src)
PY
)
(cd "$work" && STITCH_ALLOC_CONF=backend:sim,sim_capacity_mb:64 "$py" - <<'PY'
import importlib.metadata as md
import stitch
assert md.distribution("stitch-allocator").version == stitch.__version__
p = stitch.malloc(1 << 20)
stitch.free(p, 1 << 20)
assert stitch.memory_stats()["allocation.all.allocated"] == 1
assert "from large pool" not in stitch.memory_summary(abbreviated=True)
print("stitch", stitch.__version__, "from", stitch.library_path(), "serves backend:sim")
PY
)
# enable() refuses backend:sim (PyTorch stood in for by the tests' stand-in, tests/python/fake_torch.py).
mkdir -p "$work/fake/torch"
cp "$root/tests/python/fake_torch.py" "$work/fake/torch/__init__.py"
(cd "$work" && PYTHONPATH="$work/fake" STITCH_ALLOC_CONF=backend:sim "$py" - <<'PY'
import stitch, stitch.torch
try:
    stitch.torch.enable()
    raise SystemExit("FAIL: enable() accepted backend:sim")
except stitch.StitchError as e:
    assert "backend:sim" in str(e), e
    print("enable() refuses backend:sim:", str(e)[:80], "...")
PY
)
echo "wheel-check: ok"

"""The native backend (libstitch_torch): stitch as a full ``CUDAAllocator`` of PyTorch's.

``install()`` loads libstitch_torch, built for the torch that is imported, and makes it PyTorch's
CUDA allocator (``stitch_torch_native_install``). The library is built on first use with
``torch.utils.cpp_extension`` (a C++ compiler and ninja are needed) into a cache keyed by the
torch, stitch and CUDA-header versions and the sources (``~/.cache/stitch/native``, or
``STITCH_NATIVE_CACHE``); ``python -m stitch.torch build-native`` builds it ahead (pip's build
isolation hides torch from an install-time build). ``STITCH_TORCH_NATIVE_LIB`` names a library
built elsewhere (CMake's ``-DSTITCH_WITH_TORCH=ON``). Where it cannot be built, enable() falls
back to the pluggable hooks with one warning (docs/python.md has what each backend supports).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path
from typing import List, Optional

from .. import _lib
from .._lib import StitchError

_loaded: Optional[ctypes.CDLL] = None


def _sources() -> "tuple[Path, Path]":
    """(src/torch, include): shipped in the package (stitch/_native_src) or the checkout's."""
    here = Path(__file__).resolve().parent.parent  # the stitch package
    for root in (here / "_native_src", here.parent.parent):
        if (root / "src" / "torch" / "native_allocator.cpp").is_file() and (root / "include" / "stitch").is_dir():
            return root / "src" / "torch", root / "include"
    raise StitchError("stitch.torch: the sources of libstitch_torch are not in this installation")


def _key(torch, files: List[Path]) -> str:
    import stitch

    h = hashlib.sha256()
    for part in (torch.__version__, str(torch.version.cuda), stitch.__version__, _lib.library_path()):
        h.update(part.encode())
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("STITCH_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "stitch", "native")
    return Path(base)


def build(verbose: bool = False) -> str:
    """Builds libstitch_torch for the imported torch (once: later calls find it); its path."""
    if os.environ.get("STITCH_TORCH_NATIVE_LIB"):
        return os.environ["STITCH_TORCH_NATIVE_LIB"]
    import torch
    from torch.utils import cpp_extension

    if not torch.version.cuda:
        raise StitchError(f"stitch.torch: torch {torch.__version__} is not a CUDA build")
    src, include = _sources()
    files = sorted(src.glob("*.cpp")) + sorted(src.glob("*.hpp")) + sorted((include / "stitch").glob("*"))
    out = cache_dir() / _key(torch, files)
    lib = out / "stitch_torch_native.so"
    if lib.is_file():
        return str(lib)
    out.mkdir(parents=True, exist_ok=True)
    libdir = str(Path(_lib.library_path()).parent)
    cuda_include = []
    nvidia = Path(torch.__file__).resolve().parent.parent / "nvidia"
    for header in sorted(nvidia.glob("*/include/cuda_runtime_api.h")):
        cuda_include = [str(header.parent)]
    cudart = sorted(nvidia.glob("*/lib/libcudart.so.*"))
    ldflags = [f"-L{libdir}", "-lstitch", f"-Wl,-rpath,{libdir}"]
    if cudart:
        ldflags += [str(cudart[-1]), f"-Wl,-rpath,{cudart[-1].parent}"]
    torch_lib = str(Path(torch.__file__).resolve().parent / "lib")
    ldflags += [f"-L{torch_lib}", "-lc10_cuda", f"-Wl,-rpath,{torch_lib}"]
    # The layer's own headers are included as "torch/<file>.hpp": src/ goes on the path.
    cpp_extension.load(
        name="stitch_torch_native",
        sources=[str(f) for f in sorted(src.glob("*.cpp"))],
        extra_include_paths=[str(src.parent), str(include)] + cuda_include,
        extra_cflags=["-O2", "-std=c++20"],
        extra_ldflags=ldflags,
        build_directory=str(out),
        is_python_module=False,
        with_cuda=False,
        verbose=verbose,
    )
    if not lib.is_file():
        raise StitchError(f"stitch.torch: building libstitch_torch left no {lib}")
    return str(lib)


def install(verbose: bool = False) -> str:
    """Builds (if needed) and loads libstitch_torch, and makes it PyTorch's CUDA allocator."""
    global _loaded
    path = build(verbose)
    if _loaded is None:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        lib.stitch_torch_native_install.restype = ctypes.c_int
        lib.stitch_torch_native_error.restype = ctypes.c_char_p
        _loaded = lib
    if _loaded.stitch_torch_native_install() != 0:
        raise StitchError("stitch.torch: the native backend could not be installed: "
                          + _loaded.stitch_torch_native_error().decode(errors="replace"))
    return path

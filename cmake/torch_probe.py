# cmake/torch_probe.py — what cmake/StitchTorch.cmake needs to build against this interpreter's
# torch: one key=value per line. Exits non-zero (the reason on stderr) without torch.
import glob
import os
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means no usable torch
    sys.exit(f"cannot import torch: {e}")

root = os.path.dirname(torch.__file__)
site = os.path.dirname(root)
include = [os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include")]
cuda_include = ""
cudart = ""
# The CUDA runtime PyPI's torch depends on (nvidia/cu13/... or nvidia/cuda_runtime/...).
for inc in sorted(glob.glob(os.path.join(site, "nvidia", "*", "include", "cuda_runtime_api.h"))):
    cuda_include = os.path.dirname(inc)
for lib in sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so.*"))):
    cudart = lib
print(f"version={torch.__version__}")
print(f"cuda={torch.version.cuda or ''}")
print(f"abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print("include=" + ",".join(include))
print(f"lib={os.path.join(root, 'lib')}")
print(f"cuda_include={cuda_include}")
print(f"cudart={cudart}")

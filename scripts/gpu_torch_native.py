"""GPU check step `native-backend` (scripts/gpu-check.sh, docs/gpu-check.md): what only a GPU shows
of the native PyTorch backend (libstitch_torch), each against PyTorch's own allocator.

Run once per allocator and case in a fresh process (an allocator is chosen before CUDA
initialises):
    python3 scripts/gpu_torch_native.py native|stitch cudnn|compile|oom|nccl|ipc|ipc_exp
and it prints one line `RESULT {json}`:
  cudnn    a convnet trained a few steps with torch.backends.cudnn.benchmark = True over three
           input shapes (cuDNN sizes its workspaces with cacheInfo); the losses
  compile  torch.compile(mode="reduce-overhead") over a model whose path diverges with its input
           (cudagraph trees checkpoint and restore their pool); the outputs' sums
  oom      a request larger than the device caught with `except torch.OutOfMemoryError`
  nccl     ProcessGroupNCCL with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1, world size 1
           (the hook's plumbing: registration on segment allocation); an all-reduce's result
  ipc      a tensor sent through torch.multiprocessing (spawn) to a process on the other allocator
           (stitch -> PyTorch's, or PyTorch's -> stitch), which reads it, adds 1 in place and sends
           a tensor of its own back: both ways in one run ('c' handles: cudaMalloc'd segments)
  ipc_exp  the same with expandable segments on both sides ('e' handles: pages shared by file
           descriptor, which needs pidfd_getfd rights over the other process)
The `stitch` runs must report backend "native" (the pluggable fallback does not count), and their
results must equal the `native` runs' (gpu-check.sh compares them).
"""

import json
import os
import sys


def _enable_stitch() -> str:
    import stitch.torch

    os.environ.setdefault("STITCH_TORCH_BACKEND", "native")
    stitch.torch.enable()
    return stitch.torch.backend()


def _ipc_peer(allocator, q_in, q_out):
    """The other process of the ipc cases: on `allocator`, reads the tensor it gets, adds 1 to it
    in place, sends back a tensor of its own, and keeps it alive until told."""
    import torch

    backend = _enable_stitch() if allocator == "stitch" else None
    t = q_in.get()
    seen = t.sum().item()
    t.add_(1)
    torch.cuda.synchronize()
    mine = torch.full((1 << 20,), 3.0, device="cuda")
    q_out.put({"sum": seen, "backend": backend, "tensor": mine})
    q_in.get()


def main() -> int:
    allocator = sys.argv[1]
    case = sys.argv[2]
    if case == "nccl":
        os.environ["TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"] = "1"
    if case == "ipc_exp":  # both sides, and the peer inherits it
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        os.environ["STITCH_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    out = {"allocator": allocator, "case": case}
    if allocator == "stitch":
        out["backend"] = _enable_stitch()
        out["torch_backend"] = torch.cuda.memory.get_allocator_backend()
    torch.manual_seed(0)

    if case == "cudnn":
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = True
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        losses = []
        for size in (32, 64, 48, 32):
            x = torch.randn(16, 3, size, size, device="cuda")
            y = torch.randint(0, 10, (16,), device="cuda")
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(round(loss.item(), 4))
        out["losses"] = losses
    elif case == "compile":
        lin = torch.nn.Linear(256, 256).cuda()

        def step(x):
            y = lin(x)
            if y.sum() > 0:  # the path diverges with the input: a graph break, two paths
                return torch.relu(y) * 2
            return torch.tanh(y) - 1

        compiled = torch.compile(step, mode="reduce-overhead")
        sums = []
        with torch.no_grad():
            for k in range(8):
                x = torch.randn(64, 256, device="cuda") * (1 if k % 3 else -1) + (0.5 if k % 2 else -0.5)
                sums.append(round(compiled(x).sum().item(), 2))
        out["sums"] = sums
    elif case == "oom":
        total = torch.cuda.get_device_properties(0).total_memory
        try:
            torch.empty(total * 2, dtype=torch.uint8, device="cuda")
            out["caught"] = "nothing raised"
        except torch.OutOfMemoryError as e:
            out["caught"] = "torch.OutOfMemoryError"
            out["message_ok"] = "out of memory" in str(e)
        except Exception as e:  # noqa: BLE001 - the wrong type is the failure reported
            out["caught"] = type(e).__name__
        x = torch.ones(1024, device="cuda")  # the allocator works on after it
        out["after"] = x.sum().item()
    elif case == "nccl":
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl", rank=0, world_size=1)
        t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        dist.all_reduce(t)
        big = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")  # a new segment, registered
        dist.all_reduce(big)
        out["sum"] = t.sum().item() + big.sum().item()
        dist.destroy_process_group()
    elif case in ("ipc", "ipc_exp"):
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        q_in, q_out = ctx.Queue(), ctx.Queue()
        peer = ctx.Process(target=_ipc_peer, args=("native" if allocator == "stitch" else "stitch", q_in, q_out))
        peer.start()
        t = torch.arange(1 << 22, dtype=torch.float32, device="cuda")  # 16 MiB
        torch.cuda.synchronize()
        q_in.put(t)
        got = q_out.get(timeout=120)
        torch.cuda.synchronize()
        out["peer_saw"] = got["sum"]
        out["after_peer_added"] = t[:3].tolist()
        out["from_peer"] = got["tensor"].sum().item()
        out["stitch_side_backend"] = out.get("backend") if allocator == "stitch" else got["backend"]
        out.pop("backend", None)
        out.pop("torch_backend", None)
        del got
        q_in.put("done")
        peer.join(60)
        out["peer_exit"] = peer.exitcode
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

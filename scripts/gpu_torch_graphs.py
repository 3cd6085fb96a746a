"""GPU check step `graphs-in-pytorch` (scripts/gpu-check.sh, docs/gpu-check.md): CUDA graphs and
PyTorch's memory API through stitch, compared with the native allocator.

Run once per allocator in a fresh process (an allocator is chosen before CUDA initialises):
    python3 scripts/gpu_torch_graphs.py native|stitch
It captures and replays a CUDA graph (torch.cuda.graph), runs torch.compile(mode=
"reduce-overhead") on a small model (CUDA graphs under the hood), reads torch.cuda.memory_stats()
and memory._snapshot(), and prints one line `RESULT {json}` with checksums that must be equal for
both allocators, plus what the memory API reported.
"""

import json
import sys

import torch


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "native"
    if mode == "stitch":
        import stitch.torch

        stitch.torch.enable()
    torch.manual_seed(0)
    out = {"mode": mode}

    # A graph captured on a side stream and replayed with new input.
    w = torch.randn(512, 512, device="cuda")
    static_x = torch.randn(512, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_y = torch.relu(static_x @ w)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = torch.relu(static_x @ w) + 1
    sums = []
    for k in range(3):
        static_x.copy_(torch.full_like(static_x, 0.01 * (k + 1)))
        g.replay()
        torch.cuda.synchronize()
        sums.append(round(float(static_y.sum()), 3))
    out["graph_sums"] = sums
    del g, static_y

    # torch.compile(mode="reduce-overhead") records CUDA graphs through the same pool hooks.
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(32, 256, device="cuda")
    with torch.no_grad():
        for _ in range(4):
            y = compiled(x)
    torch.cuda.synchronize()
    out["compiled_sum"] = round(float(y.sum()), 3)

    # PyTorch's memory API, answered by whichever allocator runs.
    stats = torch.cuda.memory_stats()
    out["stats_keys"] = len(stats)
    out["allocated_ok"] = torch.cuda.memory_allocated() == stats["allocated_bytes.all.current"] > 0
    torch.cuda.memory._record_memory_history(max_entries=1000)
    tmp = torch.empty(1 << 20, device="cuda")
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    out["snapshot_segments"] = len(snap["segments"]) > 0
    del tmp
    torch.cuda.empty_cache()
    print("RESULT " + json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

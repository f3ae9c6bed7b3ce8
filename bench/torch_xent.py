"""bench/torch_xent.py: PyTorch's cross-entropy, timed, for bench/kernels' comparison.

F.cross_entropy over logits [T, V] (random, requires_grad) and random targets: forward and
backward (the logits' gradient) together, as tpk's fused xent_fused computes them; median over
ITERS after 3 warm-ups (CUDA events on a GPU). THREADS > 0 sets torch.set_num_threads. Prints
"ms".

    python3 bench/torch_xent.py T V f32|bf16 cpu|cuda ITERS THREADS
"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main():
    T, V = int(sys.argv[1]), int(sys.argv[2])
    dtype = torch.bfloat16 if sys.argv[3] == "bf16" else torch.float32
    dev, iters, threads = torch.device(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    if threads > 0:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    z = torch.randn(T, V, device=dev, dtype=dtype, requires_grad=True)
    y = torch.randint(0, V, (T,), device=dev)
    times = []
    for i in range(3 + iters):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        F.cross_entropy(z, y).backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(1e3 * (time.perf_counter() - t0))
        z.grad = None
    print("%.4f" % statistics.median(times))


if __name__ == "__main__":
    main()

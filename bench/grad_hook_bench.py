"""What a backward pass costs the contract tier's recorder to capture: the
gradient each backward adds to .grad (c_b), by the two hooks PyTorch 2
offers, on the contract examples' models (examples/contract/models.py).

  pre   Tensor.register_hook (what ContractRecorder uses): the hook receives
        the incoming gradient, which is c_b itself; one copy into the
        float64 row.
  post  Tensor.register_post_accumulate_grad_hook: the hook sees .grad after
        accumulation, so c_b = .grad - (.grad before this backward); the
        previous .grad must be kept (a float64 copy per parameter, updated
        every backward) and subtracted.
  none  no hook: the backward alone.

Each case runs K backward passes per window (no optimizer step, so .grad
accumulates as in a window), REPEATS times, and reports the least CPU time
(time.process_time) per backward pass and the hooks' overhead over none.
One thread.

    OPENBLAS_NUM_THREADS=1 python bench/grad_hook_bench.py [--repeats 7] [--windows 20]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "contract"))
import models  # noqa: E402


def capture(model, mode):
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    row = torch.zeros(n, dtype=torch.float64)
    prev = torch.zeros(n, dtype=torch.float64)
    slices, at = [], 0
    for p in params:
        slices.append((at, at + p.numel()))
        at += p.numel()
    hooks = []
    for p, (a, b) in zip(params, slices):
        if mode == "pre":
            def hook(grad, a=a, b=b):
                row[a:b].copy_(grad.detach().reshape(-1))
            hooks.append(p.register_hook(hook))
        elif mode == "post":
            def hook(param, a=a, b=b):
                now = param.grad.detach().reshape(-1).double()
                row[a:b].copy_(now).sub_(prev[a:b])
                prev[a:b].copy_(now)
            hooks.append(p.register_post_accumulate_grad_hook(hook))
    return hooks, row, prev


def run(kind, mode, windows, K):
    torch.manual_seed(0)
    if kind == "gpt":
        model, data, loss = models.TinyGPT(), models.gpt_data(n=4 * K), models.gpt_summed_loss
    else:
        model, data, loss = models.TinyCNN(), models.cnn_data(n=4 * K), models.cnn_summed_loss
    batches = [tuple(torch.stack(col) for col in zip(*data[i:i + 4])) for i in range(0, 4 * K, 4)]
    hooks, row, prev = capture(model, mode)
    t0 = time.process_time()
    for _ in range(windows):
        for b in batches:
            loss(model, b).backward()
        model.zero_grad(set_to_none=False)
        prev.zero_()
    dt = time.process_time() - t0
    for h in hooks:
        h.remove()
    return dt / (windows * K)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--K", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("model  hook   us/backward (least of %d)   overhead over none" % a.repeats)
    for kind in ("gpt", "cnn"):
        best = {}
        for mode in ("none", "pre", "post"):
            run(kind, mode, 2, a.K)  # warm-up
        for _ in range(a.repeats):
            for mode in ("none", "pre", "post"):
                t = run(kind, mode, a.windows, a.K)
                best[mode] = min(best.get(mode, t), t)
        for mode in ("none", "pre", "post"):
            over = "" if mode == "none" else "%+.1f us (%.0f%%)" % (
                1e6 * (best[mode] - best["none"]), 100 * (best[mode] / best["none"] - 1))
            print("%-6s %-6s %10.1f                  %s" % (kind, mode, 1e6 * best[mode], over))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The device engine's benchmark step, in PyTorch, for the side-by-side bench.

One training step of an MLP d_in-hidden-d_out (default 256-512-10; tanh,
cross-entropy) on a batch (default 32), Adam, float32, single thread:
zero_grad, forward, backward, step.  The same work as
bench/device_bench.cpp's BM_EmulatedAdamStep / BM_EmulatedStepSize.

    pytorch_step.py [SECONDS [D_IN HIDDEN D_OUT BATCH]]

Prints one line: "pytorch_steps_per_s <value>".
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    d_in, hidden, d_out, batch = (int(a) for a in sys.argv[2:6]) \
        if len(sys.argv) > 5 else (256, 512, 10, 32)
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Tanh(),
                                torch.nn.Linear(hidden, d_out))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.rand(batch, d_in) * 2 - 1
    y = torch.randint(0, d_out, (batch,))

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(50):
        step()
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    # CPU time of this process (one thread): on a shared machine the wall
    # clock also counts other people's work; device_bench reports CPU time.
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        for _ in range(20):
            step()
        n += 20
    print(f"pytorch_steps_per_s {n / (time.process_time() - t0):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

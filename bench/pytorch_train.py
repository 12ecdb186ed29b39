#!/usr/bin/python3
"""The trainer's own PyTorch run of an exported bundle, without the
recorder: the correct loop of examples/oracle/train_correct.py,
single-threaded.  For bench/certify_curve.sh.

    pytorch_train.py BUNDLE

Prints one line: "pytorch_train_s <seconds>" (the training loop only).
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

from accumcheck_torch import load_bundle  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    bundle = load_bundle(sys.argv[1])
    model = bundle.model()
    optimizer = bundle.optimizer(model)
    scheduler = bundle.scheduler(optimizer)
    K = bundle.accumulation
    epochs = [bundle.micro_batches(e) for e in range(bundle.epochs)]
    t0 = time.process_time()  # CPU time (one thread)
    for batches in epochs:
        for i, (x, y) in enumerate(batches):
            window = batches[(i // K) * K:(i // K) * K + K]
            window_items = sum(bundle.items(wy) for _, wy in window)
            bundle.window_loss(model(x), y, window_items).backward()
            if (i + 1) % K == 0 or i + 1 == len(batches):
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    print(f"pytorch_train_s {time.process_time() - t0:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A correct loop in the common import style (accumcheck example):
`from torch.nn.utils import clip_grad_norm_` at the top of the file, long
before the recorder exists, and the Transformers `num_items_in_batch`
normalization (sum of the item losses / the window's item count).

    python3 train_clip_by_name.py --bundle BUNDLE --out TRACE
"""

from torch.nn.utils import clip_grad_norm_

from accumcheck_torch import example_session, exit_on_refusal


def main():
    bundle, model, optimizer, scheduler, recorder = example_session(__doc__)

    for epoch in range(bundle.epochs):
        batches = bundle.micro_batches(epoch)
        windows = [batches[i:i + bundle.accumulation]
                   for i in range(0, len(batches), bundle.accumulation)]
        for window in windows:
            num_items_in_batch = sum(bundle.items(y) for _, y in window)
            for x, y in window:
                loss = bundle.window_loss(model(x), y, num_items_in_batch)
                loss.backward()
            if bundle.clip:
                clip_grad_norm_(model.parameters(), bundle.max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()

    recorder.close()


if __name__ == "__main__":
    exit_on_refusal(main)

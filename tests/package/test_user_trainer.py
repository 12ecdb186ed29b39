"""The user's CI test: pytest with accumcheck's plugin (the `accumcheck`
fixture comes with `pip install accumcheck`; nothing is imported for it)."""
import pytest

from user_trainer import build, items, summed_loss, train


def record(accumcheck, mistake):
    model, optimizer, loader = build()
    rec = accumcheck.contract_recorder(model, optimizer, loss_fn=summed_loss, count_fn=items,
                                       accumulation=4, quiet=True)
    batches = rec.watch(loader)
    train(model, optimizer, loader, batches=batches, mistake=mistake)
    rec.close()


def test_trainer_accumulates_like_the_large_batch(accumcheck):
    record(accumcheck, mistake=False)
    accumcheck.certify()


def test_mistaken_trainer_is_caught_with_its_diagnosis(accumcheck):
    record(accumcheck, mistake=True)
    with pytest.raises(AssertionError) as failure:
        accumcheck.certify()
    message = str(failure.value)
    assert "FAIL" in message
    assert "partial-cycle-scale-by-k" in message

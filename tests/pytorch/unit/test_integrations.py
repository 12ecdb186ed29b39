"""integrations/_common.py: the semantics computed from what the user
configured, the standard heads, and the refusals (no framework needed)."""

import sys

import pytest
import torch

from accumcheck_torch import Refused
from accumcheck_torch.integrations._common import (Semantics, causal_lm_items, causal_lm_loss,
                                                   standard_head)


def test_steps_count_the_partial_window():
    # 22 samples, micro-batches of 2: 11 per epoch, windows 4, 4, 3.
    s = Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=2)
    assert (s.micro_per_epoch, s.steps_per_epoch, s.steps) == (11, 3, 6)
    # Two ranks: each draws ceil(22 / 2) = 11 samples, 6 micro-batches.
    d = Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=1, world=2)
    assert (d.rank_samples, d.micro_per_epoch, d.steps) == (11, 6, 2)
    assert Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=2, max_steps=5).steps == 5


def test_schedule_warmup_ratio_over_the_steps():
    s = Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=2, lr=1e-3,
                  schedule="linear", warmup_ratio=0.34, clip=1.0)
    assert s.recorder_kwargs() == {"accumulation": 4, "lr": 1e-3, "clip": 1.0,
                                   "schedule": {"kind": "linear", "warmup": 3, "total": 6,
                                                "warmup_ratio": 0.34}}
    # Warmup steps given: no ratio (a trainer's other horizon keeps them).
    assert "warmup_ratio" not in Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=2,
                                           schedule="linear", warmup=2).schedule()
    assert Semantics(accumulation=1, micro_batch=1, dataset=1, epochs=1, clip=0).clip is None


@pytest.mark.parametrize("kw, says", [
    ({"epochs": 1.5}, "whole number of epochs"),
    ({"epochs": 1, "schedule": "polynomial"}, "lr schedule"),
    ({"epochs": 1, "dataset": 1, "drop_last": True}, "never steps"),
    ({"epochs": 1, "dataset": 0}, "empty"),
])
def test_refusals(kw, says, capsys):
    args = dict(accumulation=4, micro_batch=2, dataset=22)
    args.update(kw)
    with pytest.raises(Refused) as e:
        Semantics(**args)
    assert e.value.code == 2 and says in str(e.value)


def test_schedule_refusal_names_only_options_that_exist():
    # Issue 44: the refusal told users to pass accept_lr=False, which no
    # integration takes.  Every `name=` it names is a parameter of the
    # integrations' Semantics or of the ContractRecorder it points to.
    import inspect
    import re

    from accumcheck_torch import ContractRecorder

    with pytest.raises(Refused) as e:
        Semantics(accumulation=4, micro_batch=2, dataset=22, epochs=1, schedule="polynomial")
    msg = str(e.value)
    exist = (set(inspect.signature(Semantics.__init__).parameters)
             | set(inspect.signature(ContractRecorder.__init__).parameters))
    named = re.findall(r"\b(\w+)=", msg)
    assert named and all(n in exist for n in named), (named, msg)
    assert "ContractRecorder" in msg and "'linear'" in msg


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 8)

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.emb(input_ids)}


def test_causal_lm_loss_sums_the_shifted_label_tokens():
    torch.manual_seed(0)
    m = Head()
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    labels = ids.masked_fill(ids == 0, -100)
    batch = {"input_ids": ids, "labels": labels}
    # Position 0 predicts nothing: 2 + 1 label tokens carry a loss.
    assert causal_lm_items(batch) == 3
    logits = m(ids)["logits"]
    want = sum(torch.nn.functional.cross_entropy(logits[b, i], labels[b, i + 1], reduction="sum")
               for b, i in [(0, 0), (0, 1), (1, 0)])
    assert torch.allclose(causal_lm_loss(m, batch), want)


def test_standard_head_refuses_a_model_it_cannot_read():
    with pytest.raises(Refused) as e:
        standard_head(Head())
    assert "head='causal_lm'" in str(e.value) and "loss_fn=" in str(e.value)
    assert standard_head(Head(), "causal_lm")[2] == "tokens"


def test_importing_the_package_imports_no_framework():
    import accumcheck_torch  # noqa: F401
    import accumcheck_torch.integrations  # noqa: F401
    import accumcheck_torch.integrations._common  # noqa: F401
    assert not {"transformers", "accelerate", "lightning"} & set(sys.modules)

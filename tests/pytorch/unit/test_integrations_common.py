"""The framework integrations' shared pieces that need no framework:
standard_head_of (the head a batch's labels say), and the contract
recorder's optimizer.step(closure) (Lightning's automatic optimization runs
the window's last forward and backward inside it)."""
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F

from accumcheck_torch import ContractRecorder
from accumcheck_torch.integrations import _common
from accumcheck_torch.trace import Refused


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


def test_standard_head_of_a_pair_with_sample_labels_is_classification():
    torch.manual_seed(0)
    m, x, y = Net(), torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])
    loss_fn, count_fn, items = _common.standard_head_of(m, (x, y))
    assert items == "samples" and count_fn((x, y)) == 5
    assert torch.allclose(loss_fn(m, (x, y)), F.cross_entropy(m(x), y, reduction="sum"))


def test_standard_head_of_token_labels_is_causal_lm_counting_unpadded_shifted_tokens():
    labels = torch.tensor([[5, 6, 7, -100], [1, 2, -100, -100]])
    loss_fn, count_fn, items = _common.standard_head_of(Net(), {"input_ids": labels, "labels": labels})
    assert items == "tokens" and count_fn({"labels": labels}) == 3


def test_a_batch_without_labels_is_refused_naming_what_to_pass():
    with pytest.raises(Refused, match="loss_fn="):
        _common.standard_head_of(Net(), (torch.zeros(2, 4), torch.zeros(2), torch.zeros(2)))


@pytest.mark.calls_accumcheck
def test_step_with_a_closure_is_fitted_on_the_gradient_it_consumes(tmp_path):
    binary = os.environ.get("ACCUMCHECK_BIN")
    if not binary:
        pytest.skip("ACCUMCHECK_BIN is not set (CTest sets it to the accumcheck binary)")
    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    data = [(torch.randn(4, 4), torch.randint(0, 3, (4,))) for _ in range(8)]
    K = 2
    rec = ContractRecorder(m, opt, *_common.standard_head_of(m, data[0])[:2], accumulation=K,
                           out=str(tmp_path / "trace"))
    for i, (x, y) in enumerate(rec.watch(data)):
        def closure(x=x, y=y):
            loss = F.cross_entropy(m(x), y) / K
            loss.backward()
            return loss
        if (i + 1) % K:
            closure()
        else:
            opt.step(closure)  # the window's last backward runs inside the step
            opt.zero_grad()
    rec.close()
    assert "step" not in opt.__dict__
    p = subprocess.run([binary, "certify", "--contract", "--trace", str(tmp_path / "trace")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PASS (contract tier): 4 steps" in p.stdout


def test_causal_lm_unshifted_count_goes_with_the_causal_lm_head_only():
    """The count over the unshifted labels (token-count-unshifted-labels'):
    a prompt masked with -100 leaves position 0 uncounted (issue 44)."""
    labels = torch.tensor([[-100, -100, 5, 6, -100],   # prompt masked: 2 shifted, 2 unshifted
                           [7, 8, 9, -100, -100]])     # no prompt: 2 shifted, 3 unshifted
    batch = {"labels": labels}
    assert _common.causal_lm_items(batch) == 4
    assert _common.causal_lm_unshifted_items(batch) == 5
    assert _common.unshifted_count_fn(_common.causal_lm_items) is _common.causal_lm_unshifted_items
    assert _common.unshifted_count_fn(_common.classification_items) is None

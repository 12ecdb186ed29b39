"""The coordinates the contract recorder keeps of every gradient (capture).

A recorder that copied whole gradients would need K+2 parameter-sized
vectors per step; this one keeps, of every parameter tensor, a fixed
sample of at most `per_tensor` coordinates (all of a smaller tensor),
drawn once from a recorded seed, so that a step costs O(K * d) numbers
with d = sum_i min(n_i, per_tensor), whatever the model's size.

Why the sample cannot pass a wrong run (docs/tiers.md "What the recorder
keeps"): every catalog pitfall scales or moves a whole micro-batch's
gradient, which changes every coordinate of every tensor it reaches, and
every tensor has sampled coordinates; a change confined to a fraction f
of one tensor's coordinates escapes a sample of m of them with
probability (1 - f)^m (m = 1024: 3.4e-5 at f = 1%, 1.5e-23 at f = 5%).
The seed is in meta.csv, so a verdict reproduces.
"""

import random

import torch

# The default number of coordinates kept per parameter tensor, and the
# default seed (both written to meta.csv: sample_per_tensor, sample_seed).
PER_TENSOR = 1024
SEED = 20240607


class Coordinates:
    """Per tensor i: the sorted flat indices kept (None: all of it), the
    slice of the recorder's rows they occupy, and d (the rows' length)."""

    def __init__(self, tensors, per_tensor=PER_TENSOR, seed=SEED, sampled=True):
        self.per_tensor, self.seed, self.sampled = int(per_tensor), int(seed), bool(sampled)
        if self.per_tensor < 1:
            raise ValueError("per_tensor must be >= 1, got %r" % (per_tensor,))
        self.index, self.slices, at = [], [], 0
        for i, t in enumerate(tensors):
            n = t.numel()
            if not self.sampled or n <= self.per_tensor:
                self.index.append(None)
                k = n
            else:
                # One generator per tensor: the sample of tensor i does not
                # depend on the others' sizes.
                pick = random.Random(self.seed * 1000003 + i).sample(range(n), self.per_tensor)
                pick.sort()
                self.index.append(torch.tensor(pick, dtype=torch.long, device=t.device))
                k = self.per_tensor
            self.slices.append((at, at + k))
            at += k
        self.d = at
        self.n = sum(t.numel() for t in tensors)

    def take(self, i, t):
        """Tensor i's kept coordinates of t (shaped like tensor i), flat, in
        t's dtype and on t's device: nothing parameter-sized is copied."""
        flat = t.detach().reshape(-1)
        idx = self.index[i]
        if idx is None:
            return flat
        if idx.device != flat.device:
            idx = self.index[i] = idx.to(flat.device)
        return flat.index_select(0, idx)

    def meta(self):
        """meta.csv's fields: how many coordinates a row holds, of how many."""
        return [("coordinates", str(self.d)), ("sample_per_tensor", str(self.per_tensor)),
                ("sample_seed", str(self.seed))] if self.d < self.n else []


def sumsq64_as_clip(tensors, foreach=None):
    """sumsq64 of each tensor, every norm taken exactly as
    clip_grad_norm_(..., foreach=foreach) takes it: grouped by device and
    dtype, torch._foreach_norm over a group where the clip uses it (on
    CUDA a fused kernel whose rounding is not vector_norm's; on the CPU the
    same vector_norm per tensor), vector_norm elsewhere; a bfloat16 or
    float16 tensor's accumulated in float64.  One transfer of a group's
    norms to the host (its number of tensors), none per tensor."""
    from torch.utils._foreach_utils import (_device_has_foreach_support,
                                            _group_tensors_by_device_and_dtype,
                                            _has_foreach_support)

    out = [0.0] * len(tensors)
    if not tensors:
        return out
    groups = _group_tensors_by_device_and_dtype([[t.detach() for t in tensors]],
                                                with_indices=True)
    for (device, dtype), ([ts], where) in groups.items():
        if dtype in (torch.bfloat16, torch.float16):
            norms = [torch.linalg.vector_norm(t.reshape(-1), dtype=torch.float64) for t in ts]
        elif (foreach is None and _has_foreach_support(ts, device)) or \
                (foreach and _device_has_foreach_support(device)):
            norms = torch._foreach_norm(ts, 2.0)
        else:
            norms = [torch.linalg.vector_norm(t, 2.0) for t in ts]
        for i, v in zip(where, torch.stack(norms).tolist()):
            out[i] = float(v) ** 2
    return out


def sumsq64(t):
    """The square of t's norm as a float64 number: a float32 (or float64)
    tensor's norm taken as clip_grad_norm_ takes it on the CPU
    (torch.linalg.vector_norm, the same kernel on the same tensor: the same
    bits), squared in float64, so no float64 copy of a whole tensor is
    made; a bfloat16 or float16 one's accumulated in float64."""
    flat = t.detach().reshape(-1)
    if flat.dtype in (torch.bfloat16, torch.float16):
        return float(torch.linalg.vector_norm(flat, dtype=torch.float64)) ** 2
    return float(torch.linalg.vector_norm(flat)) ** 2

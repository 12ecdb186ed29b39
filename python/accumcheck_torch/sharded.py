"""What both FSDP recorders (fsdp.py) share: each weight read at the
forward's outputs with no copy of the model and nothing recomputed
(_FromOutputs), each rank's step fit on its own shard of the consumed
gradient (_ShardFit), and a parameter's whole size where only its shard
exists (_Whole)."""

import warnings

import torch
import torch.distributed as dist

from .batches import _replaced
from .guard import _never_raises
from .recompute import _rng_states, _set_rng_states


class _Whole:
    """A parameter's whole size where only its shard exists (FSDP1's
    original parameters): what sample.Coordinates reads of a tensor."""

    def __init__(self, numel):
        self._numel, self.device = int(numel), torch.device("cpu")

    def numel(self):
        return self._numel


class _FromOutputs:
    """What the FSDP recorders share: no replica and no copy of the model.
    Each backward's weight is read at its forward's outputs (capture.py
    _take_from_forward: u_b = w_b s_j), s_j taken through the loss alone
    on detached stand-ins of the outputs (so none of FSDP's hooks on them
    fires); the premise that the loss reaches the parameters only through
    the outputs is checked on the loss's graph (no parameter in it) at
    every micro-batch, and on the parameters (_calibration_backward: the
    gradient of s_j carried back through your graph against c_b / w_b)
    on the first forward and then on the first forward after every
    calibrate_every-th backward.  Which forward that is, every rank
    agrees on: the count of backward passes is the count of the verdict
    all-reduces below (a collective: the same on every rank, whatever
    micro-batch each rank's forward holds), and at that forward one more
    all-reduce asks whether every rank's take got as far as the
    calibration; only then does any rank run it (its backward unshards
    parameters: all-gathers every rank must make), else none does and the
    next forward is asked.  A backward whose weight cannot be read there
    ends the recording on every rank (an all-reduce of the verdict after
    each backward: the ranks end together, so none waits in a collective
    the others left); nothing is ever recomputed."""

    calib_due = True    # the next forward calibrates (every rank: see above)
    synced = 0          # backward passes whose verdict the ranks all-reduced
    calib_stash = None  # this forward's (s_j pairs, sample views) until the ranks agree

    def _take_replica(self, who, replica):
        if replica is not None:
            warnings.warn("%s: replica= is no longer used and will be removed (the recorder "
                          "reads each micro-batch's gradient at the forward's outputs, with no "
                          "copy of the model): leave it out" % who, FutureWarning,
                          stacklevel=3)
        self.premise_broken = None  # why the loss reaches a parameter by another path

    def _loss_view(self, output, outs):
        leaves = [t.detach().requires_grad_() for t in outs]
        return _replaced(output, {id(t): d for t, d in zip(outs, leaves)}), leaves

    def _premise_structure(self, loss, j):
        """The loss, computed on detached outputs, must reach no parameter
        (a penalty on the weights, a second forward of the model): its
        graph walked for a parameter's gradient accumulator."""
        if getattr(self, "param_ids", None) is None:
            self.param_ids = {id(p) for p in self._all_params()}
        frontier, seen = [loss.grad_fn], set()
        while frontier:
            fn = frontier.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            var = getattr(fn, "variable", None)
            if var is not None and id(var) in self.param_ids:
                self.premise_broken = (
                    "micro-batch %d: summed_loss reaches a parameter (%s) by another path than "
                    "the forward's outputs (a penalty on the weights, a second forward)"
                    % (j, tuple(var.shape)))
                raise RuntimeError(self.premise_broken)
            frontier.extend(f for f, _ in fn.next_functions)

    def _all_params(self):
        return list(self.params)

    def _calibrates(self, j):
        return self.calib_due

    def _calibrate(self, pairs):
        """Within the take: the calibration's s_j and destination kept for
        _forward_done, which runs it once every rank has got this far."""
        if not self._can_calibrate():
            return False
        self.calib_stash = (pairs, self.sample_into)
        return True

    @_never_raises
    def _forward_done(self, module, args, kwargs, output):
        """The take (capture.py), then, on the forward the ranks calibrate
        at, their agreement and the calibration's backward."""
        pending, self.calib_stash = self.pending, None
        super()._forward_done(module, args, kwargs, output)
        if self.abandoned or not self.calib_due or not torch.is_grad_enabled():
            return
        stash, self.calib_stash = self.calib_stash, None
        o = self.outs.get(pending[0]) if stash is not None and pending is not None else None
        ready = torch.tensor([0.0 if o is None or o["g"] is None else 1.0])
        dist.distributed_c10d.all_reduce(ready, op=dist.ReduceOp.MIN)
        if float(ready) == 0:
            if o is not None and o["g"] is not None:
                self.spare.append(o["g"])
                o["g"] = None
            return
        self.calib_due = False
        pairs, views = stash
        # The calibration's backward may draw random numbers (a checkpoint
        # without preserve_rng_state): the run draws what it would have.
        rng = _rng_states()
        self.taking, self.sample_into = True, views
        self.sample_seen = [False] * len(self.params)
        try:
            self._calibration_backward(pairs)
        finally:
            self.taking, self.sample_into = False, None
            _set_rng_states(rng)
        for dst, seen in zip(views, self.sample_seen):
            if not seen:
                dst.zero_()

    def _reduces_seen(self):
        """Each backward that reduce-scatters is seen (the subclass's
        _end_backward): certify counts them per step."""
        return True

    def _take_from_forward(self, j, pending, output):
        """The weight read at the outputs; a loss that reaches a parameter
        by another path (seen on its graph: the same on every rank) ends
        the recording here, before its backward's hooks."""
        super()._take_from_forward(j, pending, output)
        if self.premise_broken is not None and not self.abandoned:
            self._abandon("%s; the FSDP recorders read every micro-batch's weight at its "
                          "forward's outputs and recompute nothing: the training went on "
                          "unrecorded" % self.premise_broken)

    def _end_backward(self):
        super()._end_backward()
        if self.abandoned or not self.backwards:
            return
        b = self.backwards[-1]
        failed = torch.tensor([0.0 if b[3] is not None else 1.0])
        dist.distributed_c10d.all_reduce(failed, op=dist.ReduceOp.MAX)
        self.synced += 1
        if self.synced % self.calibrate_every == 0:
            self.calib_due = True
        if float(failed) == 0:
            return
        if b[3] is not None:
            why = "another rank's backward pass %d could not be fitted" % (len(self.backwards) - 1)
        else:
            calibrated = next((n.split(": the loss reaches")[0] for n in reversed(self.notes)
                               if "is not the outputs' gradient" in n), None)
            if calibrated is not None:
                hooks = self._gradient_hooks()
                calibrated += (": %s scales what autograd hands it" % "; ".join(hooks) if hooks else
                               ": a hook on a parameter's gradient, a backward that is not "
                               "the forward's transpose, or a loss that reaches the parameters "
                               "by another path")
            why = self.premise_broken or calibrated or (
                "micro-batch %d: its backward's weight could not be read at its forward's "
                "outputs (summed_loss must call the model once, on the batch's first tensor, "
                "and each forward be backwarded once)" % b[0])
        self._abandon("%s; the FSDP recorders read every micro-batch's weight at its forward's "
                      "outputs and recompute nothing: the training went on unrecorded" % why)

    def _gradient_hooks(self):
        """The hooks of yours on the gradients autograd hands the
        parameters it sees (besides the recorder's own), named."""
        out = []
        for name, t in self._autograd_params():
            n = len(getattr(t, "_backward_hooks", None) or {}) - 1
            if n > 0:
                out.append("%d gradient hook%s of yours on %s" % (n, "s" * (n > 1), name))
        return out

    def _recompute_on(self, batch, dtype, dst):
        raise RuntimeError("a recompute of g_j under FSDP (a backward pass left unfitted): the "
                           "FSDP recorders recompute nothing")


class _ShardFit:
    """What the sharding recorders (FSDP2, FSDP1) share: each rank's step
    fit solves for its own shard of the consumed gradient -- what its
    optimizer steps -- over every rank's whole backward passes restricted
    to that shard, so a gradient scaled by a factor of the rank's own (a
    clip by the shard's norm: ddp-clip-local-norm) is seen as such, not
    as a change the recorder cannot explain; and each clip is recorded
    with the norm of this rank's shard of the gradient it saw and, once
    the ranks meet at the step, of the whole gradient (both in float64:
    certify judges the factor against the one the loop's clip gives).

    With a clip declared (clip=), a scaling of this rank's shard between
    the window's last backward and optimizer.step() that no clip function
    reported (p.grad.to_local().mul_(factor) after a norm of your own) is
    recorded as the loop's clip, with the factor it applied: the ratio of
    the consumed shard to the one the backward left (the step fit checks
    that it is one factor: anything else fails it).

    The fits run on the recorder's sampled coordinates (sample.py) that
    fall in this rank's shard: each row holds every parameter's sample, a
    rank's step fit the part of it its shard holds (shard_idx: their
    positions in a row; local_idx: their offsets in the local shard).
    What else reads whole local tensors (a clip's bfloat16 count, a
    declared EMA) reads them whole, as before (_sampled)."""

    _sampled = False

    def _setup_shards(self):
        # The rows hold the sample of the whole parameters (FSDP2's DTensors
        # have the whole shapes; FSDP1's recorder made its own).
        parts, self.local_idx, self.local_sizes = [], [], []
        for i, ((a, b), (start, size)) in enumerate(zip(self.buf.slices, self._shard_ranges())):
            idx = self.coords.index[i]
            flat = torch.arange(b - a) if idx is None else idx.cpu()
            keep = (flat >= start) & (flat < start + size)
            parts.append(torch.arange(a, b)[keep])
            self.local_idx.append(flat[keep] - start)
            self.local_sizes.append(size)
        self.shard_idx = torch.cat(parts)
        self.snap = None     # this rank's shard of .grad when the last backward ended
        self.snap_clips = 0  # the clips seen before it
        self.hand_clip_noted = False  # the note on a scaling seen on .grad, said once

    def _local_flat(self, grads, strict=True):
        """This rank's shard of the gradients, float64, in shard_idx's
        order (zeros for a gradient that is None); not strict: None where
        a gradient is not the shard (FSDP1's under no_sync())."""
        out = torch.zeros(self.shard_idx.numel(), dtype=torch.float64)
        at = 0
        for g, size, local in zip(grads, self.local_sizes, self.local_idx):
            if g is not None:
                g = self._local(g).detach().reshape(-1)
                if g.numel() != size:
                    if not strict:
                        return None
                    self._refuse("rank %d: a gradient of %d elements where the parameter's shard "
                                 "holds %d: not the sharded gradient the optimizer steps"
                                 % (self.rank, g.numel(), size))
                out[at:at + local.numel()].copy_(g.index_select(0, local.to(g.device)))
            at += local.numel()
        return out

    def _param_take(self, i, q):
        """The replay's part of tensor i: its sampled coordinates in this
        rank's shard (q: the local shard)."""
        local = self.local_idx[i]
        if q.numel() != self.local_sizes[i]:
            return lambda t: t.reshape(-1)
        return lambda t: t.reshape(-1).index_select(0, local.to(t.device))

    def _consumed_vector(self, grads):
        G = self.vec[0].zero_()
        return G.index_copy_(0, self.shard_idx, self._local_flat(grads))

    def _fit_space(self, A, G, terms):
        if self.shard_idx.numel() < terms:
            self._refuse("rank %d: its shard holds %d gradient elements, fewer than the %d "
                         "vectors its step fit solves for: the fit would not be determined "
                         "(fewer ranks, or a larger model)"
                         % (self.rank, self.shard_idx.numel(), terms))
        return A.index_select(1, self.shard_idx), G.index_select(0, self.shard_idx)

    def _clip_norms(self, parameters):
        """The shard's norm now; the whole gradient's at the step (its
        ranks' shard norms, gathered).  The clip takes each tensor's norm
        over a rank's shard in the gradient's precision and combines the
        tensors' and ranks' norms: its total differs from this float64 one
        by the rounding of the largest shard's sum and of that combination
        (meta.csv clip_norm_terms; a gradient below float32 keeps the
        bound over every element)."""
        with torch.no_grad():
            local = [self._local(p.grad.detach()) for p in parameters if p.grad is not None]
            sq = sum(float(g.double().pow(2).sum()) for g in local)
        if local:
            self.clip_terms = max(self.clip_terms,
                                  max(g.numel() for g in local) + len(local) * self.world)
            self.clip_lowp = self.clip_lowp or any(
                g.dtype in (torch.bfloat16, torch.float16) for g in local)
        return float("nan"), sq ** 0.5

    def _end_backward(self):
        super()._end_backward()
        if self.clip_max is not None:
            self.snap = self._local_flat([p.grad for p in self.params], strict=False)
            self.snap_clips = len(self.clips)
            if self.snap is not None:
                # The whole shard's norm (the snapshot is its sample).
                self.snap_norm = self._clip_norms(self.params)[1]

    def _before_step(self):
        snap, self.snap = self.snap, None
        if snap is not None and len(self.clips) == self.snap_clips:
            now = self._local_flat(self._consumed())
            ss = float(snap.dot(snap))
            if ss > 0 and not torch.equal(now, snap):
                factor = float(now.dot(snap)) / ss
                if not self.hand_clip_noted:
                    self.hand_clip_noted = True
                    self.notes.append(
                        "its shard of .grad scaled between the window's last backward and "
                        "optimizer.step() by no clip function the recorder saw (step %d: factor "
                        "%.6g): recorded as the loop's clip (clip=%g declared)"
                        % (self.steps, factor, self.clip_max))
                self._clipped(factor, float("nan"), self.snap_norm, float("nan"))
        super()._before_step()

    def _step_payload(self):
        return [c[4] for c in self.clips if c[0] == self.steps]

    def _step_gathered(self, payloads):
        """Each clip of this step: the whole gradient's norm from every
        rank's shard norm of its clip in the same place."""
        mine = [c for c in self.clips if c[0] == self.steps]
        if len({len(p) for p in payloads}) > 1:
            self.notes.append("step %d: the ranks clipped %s times: the whole gradient's norm "
                              "at each clip is not known" % (self.steps, "/".join(
                                  str(len(p)) for p in payloads)))
            return
        for k, c in enumerate(mine):
            c[2] = sum(p[k] ** 2 for p in payloads) ** 0.5

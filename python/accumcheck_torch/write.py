"""The contract recorder's trace (ContractRecorder's write part): close()
and the files it writes through the one trace writer (trace.py)."""

import torch

from .trace import TRACE_SCHEMA, VERSION, real, stopped_by, unseen_meta, write_trace

CONTRACT_HEADER = "kind,index,ref,epoch,version,items,samples,value,residual,scale"
# The declared lr schedule's keys (a scenario's [schedule] table).
SCHEDULE_KEYS = ("kind", "warmup", "total", "step_size", "gamma")


class Write:
    """close() and the trace's files (a mixin of ContractRecorder)."""

    def close(self):
        """Recomputes what is pending, restores the optimizer and
        clip_grad_norm_, and writes the trace (meta.csv, events.csv,
        values.csv, contract.csv, then the completion record complete.csv).
        Called while an exception propagates or is handled (a `with` block
        left by it, a `finally`, an `except`), it writes no trace: the run
        did not finish, and the folder's marker says so."""
        if self.closed:
            return
        if not self.abandoned:
            why = stopped_by()
            if why:
                self._abandon(why)
                return
        self._ema_poll()
        self._recompute_pending()
        self._unpatch()
        if self.optimizer is None:
            self._refuse("ContractRecorder.close: no optimizer was attached: pass it to "
                         "ContractRecorder(model, optimizer, ...) or call rec.attach(optimizer) "
                         "before its first step")
        self.optimizer.__dict__.pop("zero_grad", None)
        self.optimizer.__dict__.pop("step", None)
        if self._own_step is not None:
            self.optimizer.step = self._own_step
        rows = []
        for j, m in enumerate(self.micro):
            rows.append("micro,%d,,%d,%d,%d,%d,,,%s\n" % (j, m[0], m[1], m[2], m[3], real(m[7])))
        for b, rec in enumerate(self.backwards):
            w, resid = rec[3] if rec[3] is not None else (float("nan"), float("nan"))
            rows.append("backward,%d,%d,,%d,,,%s,%s,\n" % (b, rec[0], rec[1], real(w), real(resid)))
        for e, (n, bs) in enumerate(self.epochs):
            rows.append("epoch,%d,,,,%d,%d,,,\n" % (e, n, bs))
        rows += self.rows + self.ema_rows
        for i, (version, factor, norm, max_norm, shard) in enumerate(self.clips):
            rows.append("clip,%d,%d,,,%s,,%s,%s,%s\n" % (
                i, version, "" if shard is None else real(shard), real(factor), real(norm),
                real(max_norm)))
        precision = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                     torch.float16: "float16"}.get(self.compute_dtype, str(self.compute_dtype))
        meta = [("schema", TRACE_SCHEMA), ("scenario", "contract"),
                ("scenario_digest", "contract"), ("engine", "pytorch"),
                ("precision", precision),
                ("tool_version", "accumcheck_torch-%s torch-%s" % (VERSION, torch.__version__)),
                ("tier", "contract"), ("accumulation", str(self.K)),
                ("items", self.items_kind), ("parameters", str(self.n)),
                ("lr", real(self.lr0))] + self.coords.meta()
        meta += [("schedule_" + k, str(self.schedule[k])) for k in SCHEDULE_KEYS
                 if k in self.schedule]
        if self.clip_max is not None:
            meta.append(("clip", real(self.clip_max)))
        if self.accept:
            meta.append(("accept", "+".join(self.accept)))
        if self.rng_in_backward:
            self.notes.append(
                "the backward of %d of %d micro-batches (the first: %d) drew random numbers from "
                "the CPU RNG after its forward: a recomputation that does not replay the "
                "forward's randomness (torch.utils.checkpoint with preserve_rng_state=False "
                "around dropout?), so that gradient is not of the forward's dropout masks"
                % (len(self.rng_in_backward), len(self.micro), self.rng_in_backward[0]))
        if self.notes:
            meta.append(("notes", " | ".join(self.notes)))
        if self.emas is not None:
            meta += [("ema", self.emas["kind"]), ("ema_decay", real(self.emas["decay"]))]
        bn = sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in self.model.modules())
        if bn:
            meta.append(("batchnorm", str(bn)))
        meta += unseen_meta(self.unseen)
        # Each event's epoch: that of the last micro-batch backwarded.
        events, epoch = [], 0
        for kind, step, micro, lr in self.events:
            if micro >= 0:
                epoch = self.micro[micro][0]
            events.append("%s,%d,%d,%d,%s,0,0,,%s,,\n" % (self.run, epoch, step, micro, kind,
                                                         "" if lr is None else real(lr)))
        self._write(meta, events, rows)
        self._recording.done()

    def _extra_files(self):
        """The trace's files beside contract.csv: schedule.csv for a
        declared scheduler."""
        return {} if self.declared is None else {
            "schedule.csv": self.declared.csv(self._schedule_rows())}

    def _write(self, meta, events, rows):
        write_trace(self.out, meta, events, [],
                    extra=dict(self._extra_files(),
                               **{"contract.csv": CONTRACT_HEADER + "\n" + "".join(rows)}))

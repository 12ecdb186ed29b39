"""The forward's outputs as the contract recorder reads them (capture.py):
the model standing in for summed_loss's call, the outputs' floating
tensors, and the dot products the output hook takes."""

import torch


def _tensors(args, kwargs):
    """The tensors a forward was called with, positional or keyword (a
    Transformers model is called as model(**batch))."""
    return [t for t in list(args) + list(kwargs.values()) if torch.is_tensor(t)]


class _Output:
    """The model as summed_loss sees it when g_j is taken from the forward
    your loop just ran: calling it returns that forward's output (once, for
    the same input); any attribute is the model's."""

    def __init__(self, model, inp, out):
        self._model, self._inp, self._out, self.calls = model, inp, out, 0

    def __call__(self, *a, **k):
        self.calls += 1
        if self.calls > 1 or not any(t is self._inp for t in _tensors(a, k)):
            raise _NotTheForward()
        return self._out

    def __getattr__(self, name):
        return getattr(self._model, name)


class _NotTheForward(Exception):
    pass


def _out_tensors(output, depth=0):
    """The floating tensors of a forward's output: a tensor, a tuple or
    list, a dict (a Transformers ModelOutput is one), nested."""
    if torch.is_tensor(output):
        return [output] if output.is_floating_point() else []
    if depth > 4:
        return []
    if isinstance(output, dict):
        items = list(output.values())
    elif isinstance(output, (list, tuple)):
        items = list(output)
    else:
        return []
    return [t for x in items for t in _out_tensors(x, depth + 1)]


# Elements of an output the output hook reads at a time (_output_dots).
OUTPUT_CHUNK = 1 << 16


def _output_dots(s, u):
    """u.s, s.s and |u - w s|^2 (w = u.s / s.s) over an output: products
    in float32 (each rounded once), their sums in float64.  The outputs are
    as large as the logits and the hook runs where your backward's memory
    peaks (at its start, every activation still saved), so they are read
    OUTPUT_CHUNK elements at a time: the temporaries are a few of those,
    never output-sized.  The sums run on the outputs' device, chunk after
    chunk in the same order (the same float64 additions), and reach the
    host twice per output (u.s and s.s together, then the residual): on a
    GPU, two synchronisations, not three per chunk."""
    f, d = torch.float32, torch.float64
    with torch.no_grad():
        s, u = s.reshape(-1), u.detach().reshape(-1)
        n = s.numel()
        sums = s.new_zeros(2, dtype=d)  # s.s, u.s
        for a in range(0, n, OUTPUT_CHUNK):
            sc, uc = s[a:a + OUTPUT_CHUNK].to(f), u[a:a + OUTPUT_CHUNK].to(f)
            sums[0] += torch.sum(sc * sc, dtype=d)
            sums[1] += torch.sum(uc * sc, dtype=d)
        ss, us = sums.tolist()
        wt = us / ss if ss > 0 else 0.0
        rr = s.new_zeros((), dtype=d)
        for a in range(0, n, OUTPUT_CHUNK):
            sc, uc = s[a:a + OUTPUT_CHUNK].to(f), u[a:a + OUTPUT_CHUNK].to(f)
            r = uc - sc * wt
            rr += torch.sum(r * r, dtype=d)
    return us, ss, float(rr)

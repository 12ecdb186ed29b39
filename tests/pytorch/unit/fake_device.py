"""A fake accelerator for testing the recorder's device path on the CPU
(issue 43: "on CUDA tensors no parameter-sized copy ever leaves the
device").  torch 2.13's CPU wheel has no test backend (no PrivateUse1
"openreg" module ships in it, and a PrivateUse1 backend needs a C++
allocator), and a model on the `meta` device holds no values to train.

So a "device" tensor here is a DeviceTensor: a wrapper subclass that holds
its values in a CPU tensor (`elem`) and reports the `meta` device (a device
that is not the CPU: the autograd engine, the optimizers and
clip_grad_norm_ take it as one, without foreach kernels, the CPU's
fallback), while every operation on it runs on `elem` and returns a
DeviceTensor.  The rules of a real accelerator are kept, and every
crossing is logged:

  - device to host (Transfers.d2h, (what, numbers)): .cpu(),
    .to("cpu"/torch.device("cpu")), .numpy(), .tolist(), .item(),
    __array__, float()/int()/bool(), copy_ into a host tensor (a pinned
    or any other host buffer), an operation that returns a Python number
    (torch.equal);
  - host to device (Transfers.h2d): .to(the device), copy_ from a host
    tensor, a factory called with device= the device (torch.tensor(...,
    device=p.device));
  - an operation mixing device tensors with host tensors of one element
    or more raises, as CUDA does ("Expected all tensors to be on the same
    device"); a 0-dim host tensor is a scalar and allowed, as on CUDA.

What it cannot show: anything of CUDA itself (streams, synchronisation
cost, kernels whose rounding differs from the CPU's, the CUDA generator,
memory).  docs/tiers.md "The recorder on a GPU" says what is tested here
and what is left to gpu/record_1b.py.
"""

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("meta")


def _is_device(d):
    return d is not None and torch.device(d).type == DEVICE.type


class Transfers:
    """What crossed between the fake device and the host, in order."""

    def __init__(self):
        self.d2h, self.h2d = [], []

    def clear(self):
        self.d2h.clear()
        self.h2d.clear()


_LOG = [Transfers()]  # the active FakeDevice's log (the last one entered)


class DeviceTensor(torch.Tensor):
    """A tensor on the fake device (its values in self.elem, on the CPU)."""

    @staticmethod
    def __new__(cls, elem):
        assert type(elem) is torch.Tensor, type(elem)
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=DEVICE, requires_grad=elem.requires_grad,
            layout=elem.layout)
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return "DeviceTensor(%r)" % (self.elem,)

    def data_ptr(self):
        return self.elem.data_ptr()

    def _host(self, what):
        _LOG[-1].d2h.append((what, self.numel()))
        return self.elem

    def tolist(self):
        return self._host("tolist").tolist()

    def numpy(self, *a, **k):
        return self._host("numpy").numpy(*a, **k)

    def __array__(self, *a, **k):
        return self._host("__array__").__array__(*a, **k)

    def item(self):
        return self._host("item").item()

    def __float__(self):
        return float(self._host("float"))

    def __int__(self):
        return int(self._host("int"))

    def __bool__(self):
        return bool(self._host("bool"))

    def __index__(self):
        return self._host("index").__index__()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _run(func, args, kwargs):
    """One operation with a device tensor among its arguments (or a device=
    the device): run on the values, the result on the device."""
    log = _LOG[-1]
    flat, _ = tree_flatten((args, kwargs))
    on_device = [t for t in flat if isinstance(t, DeviceTensor)]
    name = func.overloadpacket.__name__
    if name == "copy_":
        dst, src = args[0], args[1]
        if isinstance(dst, DeviceTensor) and not isinstance(src, DeviceTensor):
            log.h2d.append(("copy_", src.numel()))
            dst.elem.copy_(src)
            return dst
        if not isinstance(dst, DeviceTensor) and isinstance(src, DeviceTensor):
            log.d2h.append(("copy_", src.numel()))
            dst.copy_(src.elem)
            return dst
    device = kwargs.get("device")
    if name == "_to_copy":
        src = args[0]
        if isinstance(src, DeviceTensor) and device is not None and not _is_device(device):
            log.d2h.append(("to", src.numel()))
            return func(src.elem, **kwargs)
        if not isinstance(src, DeviceTensor) and _is_device(device):
            log.h2d.append(("to", src.numel()))
            return DeviceTensor(func(src, **dict(kwargs, device=torch.device("cpu"))))
    if on_device:
        host = [t for t in flat if type(t) is torch.Tensor and t.dim() > 0]
        if host:
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               "least two devices, %s and cpu (%s)" % (DEVICE, func))
    unwrapped = [tree_map(lambda t: t.elem if isinstance(t, DeviceTensor) else t, x)
                 for x in (args, kwargs)]
    a, k = unwrapped
    if _is_device(device):
        k = dict(k, device=torch.device("cpu"))
    out = func(*a, **k)
    if not on_device and not _is_device(device):
        return out
    if a and isinstance(out, torch.Tensor) and out is a[0] and isinstance(args[0], DeviceTensor):
        return args[0]  # an in-place operation returns its self
    if isinstance(out, (bool, int, float)):
        log.d2h.append((name, 1))  # a number the host reads (torch.equal)
    return tree_map(lambda t: DeviceTensor(t) if type(t) is torch.Tensor else t, out)


class _Factories(TorchFunctionMode):
    """A factory called with device= the device (torch.tensor builds a meta
    tensor without dispatching: it is caught here)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_device(kwargs.get("device")) and \
                not any(isinstance(a, torch.Tensor) for a in tree_flatten(args)[0]):
            out = func(*args, **dict(kwargs, device=torch.device("cpu")))
            flat, _ = tree_flatten(out)
            _LOG[-1].h2d.append((getattr(func, "__name__", str(func)),
                                 sum(t.numel() for t in flat if isinstance(t, torch.Tensor))))
            return tree_map(lambda t: DeviceTensor(t) if type(t) is torch.Tensor else t, out)
        return func(*args, **kwargs)


class _Dispatch(TorchDispatchMode):
    """Every operation: those touching the device run as DeviceTensor's
    (a plain tensor moved to the device included)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        if any(isinstance(t, DeviceTensor) for t in flat) or _is_device(kwargs.get("device")):
            return _run(func, args, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def fake_device():
    """Inside: tensors move to DEVICE with .to(DEVICE) or device=DEVICE, and
    the returned Transfers logs every crossing."""
    log = Transfers()
    _LOG.append(log)
    try:
        with _Factories(), _Dispatch():
            yield log
    finally:
        _LOG.pop()


def to_device(module):
    """The module's parameters and buffers moved to the fake device (as
    module.to("cuda") would; the parameters stay nn.Parameters)."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = torch.nn.Parameter(DeviceTensor(p.detach().clone()),
                                                         p.requires_grad)
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = DeviceTensor(b.clone())
    return module


def values(t):
    """A tensor's values on the host, without logging (for the test's own
    comparisons)."""
    return t.elem if isinstance(t, DeviceTensor) else t

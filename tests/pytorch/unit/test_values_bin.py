"""values.bin: the recorder's binary values file, read by `accumcheck certify`.

The same loop recorded as values.bin and as values.csv certifies with the
same output; every malformed values.bin is refused with exit 2 and a
message naming values.bin and the byte offset where it goes wrong."""
import math
import os
import shutil
import struct
import subprocess

import pytest

import accumcheck_torch as act
from accumcheck_torch.trace import seal_trace
from test_certify import correct_loop

pytestmark = pytest.mark.calls_accumcheck  # each test runs accumcheck (conftest.py)


def certify(bundle_dir, trace, *extra):
    return subprocess.run([os.environ["ACCUMCHECK_BIN"], "certify",
                           os.path.join(bundle_dir, "scenario.toml"), "--trace", trace,
                           *extra], capture_output=True, text=True)


def record(bundle_dir, trace, values):
    b = act.load_bundle(bundle_dir)
    net = b.model()
    opt = b.optimizer(net)
    sched = b.scheduler(opt)
    rec = act.Recorder(b, net, opt, sched, out=trace, quiet=True, values=values)
    correct_loop(b, net, opt, sched)
    rec.close()
    return b


@pytest.fixture
def traces(mlp_bundle, tmp_path):
    binary, text = str(tmp_path / "bin"), str(tmp_path / "csv")
    b = record(mlp_bundle, binary, "bin")
    record(mlp_bundle, text, "csv")
    return mlp_bundle, binary, text, b


def header_size(b):
    return 20 + sum(4 + len(n) + 8 for n, _ in b.tensors)


def test_binary_and_csv_certify_alike(traces):
    bundle, binary, text, _ = traces
    assert os.path.exists(os.path.join(binary, "values.bin"))
    assert not os.path.exists(os.path.join(binary, "values.csv"))
    assert os.path.exists(os.path.join(text, "values.csv"))
    a, c = certify(bundle, binary), certify(bundle, text)
    assert a.returncode == 0 and c.returncode == 0, a.stdout + a.stderr + c.stdout + c.stderr
    verdict = [line for line in a.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert verdict and verdict[0].startswith("PASS"), a.stdout
    def lines(out):  # all but the timing line
        return [line for line in out.splitlines() if not line.startswith("certify: ")]
    assert lines(a.stdout) == lines(c.stdout.replace(text, binary))
    # Each block is 4 bytes per value: far smaller than the CSV rows.
    assert os.path.getsize(os.path.join(binary, "values.bin")) * 4 < \
        os.path.getsize(os.path.join(text, "values.csv"))


def corrupt(binary, tmp_path, edit, name):
    out = str(tmp_path / name)
    shutil.copytree(binary, out)
    path = os.path.join(out, "values.bin")
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data = edit(data)
    with open(path, "wb") as f:
        f.write(bytes(data))
    seal_trace(out)  # past the completion record: the reader's own checks
    return out


def refused(bundle, trace, needle):
    r = certify(bundle, trace)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr, r.stderr
    return r.stderr


def test_malformed_values_bin_is_refused_with_the_byte_offset(traces, tmp_path):
    bundle, binary, _, b = traces
    h = header_size(b)
    n = sum(math.prod(shape) for _, shape in b.tensors)
    run_len = len(b"trainer")
    block = 4 + run_len + 20 + 4 * n
    cases = [
        ("magic", lambda d: b"XXVALUES" + d[8:], "values.bin:byte 0: magic"),
        ("version", lambda d: d[:8] + struct.pack("<I", 9) + d[12:],
         "values.bin:byte 8: version: values file version 9"),
        ("width", lambda d: d[:12] + struct.pack("<I", 2) + d[16:],
         "values.bin:byte 12: width"),
        ("truncated", lambda d: d[:-3], "truncated file"),
        ("kind", lambda d: d[:h + 4 + run_len + 16] + struct.pack("<I", 7) +
         d[h + 4 + run_len + 20:],
         "values.bin:byte %d: kind: unknown kind 7" % (h + 4 + run_len + 16)),
        ("negative step", lambda d: d[:h + 4 + run_len] + struct.pack("<q", -1) +
         d[h + 4 + run_len + 8:],
         "values.bin:byte %d: step" % (h + 4 + run_len)),
        # The second block (step 0's parameters) made a gradient: a duplicate.
        ("duplicate", lambda d: d[:h + block + 4 + run_len + 16] + struct.pack("<I", 0) +
         d[h + block + 4 + run_len + 20:],
         "values.bin:byte %d: duplicated block" % (h + block)),
        # The first gradient value made a NaN.
        ("nan", lambda d: d[:h + 4 + run_len + 20] + struct.pack("<f", float("nan")) +
         d[h + 4 + run_len + 24:],
         "values.bin:byte %d: value: step 0 grad" % (h + 4 + run_len + 20)),
        # The first tensor renamed: not the scenario's model.
        ("tensor", lambda d: d[:24] + b"X" + d[25:], "values.bin:byte 20: tensor"),
    ]
    for name, edit, needle in cases:
        refused(bundle, corrupt(binary, tmp_path, edit, name), needle)


def test_both_values_files_are_refused(traces, tmp_path):
    bundle, binary, text, _ = traces
    both = str(tmp_path / "both")
    shutil.copytree(binary, both)
    shutil.copy(os.path.join(text, "values.csv"), both)
    refused(bundle, both, "values.csv: a trace file that complete.csv does not list")
    seal_trace(both)  # both listed: the reader's own check
    refused(bundle, both, "holds both values.csv and values.bin")


def test_a_rewrite_in_the_other_format_removes_the_stale_file(mlp_bundle, tmp_path):
    trace = str(tmp_path / "t")
    record(mlp_bundle, trace, "csv")
    record(mlp_bundle, trace, "bin")
    assert not os.path.exists(os.path.join(trace, "values.csv"))
    assert certify(mlp_bundle, trace).returncode == 0

"""Fixtures: a real `accumcheck export` bundle (the binary from CTest's
ACCUMCHECK_BIN; without it the tests that need one are skipped, saying so)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))  # ctest_driver, warm_python
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package under test


def export(tmp_path, scenario, text=None):
    binary = os.environ.get("ACCUMCHECK_BIN")
    if not binary:
        pytest.skip("ACCUMCHECK_BIN is not set (CTest sets it to the accumcheck binary)")
    src = os.path.join(ROOT, "scenarios", scenario + ".toml")
    if text is not None:
        src = str(tmp_path / (scenario + ".toml"))
        with open(src, "w") as f:
            f.write(text)
    out = str(tmp_path / ("bundle-" + scenario))
    subprocess.run([binary, "export", src, "--out", out, "--quiet"], check=True)
    return out


@pytest.fixture
def mlp_bundle(tmp_path):
    return export(tmp_path, "certify-mlp")


@pytest.fixture
def scenario_text():
    def read(name):
        with open(os.path.join(ROOT, "scenarios", name + ".toml")) as f:
            return f.read()
    return read

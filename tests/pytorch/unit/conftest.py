"""Fixtures: a real `accumcheck export` bundle (the binary from CTest's
ACCUMCHECK_BIN; without it the tests that need one are skipped, saying so).

A test that runs the accumcheck binary is marked `calls_accumcheck` (a
test that takes the mlp_bundle fixture is marked by it); the sanitized CI
run (scripts/check-hardened.sh --ci) runs only those (`-m
calls_accumcheck`): the others are the same Python program under either
build.  Every other test sees ACCUMCHECK_BIN set to a path that does not
exist, so one that runs the binary without the mark fails here, in the
plain run, naming the mark."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))  # ctest_driver, warm_python
sys.path.insert(0, os.path.join(ROOT, "python"))  # the package under test

UNMARKED_BIN = "/ACCUMCHECK_BIN-is-only-for-tests-marked-calls_accumcheck"


def pytest_configure(config):
    config.addinivalue_line("markers", "calls_accumcheck: the test runs the accumcheck binary "
                            "(ACCUMCHECK_BIN); the sanitized CI run selects these")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "mlp_bundle" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.calls_accumcheck)


@pytest.fixture(autouse=True)
def _accumcheck_bin_only_when_marked(request, monkeypatch):
    if os.environ.get("ACCUMCHECK_BIN") and request.node.get_closest_marker("calls_accumcheck") is None:
        monkeypatch.setenv("ACCUMCHECK_BIN", UNMARKED_BIN)


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

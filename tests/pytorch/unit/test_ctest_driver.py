"""ctest_driver's --compare stamp: the sanitized run skips --compare only
for the output that the recorded build's run compared, byte for byte."""
import os
import time

import pytest

import ctest_driver as drv


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """A recorded build (with an accumcheck binary) and this build, each
    holding one test's work folder with a JUnit file."""
    rec, this = tmp_path / "build", tmp_path / "build-asan"
    for b in (rec, this):
        (b / "pytorch-certify" / "T").mkdir(parents=True)
        (b / "pytorch-certify" / "T" / "junit.xml").write_text(
            '<testsuite time="1.5"><testcase name="a"/></testsuite>\n')
    (rec / "cli").mkdir()
    (rec / "cli" / "accumcheck").write_text("binary")
    old = time.time() - 100
    os.utime(rec / "cli" / "accumcheck", (old, old))
    monkeypatch.setenv("ACCUMCHECK_RECORDED_BUILD", str(rec))
    monkeypatch.setenv("ACCUMCHECK_THIS_BUILD", str(this))
    return str(rec / "pytorch-certify" / "T"), str(this / "pytorch-certify" / "T")


def test_same_output_skips(builds):
    rec, this = builds
    drv.stamp_compared(rec, "PASS\n")
    assert drv.compared_before(this, rec, "PASS\n") == os.environ["ACCUMCHECK_RECORDED_BUILD"]


def test_other_output_or_junit_runs_compare(builds):
    rec, this = builds
    drv.stamp_compared(rec, "PASS\n")
    assert drv.compared_before(this, rec, "PASS \n") is None
    with open(os.path.join(this, "junit.xml"), "a") as f:
        f.write("<!-- another case -->\n")
    assert drv.compared_before(this, rec, "PASS\n") is None


def test_junit_time_attribute_is_ignored(builds):
    rec, this = builds
    drv.stamp_compared(rec, "PASS\n")
    with open(os.path.join(this, "junit.xml"), "w") as f:
        f.write('<testsuite time="9.25"><testcase name="a"/></testsuite>\n')
    assert drv.compared_before(this, rec, "PASS\n") is not None


def test_no_stamp_no_reuse_or_stale_stamp_runs_compare(builds):
    rec, this = builds
    assert drv.compared_before(this, rec, "PASS\n") is None  # never compared
    drv.stamp_compared(rec, "PASS\n")
    assert drv.compared_before(this, None, "PASS\n") is None  # trace not reused
    # The recorded build's accumcheck rebuilt after its compare: stale.
    binary = os.path.join(os.environ["ACCUMCHECK_RECORDED_BUILD"], "cli", "accumcheck")
    later = time.time() + 100
    os.utime(binary, (later, later))
    assert drv.compared_before(this, rec, "PASS\n") is None

"""The few constants the Python recorder mirrors from the C++ tables (the
error model, oracle/error_model.hpp, and the limits table, sim/limits.cpp)
must be those tables' values: one error model and one limits table, read
from their source here so that changing a row without its mirror fails."""
import os
import re

import pytest
from accumcheck_torch import contract
from accumcheck_trace import error_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _row(path, key):
    """The value of the table row `{"key", VALUE, ...}` in a C++ source file
    (a number, digit separators allowed, or a quotient of two numbers)."""
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    m = re.search(r'\{\s*"%s",\s*([0-9.\'eE+-]+(?:\s*/\s*[0-9.\'eE+-]+)?)\s*,' % re.escape(key), text)
    assert m, "%s has no row %r" % (path, key)
    parts = [float(p.replace("'", "")) for p in m.group(1).split("/")]
    return parts[0] / parts[1] if len(parts) == 2 else parts[0]


@pytest.mark.parametrize("mirror,path,key", [
    ("REPLAY_ULPS", "oracle/error_model.hpp", "contract_replay_ulps"),
    ("SUM_ULPS", "oracle/error_model.hpp", "contract_sum_ulps"),
    ("EVIDENCE_WEIGHT_REL", "oracle/error_model.hpp", "evidence_weight_rel"),
    ("SCHEDULE_ROWS", "sim/limits.cpp", "schedule_rows"),
])
def test_a_mirrored_constant_is_its_tables_row(mirror, path, key):
    assert getattr(contract, mirror) == _row(path, key)
    # The error model's rows: the one mirror (accumcheck_trace.error_model),
    # the object every recorder imports.
    if path == "oracle/error_model.hpp":
        assert getattr(contract, mirror) is getattr(error_model, mirror)

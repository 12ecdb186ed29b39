"""The rows of the error model (oracle/error_model.hpp) that the recorders
mirror, once for every recorder (accumcheck_torch and accumcheck_jax):
certify judges with the C++ table; these only scale what a trace reports
and what a recorder takes as one weight.  tests/pytorch/unit/
test_table_mirrors.py reads the table and fails where a mirror differs."""

# float32's unit roundoff, 2^-24 (error_model::kUnitRoundoff32).
U32 = 2.0 ** -24
# contract_replay_ulps: the replay's bound, in u32 of |p| + |update|
# (the judging is certify's; this scales what the trace reports).
REPLAY_ULPS = 16.0
# contract_sum_ulps and evidence_weight_rel: which directions of a step
# fit the step does not fix (accumcheck_torch's _indistinct), and how far
# a weight read from c_j strays before the output path's premise fails.
SUM_ULPS = 2.0
EVIDENCE_WEIGHT_REL = 1e-3
# contract_fit_calibration: a fit of two float32 evaluations (c_j and g_j),
# each about cal_j (float32 against float64) from the truth, doubled for
# the spread between evaluations (accumcheck_jax's output-path premise).
CONTRACT_FIT_CALIBRATION = 4.0

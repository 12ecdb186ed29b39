# Frameworks.accelerate.* and Frameworks.lightning.* (issue 33): the
# framework case scripts beside this file, each run by its framework's own
# venv (torch 2.13.0 + the framework pinned), then certify --contract.
# The venv: ACCUMCHECK_ACCELERATE_PYTHON / ACCUMCHECK_LIGHTNING_PYTHON, by
# default build/conformance/venvs/<fw>-<version>/bin/python where
# bench/conformance.py made it; no venv: the cases are not registered.
# Included from tests/pytorch/CMakeLists.txt (ACCUMCHECK_TORCH_PYTHON runs
# the driver).
set(_fw_dir ${PROJECT_SOURCE_DIR}/tests/frameworks)
foreach(_fw accelerate-1.15.0 lightning-2.6.6)
  string(REGEX REPLACE "-.*" "" _name ${_fw})
  string(TOUPPER ${_name} _up)
  set(_default "")
  if(EXISTS ${CMAKE_BINARY_DIR}/conformance/venvs/${_fw}/bin/python)
    set(_default ${CMAKE_BINARY_DIR}/conformance/venvs/${_fw}/bin/python)
  endif()
  set(ACCUMCHECK_${_up}_PYTHON "${_default}" CACHE FILEPATH
    "Python with torch 2.13.0 and ${_name} for the Frameworks.${_name} tests")
  if(ACCUMCHECK_${_up}_PYTHON)
    message(STATUS "accumcheck: ${_name} cases with ${ACCUMCHECK_${_up}_PYTHON}")
  else()
    message(STATUS "accumcheck: no ${_name} venv: Frameworks.${_name} tests skipped "
      "(set ACCUMCHECK_${_up}_PYTHON)")
  endif()
endforeach()
# framework|case|variant|certify's exit code ("refused": the case exits 2)|texts (~ separated)[|ranks]
set(_fw_cases
  "accelerate|classifier|partial|1|diagnosis: matches partial-cycle-scale-by-k"
  "accelerate|classifier|clip|0|ok   clip:~PASS (contract tier)"
  "accelerate|classifier|sched|1|lr ratio at step 1: 2 x the schedule~diagnosis: matches ddp-scheduler-per-rank|2"
  "accelerate|lm|mean|1|diagnosis: matches token-mean-of-means"
  "accelerate|lm|sum|0|PASS (contract tier)"
  "lightning|classifier|sgd|1|diagnosis: matches partial-cycle-scale-by-k"
  "lightning|classifier|accept|0|PASS (contract tier)~accepted: partial-cycle-scale-by-k"
  "lightning|classifier|sched_epoch|1|diagnosis: matches partial-cycle-scale-by-k+scheduler-per-epoch"
  "lightning|lm|mean|1|diagnosis: matches partial-cycle-scale-by-k+token-mean-of-means"
  "lightning|lm|underivable|refused|cannot derive the loss of a list batch~pass loss_fn=")
foreach(case ${_fw_cases})
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 fw)
  list(GET parts 1 name)
  list(GET parts 2 variant)
  list(GET parts 3 code)
  list(GET parts 4 texts)
  list(LENGTH parts nparts)
  set(ranks 1)
  if(nparts GREATER 5)
    list(GET parts 5 ranks)
  endif()
  set(test Frameworks.${fw}.${name}.${variant})
  if(ranks GREATER 1)
    set(test ${test}.ranks${ranks})
  endif()
  string(TOUPPER ${fw} _up)
  if(NOT ACCUMCHECK_${_up}_PYTHON)
    continue()
  endif()
  string(REPLACE "~" ";" texts "${texts}")
  set(textargs)
  foreach(t ${texts})
    list(APPEND textargs --text "${t}")
  endforeach()
  add_test(NAME ${test}
    COMMAND ${ACCUMCHECK_TORCH_PYTHON} ${_fw_dir}/ctest_framework.py
      $<TARGET_FILE:accumcheck> ${CMAKE_BINARY_DIR}/frameworks/${test}
      ${code} ${textargs} -- ${ACCUMCHECK_${_up}_PYTHON} ${fw}_${name}.py --variant ${variant}
      --ranks ${ranks})
  set_tests_properties(${test} PROPERTIES TIMEOUT 300 PROCESSORS ${ranks})
endforeach()

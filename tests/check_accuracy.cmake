# Runs PROGRAM with ARGS and fails unless its last output line is JSON with
# test_accuracy >= MIN_ACCURACY.
execute_process(COMMAND ${PROGRAM} ${ARGS} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${rc}")
endif()
string(STRIP "${out}" out)
string(REGEX REPLACE ".*\n" "" last "${out}")
message(STATUS "${last}")
string(JSON acc GET "${last}" test_accuracy)
if(acc LESS MIN_ACCURACY)
  message(FATAL_ERROR "test_accuracy ${acc} < ${MIN_ACCURACY}")
endif()

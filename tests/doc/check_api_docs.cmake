# Builds the API reference (doxygen DIR/Doxyfile) and fails on any warning, listing them: an
# undocumented public symbol, a broken reference, a malformed command. Run by ctest as
# doc.api_reference (tests/doc/docs.cmake).
file(REMOVE ${DIR}/warnings.log)
execute_process(COMMAND ${DOXYGEN} ${DIR}/Doxyfile WORKING_DIRECTORY ${DIR} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "doxygen failed (${result}):\n${out}${err}")
endif()
file(READ ${DIR}/warnings.log warnings)
string(STRIP "${warnings}" warnings)
if(warnings)
  string(REGEX MATCHALL "warning:" each "${warnings}")
  list(LENGTH each count)
  message(FATAL_ERROR "the API reference has ${count} warnings (document each public symbol with a /// comment):\n${warnings}")
endif()
message(STATUS "API reference: no warnings (${DIR}/html/index.html)")

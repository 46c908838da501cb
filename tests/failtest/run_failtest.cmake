# Compiles SOURCE and succeeds only if compilation fails with output matching the file's
# "// expect: REGEX" line.
file(STRINGS ${SOURCE} expect_line REGEX "^// expect: ")
string(REGEX REPLACE "^// expect: " "" expect "${expect_line}")
if(expect STREQUAL "")
  message(FATAL_ERROR "${SOURCE} has no '// expect: REGEX' line")
endif()
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE} ${SOURCE}
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
if(NOT "${out}${err}" MATCHES "${expect}")
  message(FATAL_ERROR "${SOURCE} failed to compile without the expected diagnostic '${expect}':\n${err}")
endif()
message(STATUS "failed to compile as expected: ${expect}")

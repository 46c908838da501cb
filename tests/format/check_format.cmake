# Checks that every C++ source and header follows .clang-format (the layout the code is kept in).
# Usage: cmake -DSOURCE_DIR=<repo> -DCLANG_FORMAT=<clang-format> -P check_format.cmake
# Exits 77 (ctest's skip code) when clang-format 14, the version setup.sh installs and the layout
# was made with, is absent: another version lays some lines out differently.
if(NOT CLANG_FORMAT OR NOT EXISTS "${CLANG_FORMAT}")
  message("skipped: clang-format not found (scripts/setup.sh installs it)")
  cmake_language(EXIT 77)
endif()
execute_process(COMMAND "${CLANG_FORMAT}" --version OUTPUT_VARIABLE version)
if(NOT version MATCHES "version 14\\.")
  message("skipped: ${CLANG_FORMAT} is not clang-format 14: ${version}")
  cmake_language(EXIT 77)
endif()
set(dirs backends bench codegen distributed dsl examples include io ir models plot sweeps tests tools train)
set(files)
foreach(d ${dirs})
  file(GLOB_RECURSE found "${SOURCE_DIR}/${d}/*.cpp" "${SOURCE_DIR}/${d}/*.hpp")
  list(APPEND files ${found})
endforeach()
list(LENGTH files count)
if(count LESS 100)
  message(FATAL_ERROR "found only ${count} sources under ${SOURCE_DIR}")
endif()
execute_process(COMMAND "${CLANG_FORMAT}" --style=file --dry-run --Werror ${files}
                WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE result ERROR_VARIABLE errors)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "these lines differ from .clang-format's layout (fix with clang-format -i):\n${errors}")
endif()
message("${count} sources follow .clang-format")

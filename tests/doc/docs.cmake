# The docs, tested: every code block of README.md and docs/*.md is compiled or run, and the API
# reference (Doxygen, from the public headers' comments) builds without a warning. Included from
# tests/CMakeLists.txt. CONTRIBUTING.md ("Docs") gives the conventions of the blocks.
find_package(Python3 COMPONENTS Interpreter REQUIRED)
file(GLOB QKV_DOC_PAGES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
list(PREPEND QKV_DOC_PAGES ${PROJECT_SOURCE_DIR}/README.md)
set(QKV_DOC_BLOCKS ${CMAKE_CURRENT_SOURCE_DIR}/doc/doc_blocks.py)

# ```cpp blocks: each its own translation unit (generated when the pages change: editing a page
# reruns this configure step), compiled with the project's warnings as errors. A compile error
# names the page and line (#line). An OBJECT library: nothing is linked, so blocks may have a main.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${QKV_DOC_PAGES} ${QKV_DOC_BLOCKS})
execute_process(COMMAND ${Python3_EXECUTABLE} ${QKV_DOC_BLOCKS} extract --source-dir ${PROJECT_SOURCE_DIR}
                        --out-dir ${CMAKE_CURRENT_BINARY_DIR}/doc_blocks ${QKV_DOC_PAGES}
                OUTPUT_VARIABLE qkv_doc_units RESULT_VARIABLE qkv_doc_result ERROR_VARIABLE qkv_doc_error)
if(NOT qkv_doc_result EQUAL 0)
  message(FATAL_ERROR "docs' code blocks: ${qkv_doc_error}")
endif()
string(REPLACE "\n" ";" qkv_doc_units "${qkv_doc_units}")
list(FILTER qkv_doc_units EXCLUDE REGEX "^$")
list(LENGTH qkv_doc_units qkv_doc_count)
message(STATUS "docs: ${qkv_doc_count} C++ blocks")
add_library(qkv_doc_blocks OBJECT ${qkv_doc_units})
target_link_libraries(qkv_doc_blocks PRIVATE qkv_dsl qkv_backends qkv_io qkv_train qkv_distributed qkv_models qkv_warnings)
# A fragment's values are often its last statement's result, or its function's parameters.
target_compile_options(qkv_doc_blocks PRIVATE -Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-parameter)

# ```sh, ```ir and file= blocks: one test per page, naming the page and line of each failure.
foreach(page ${QKV_DOC_PAGES})
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${page})
  string(REGEX REPLACE "\\.md$" "" name "${rel}")
  string(REPLACE "/" "." name "${name}")
  add_test(NAME doc.blocks.${name} COMMAND Python3::Interpreter ${QKV_DOC_BLOCKS} check --source-dir ${PROJECT_SOURCE_DIR}
                                           --qkv $<TARGET_FILE:qkv> ${page})
  set_tests_properties(doc.blocks.${name} PROPERTIES TIMEOUT 120 ENVIRONMENT "${QKV_TEST_ENV}")
endforeach()

# The API reference: `cmake --build --preset default --target api-docs` writes
# build/<preset>/api-docs/html/index.html from the public headers (those include/qkv/*.hpp reach;
# the kernels' and tools' headers are not API). Its test fails on any Doxygen warning, an
# undocumented public symbol included, and lists them.
find_package(Doxygen)
if(DOXYGEN_FOUND)
  set(QKV_API_HEADERS
      backends/backend.hpp backends/equivalence.hpp distributed/communicator.hpp distributed/ring_attention.hpp
      dsl/analysis.hpp dsl/attention.hpp dsl/blocks.hpp dsl/dims.hpp dsl/dsl.hpp dsl/expr.hpp dsl/grad.hpp
      dsl/kv_cache.hpp dsl/layers.hpp dsl/losses.hpp dsl/lower.hpp dsl/masks.hpp dsl/multi_head.hpp dsl/ops.hpp
      dsl/positions.hpp dsl/score_mods.hpp io/npy.hpp io/safetensors.hpp
      ir/bind.hpp ir/dtype.hpp ir/error.hpp ir/gradients.hpp ir/graph.hpp ir/half.hpp ir/op.hpp ir/op_rules.hpp
      ir/passes/passes.hpp ir/printer.hpp ir/shape.hpp ir/storage_plan.hpp ir/tensor.hpp ir/verifier.hpp
      train/init.hpp train/optimizer.hpp train/trainer.hpp)
  list(TRANSFORM QKV_API_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/)
  list(APPEND QKV_API_HEADERS ${PROJECT_SOURCE_DIR}/docs/namespaces.dox)
  list(JOIN QKV_API_HEADERS " " QKV_API_HEADERS_SPACED)
  set(QKV_API_DOCS_DIR ${PROJECT_BINARY_DIR}/api-docs)
  configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${QKV_API_DOCS_DIR}/Doxyfile @ONLY)
  add_custom_target(api-docs COMMAND ${DOXYGEN_EXECUTABLE} ${QKV_API_DOCS_DIR}/Doxyfile
                    COMMAND ${CMAKE_COMMAND} -E echo "API reference: ${QKV_API_DOCS_DIR}/html/index.html (warnings: ${QKV_API_DOCS_DIR}/warnings.log)"
                    DEPENDS ${QKV_API_HEADERS} WORKING_DIRECTORY ${QKV_API_DOCS_DIR} VERBATIM)
  add_test(NAME doc.api_reference COMMAND ${CMAKE_COMMAND} -DDOXYGEN=${DOXYGEN_EXECUTABLE} -DDIR=${QKV_API_DOCS_DIR}
                                          -P ${CMAKE_CURRENT_SOURCE_DIR}/doc/check_api_docs.cmake)
  set_tests_properties(doc.api_reference PROPERTIES TIMEOUT 300)
else()
  add_test(NAME doc.api_reference COMMAND sh -c "echo 'skipped: doxygen not found (apt-get install doxygen)'; exit 77")
  set_tests_properties(doc.api_reference PROPERTIES SKIP_RETURN_CODE 77)
endif()

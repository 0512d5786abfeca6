# The C++ on the README's API screen and on docs/api.md's key-value API compiles: each
# block is cut out of its page at configure time (a change to the page configures again),
# wrapped in a function that declares the names it uses, and built with the tree, so a
# page that drifts from the API breaks the build.
function(doc_snippet page heading out)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${page})
  file(READ ${page} text)
  string(FIND "${text}" "${heading}" at)
  if(at LESS 0)
    message(FATAL_ERROR "${page} has no heading \"${heading}\" (tests/snippets.cmake)")
  endif()
  string(SUBSTRING "${text}" ${at} -1 text)
  string(FIND "${text}" "```cpp\n" open)
  math(EXPR open "${open} + 7")
  string(SUBSTRING "${text}" ${open} -1 text)
  string(FIND "${text}" "```" close)
  string(SUBSTRING "${text}" 0 ${close} code)
  string(REGEX MATCHALL "#include [^\n]*\n" includes "${code}")
  string(REGEX REPLACE "#include [^\n]*\n" "" body "${code}")
  string(REPLACE ";" "" includes "${includes}")
  file(WRITE ${out} "// Cut from ${page} (${heading}) by tests/snippets.cmake: do not edit.\n"
       "#include <actorps/actorps.hpp>\n${includes}\n"
       "void snippet(ps::kv_client& kv, std::vector<float> initial_values, std::vector<float> grad,\n"
       "             std::shared_ptr<std::vector<float>> shared_buffer, std::uint32_t table,\n"
       "             std::vector<std::uint64_t> ids, std::vector<float> grads, std::chrono::milliseconds timeout) {\n"
       "${body}}\n")
endfunction()

doc_snippet(${CMAKE_SOURCE_DIR}/README.md "## The C++ API in one screen" ${CMAKE_BINARY_DIR}/snippets/readme_api.cpp)
doc_snippet(${CMAKE_SOURCE_DIR}/docs/api.md "## The key-value API" ${CMAKE_BINARY_DIR}/snippets/api_kv.cpp)
doc_snippet(${CMAKE_SOURCE_DIR}/docs/api.md "## Waiting for the cluster" ${CMAKE_BINARY_DIR}/snippets/api_wait.cpp)
add_library(doc_snippets OBJECT ${CMAKE_BINARY_DIR}/snippets/readme_api.cpp ${CMAKE_BINARY_DIR}/snippets/api_kv.cpp
                                ${CMAKE_BINARY_DIR}/snippets/api_wait.cpp)
target_link_libraries(doc_snippets PRIVATE actorps)
target_compile_options(doc_snippets PRIVATE -Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-parameter
                                            -Wno-unused-result)

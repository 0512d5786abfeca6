#pragma once
// Running the built programs from a test (working directory: the build tree) and reading
// the JSON lines they print. Shared by test_cluster and test_ctr_backends.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "apps/apps.hpp"

namespace ps::test {

// Runs a command, returns (exit code, stdout+stderr).
inline std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (auto n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The last JSON line of a program's output: the result or status line every program ends with.
inline nlohmann::json last_json(const std::string& out) {
  auto lines = json_lines_of(out);
  REQUIRE_MESSAGE(!lines.empty(), "no JSON line in the output");
  return lines.back();
}

// A worker's result line: the JSON line with this "worker" id and field `has`.
inline nlohmann::json worker_line(const std::string& out, std::uint32_t worker, const std::string& has) {
  for (auto& j : json_lines_of(out))
    if (j.contains(has) && j.value("worker", UINT32_MAX) == worker) return j;
  FAIL("no result line of worker " << worker << " with \"" << has << "\"");
  return {};
}

}  // namespace ps::test

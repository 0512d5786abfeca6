#pragma once
// A node_config parsed from flags, as a program would get it (shared by the tests).
#include <string>
#include <vector>

#include "runtime/node.hpp"

namespace ps::test {

struct parsed_config {
  node_config cfg;
  bool ok;
  explicit parsed_config(std::vector<std::string> flags) {
    std::vector<std::string> store{"test"};
    store.insert(store.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& s : store) argv.push_back(s.data());
    ok = cfg.parse_args(static_cast<int>(argv.size()), argv.data());
  }
};

}  // namespace ps::test

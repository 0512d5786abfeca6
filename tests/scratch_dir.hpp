#pragma once
// A directory on a disk for disk tiers under test (the system's temporary directory), of
// this process alone, removed with everything in it when the test case ends.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "libps/rows/row_disk.hpp"

namespace ps::test {

struct scratch_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("actorps-test-row-disk-" + std::to_string(::getpid()));
  scratch_dir() { std::filesystem::create_directories(path); }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  // Whether a disk tier can live here (direct I/O); says why the test is skipped if not.
  bool holds_disk_tier() const {
    auto why = direct_io_problem(path.string());
    if (!why.empty()) MESSAGE("skipped: " << why);
    return why.empty();
  }
};

}  // namespace ps::test

#pragma once
// Timing helpers of the benchmarks: medians of repeated runs, and runs interleaved with the
// limit loop that a cell is compared with (this VM's bandwidth drifts within a minute).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ps::bench {

using clock_type = std::chrono::steady_clock;

// One result line of a benchmark on stdout, fields in the order given, flushed (a
// script reading the pipe sees each cell as it is measured).
inline void print_line(const nlohmann::ordered_json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

// The median of t; -1 for none.
inline double median(std::vector<double> t) {
  if (t.empty()) return -1;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median seconds of f over `reps` runs, after one warm-up run (page faults, caches).
template <class F>
double median_seconds(int reps, F f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto start = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
  }
  return median(t);
}

// Median seconds of f and of g over `reps` alternating runs each (after one warm-up of each);
// g's times are also appended to g_all.
template <class F, class G>
std::pair<double, double> interleaved(int reps, F f, G g, std::vector<double>& g_all) {
  f();
  g();
  std::vector<double> tf, tg;
  for (int r = 0; r < reps; ++r) {
    auto t0 = clock_type::now();
    f();
    auto t1 = clock_type::now();
    g();
    auto t2 = clock_type::now();
    tf.push_back(std::chrono::duration<double>(t1 - t0).count());
    tg.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  g_all.insert(g_all.end(), tg.begin(), tg.end());
  return {median(tf), median(tg)};
}

}  // namespace ps::bench

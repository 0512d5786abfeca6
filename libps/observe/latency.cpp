#include "libps/observe/latency.hpp"

#include <algorithm>
#include <cmath>

namespace ps {

namespace {

// Bucket b holds [2^(b/4), 2^((b+1)/4)) µs; bucket 0 also everything below 1 µs.
std::size_t bucket_of(double us, std::size_t buckets) {
  if (!(us > 1)) return 0;
  return std::min(buckets - 1, static_cast<std::size_t>(std::log2(us) * 4));
}

// The geometric middle of bucket b, in ms.
double middle_ms(std::size_t b) { return std::pow(2.0, (static_cast<double>(b) + 0.5) / 4) / 1000; }

}  // namespace

void latency_recorder::record(double microseconds) {
  std::lock_guard<std::mutex> guard(mtx_);
  ++counts_[bucket_of(microseconds, buckets)];
  ++total_;
}

latency_summary latency_recorder::take() {
  std::lock_guard<std::mutex> guard(mtx_);
  latency_summary s;
  s.count = total_;
  if (total_ > 0) {
    auto at = [&](double q) {
      const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total_)));
      std::uint64_t seen = 0;
      for (std::size_t b = 0; b < buckets; ++b)
        if ((seen += counts_[b]) >= rank) return middle_ms(b);
      return middle_ms(buckets - 1);
    };
    s.p50_ms = at(0.5);
    s.p99_ms = at(0.99);
  }
  counts_.fill(0);
  total_ = 0;
  return s;
}

}  // namespace ps

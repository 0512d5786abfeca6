#include "apps/ctr/ctr_tower.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "libps/keys/keys.hpp"

namespace ps {

ctr_tower::ctr_tower(std::size_t inputs, std::vector<std::size_t> hidden) {
  if (inputs == 0) throw bad_request("the tower needs at least one input");
  widths_.push_back(inputs);
  for (auto h : hidden) {
    if (h == 0) throw bad_request("a hidden layer of width 0");
    widths_.push_back(h);
  }
  widths_.push_back(1);
  offsets_.push_back(0);
  for (std::size_t l = 0; l + 1 < widths_.size(); ++l)
    offsets_.push_back(offsets_.back() + widths_[l] * widths_[l + 1] + widths_[l + 1]);
}

std::vector<ctr_tower::layer> ctr_tower::layers() const {
  std::vector<layer> out;
  for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
    const auto in = widths_[l], width = widths_[l + 1];
    out.push_back({in, width, offsets_[l], offsets_[l] + in * width});
  }
  return out;
}

void ctr_tower::init(float* params, std::uint64_t seed) const {
  std::mt19937_64 rng(seed);
  auto ls = layers();
  for (std::size_t l = 0; l < ls.size(); ++l) {
    const double bound = std::sqrt(6.0 / static_cast<double>(widths_[l]));
    for (std::size_t i = 0; i < ls[l].in * ls[l].out; ++i)  // raw 53 bits: the same on every platform
      params[ls[l].w_offset + i] = static_cast<float>((static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2 - 1) * bound);
    std::fill_n(params + ls[l].b_offset, ls[l].out, 0.0f);
  }
}

}  // namespace ps

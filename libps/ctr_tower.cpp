#include "libps/ctr_tower.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "libps/keys.hpp"

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
    auto w_size = widths_[l] * widths_[l + 1];
    out.push_back({offsets_[l], w_size, offsets_[l] + w_size, widths_[l + 1]});
  }
  return out;
}

void ctr_tower::init(float* params, std::uint64_t seed) const {
  std::mt19937_64 rng(seed);
  auto ls = layers();
  for (std::size_t l = 0; l < ls.size(); ++l) {
    const double bound = std::sqrt(6.0 / static_cast<double>(widths_[l]));
    for (std::size_t i = 0; i < ls[l].w_size; ++i)  // raw 53 bits: the same on every platform
      params[ls[l].w_offset + i] = static_cast<float>((static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2 - 1) * bound);
    std::fill_n(params + ls[l].b_offset, ls[l].b_size, 0.0f);
  }
}

std::vector<std::vector<float>> ctr_tower::forward(const float* params, const float* x, std::size_t batch) const {
  std::vector<std::vector<float>> acts(widths_.size());
  acts[0].assign(x, x + batch * widths_[0]);
  for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
    const auto in = widths_[l], out = widths_[l + 1];
    const float* w = params + offsets_[l];
    const float* b = w + in * out;
    bool last = l + 2 == widths_.size();
    acts[l + 1].resize(batch * out);
    for (std::size_t s = 0; s < batch; ++s) {
      const float* a = acts[l].data() + s * in;
      for (std::size_t o = 0; o < out; ++o) {
        float z = b[o];
        const float* row = w + o * in;
        for (std::size_t i = 0; i < in; ++i) z += row[i] * a[i];
        acts[l + 1][s * out + o] = last ? z : std::max(z, 0.0f);  // ReLU, the logit as it is
      }
    }
  }
  return acts;
}

double ctr_tower::loss_and_grad(const float* params, const float* x, const float* labels, std::size_t batch,
                                float* grad, float* dx) const {
  std::fill_n(grad, num_params(), 0.0f);
  if (batch == 0) return 0;
  auto acts = forward(params, x, batch);
  double loss = 0;
  std::vector<float> delta(batch);  // d(mean loss)/d(logit)
  for (std::size_t s = 0; s < batch; ++s) {
    double z = acts.back()[s];
    double p = 1 / (1 + std::exp(-z));
    // log(1 + e^z) - y z, computed without overflow
    loss += std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z))) - labels[s] * z;
    delta[s] = static_cast<float>((p - labels[s]) / static_cast<double>(batch));
  }
  for (std::size_t l = widths_.size() - 1; l-- > 0;) {
    const auto in = widths_[l], out = widths_[l + 1];
    const float* w = params + offsets_[l];
    float* gw = grad + offsets_[l];
    float* gb = gw + in * out;
    std::vector<float> below(batch * in, 0.0f);
    for (std::size_t s = 0; s < batch; ++s) {
      const float* a = acts[l].data() + s * in;
      float* d_in = below.data() + s * in;
      for (std::size_t o = 0; o < out; ++o) {
        float d = delta[s * out + o];
        if (d == 0) continue;
        gb[o] += d;
        float* grow = gw + o * in;
        const float* row = w + o * in;
        for (std::size_t i = 0; i < in; ++i) {
          grow[i] += d * a[i];
          d_in[i] += d * row[i];
        }
      }
      if (l > 0)  // through the ReLU below
        for (std::size_t i = 0; i < in; ++i)
          if (a[i] <= 0) d_in[i] = 0;
    }
    delta = std::move(below);
  }
  std::copy(delta.begin(), delta.end(), dx);
  return loss / static_cast<double>(batch);
}

void ctr_tower::predict(const float* params, const float* x, std::size_t batch, double* probabilities) const {
  auto acts = forward(params, x, batch);
  for (std::size_t s = 0; s < batch; ++s) probabilities[s] = 1 / (1 + std::exp(-static_cast<double>(acts.back()[s])));
}

}  // namespace ps

#include "apps/ctr/ctr_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "libps/keys/hash.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

namespace {

// A weight in about [-1, 1], a function of (seed, field, id) only.
double weight_of(std::uint64_t seed, std::size_t field, std::uint64_t id) {
  auto bits = mix64(seed ^ mix64((static_cast<std::uint64_t>(field) << 40) ^ id)) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53 * 2.0 - 1.0;
}

// The categorical value written for rank `rank` of field `field`: a 32-bit hex id that
// looks arbitrary but gives its rank back (rank_of), so the truth can tell head from tail.
std::uint32_t field_mask(std::uint64_t seed, std::size_t field) {
  return static_cast<std::uint32_t>(mix64(seed * 31 + field * 1000003));
}
std::uint32_t value_of(std::uint64_t seed, std::size_t field, std::uint64_t rank) {
  return static_cast<std::uint32_t>(rank) ^ field_mask(seed, field);
}
std::uint64_t rank_of(std::uint64_t seed, std::size_t field, std::uint32_t value) {
  return value ^ field_mask(seed, field);
}

}  // namespace

double auc(const std::vector<double>& scores, const std::vector<float>& labels) {
  if (scores.size() != labels.size())
    throw bad_request("auc: " + std::to_string(scores.size()) + " scores for " + std::to_string(labels.size()) + " labels");
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return scores[a] < scores[b]; });
  double positives = 0, rank_sum = 0;
  for (std::size_t i = 0; i < order.size();) {  // average ranks over ties
    std::size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    double rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;
    for (std::size_t k = i; k < j; ++k)
      if (labels[order[k]] > 0.5f) {
        positives += 1;
        rank_sum += rank;
      }
    i = j;
  }
  double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

double logloss(const std::vector<double>& probabilities, const std::vector<float>& labels) {
  if (probabilities.size() != labels.size() || probabilities.empty())
    throw bad_request("logloss: " + std::to_string(probabilities.size()) + " probabilities for " +
                      std::to_string(labels.size()) + " labels");
  double sum = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    double p = std::clamp(probabilities[i], 1e-7, 1 - 1e-7);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return sum / static_cast<double>(labels.size());
}

namespace {

// log1p(x) / x and expm1(x) / x, by their series near 0 where the quotients lose digits.
double log1p_over(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x)); }
double expm1_over(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1 + x * 0.5 * (1 + x * (1.0 / 3) * (1 + 0.25 * x));
}

}  // namespace

zipf_sampler::zipf_sampler(std::uint64_t n, double exponent) : n_(n), exponent_(exponent) {
  if (n == 0) throw bad_request("zipf: the vocabulary must hold at least one id");
  if (!(exponent > 0)) throw bad_request("zipf: the exponent must be > 0");
  h_integral_first_ = h_integral(1.5) - 1;
  h_integral_end_ = h_integral(static_cast<double>(n) + 0.5);
  squeeze_ = 2 - h_integral_inverse(h_integral(2.5) - h(2));
}

double zipf_sampler::h(double x) const { return std::exp(-exponent_ * std::log(x)); }

// (x^(1 - s) - 1) / (1 - s), which is log x at s = 1, written so that s near 1 keeps its digits.
double zipf_sampler::h_integral(double x) const {
  const double log_x = std::log(x);
  return expm1_over((1 - exponent_) * log_x) * log_x;
}

double zipf_sampler::h_integral_inverse(double y) const {
  const double t = std::max(-1.0, y * (1 - exponent_));
  return std::exp(log1p_over(t) * y);
}

// Draws a point under the hat (the area under h from 1.5 to n + 0.5, plus the whole
// first rank) by inversion, and keeps its rank unless it fell outside the rank's own area.
std::uint64_t zipf_sampler::operator()(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> uniform(0, 1);
  while (true) {
    const double u = h_integral_end_ + uniform(rng) * (h_integral_first_ - h_integral_end_);
    const double x = h_integral_inverse(u);
    const auto k = std::clamp<std::uint64_t>(static_cast<std::uint64_t>(x + 0.5), 1, n_);
    const double rank = static_cast<double>(k);
    if (rank - x <= squeeze_ || u >= h_integral(rank + 0.5) - h(rank)) return k;
  }
}

double ctr_truth::logit(const criteo_row& row) const {
  double z = -1.5;  // a click rate of roughly one in five
  for (std::size_t f = 0; f < criteo_cat_fields; ++f) {
    if (!row.cats[f]) continue;
    if (auto rank = rank_of(seed, f, *row.cats[f]); rank <= head) z += 0.6 * weight_of(seed, f, rank);
  }
  // Two interactions, fields 0 x 1 and 2 x 3, between ids of their heads.
  for (std::size_t f : {0u, 2u}) {
    if (!row.cats[f] || !row.cats[f + 1]) continue;
    auto a = rank_of(seed, f, *row.cats[f]), b = rank_of(seed, f + 1, *row.cats[f + 1]);
    if (a <= interaction_head && b <= interaction_head) z += weight_of(seed + 7, f, a << 32 | b);
  }
  for (std::size_t i = 0; i < 3; ++i)
    if (row.ints[i]) z += 0.2 * weight_of(seed + 13, i, 0) * std::log1p(static_cast<double>(*row.ints[i]));
  return z;
}

ctr_truth::sample ctr_truth::draw(std::mt19937_64& rng, const zipf_sampler& ids) const {
  sample s;
  std::uniform_real_distribution<double> unit(0, 1);
  for (std::size_t i = 0; i < criteo_int_fields; ++i)
    if (unit(rng) > 0.2) s.row.ints[i] = static_cast<std::int64_t>(std::floor(std::exp(unit(rng) * 6)));
  for (std::size_t f = 0; f < criteo_cat_fields; ++f)
    if (unit(rng) > 0.1) s.row.cats[f] = value_of(seed, f, ids(rng));
  // The click is the noise: drawn from the row's true probability.
  s.probability = 1 / (1 + std::exp(-logit(s.row)));
  s.row.label = unit(rng) < s.probability ? 1.0f : 0.0f;
  return s;
}

std::string criteo_line(const criteo_row& row) {
  std::string out = row.label > 0.5f ? "1" : "0";
  char hex[16];
  for (const auto& v : row.ints) {
    out += '\t';
    if (v) out += std::to_string(*v);
  }
  for (const auto& v : row.cats) {
    out += '\t';
    if (v) {
      std::snprintf(hex, sizeof hex, "%08x", *v);
      out += hex;
    }
  }
  return out;
}

}  // namespace ps

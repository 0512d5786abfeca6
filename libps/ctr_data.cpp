#include "libps/ctr_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "libps/hash.hpp"
#include "libps/keys.hpp"

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

zipf_sampler::zipf_sampler(std::uint64_t n, double exponent) {
  if (n == 0) throw bad_request("zipf: the vocabulary must hold at least one id");
  if (!(exponent > 0)) throw bad_request("zipf: the exponent must be > 0");
  cdf_.resize(n);
  double sum = 0;
  for (std::uint64_t k = 0; k < n; ++k) cdf_[k] = sum += std::pow(static_cast<double>(k + 1), -exponent);
  for (auto& c : cdf_) c /= sum;
  if (n > UINT32_MAX) throw bad_request("zipf: at most 2^32 - 1 ids");
  const auto m = std::min<std::uint64_t>(n, std::uint64_t{1} << 22);
  guide_.resize(m + 1);
  for (std::uint64_t j = 0; j <= m; ++j) {
    const double step = static_cast<double>(j) / static_cast<double>(m);
    guide_[j] = static_cast<std::uint32_t>(std::lower_bound(cdf_.begin(), cdf_.end(), step) - cdf_.begin());
  }
}

std::uint64_t zipf_sampler::operator()(std::mt19937_64& rng) const {
  double u = std::uniform_real_distribution<double>(0, 1)(rng);
  // The rank a search of the whole table finds, since cdf_ rises: between where it crosses
  // the steps below and above u (one step wider each way, for u * m's rounding).
  const auto m = guide_.size() - 1;
  const auto j = std::min<std::size_t>(m - 1, static_cast<std::size_t>(u * static_cast<double>(m)));
  const auto first = cdf_.begin() + guide_[j == 0 ? 0 : j - 1];
  const auto last = cdf_.begin() + std::min<std::size_t>(std::size_t{guide_[std::min(j + 2, m)]} + 1, cdf_.size());
  return static_cast<std::uint64_t>(std::lower_bound(first, last, u) - cdf_.begin()) + 1;
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

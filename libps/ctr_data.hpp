#pragma once
// Click-prediction data with a known answer (gen_ctr): categorical ids per field drawn
// from a Zipf law over a vocabulary, integer features, and a click drawn (the noise) from
// a logistic model over per-id weights, two field interactions and three integers. The true click
// probability of each row is known, so the best AUC any model can reach on a test set
// (the Bayes AUC) is known too. Plus the metrics train_ctr reports: AUC and log loss.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "libps/criteo.hpp"

namespace ps {

// ROC AUC of scores against 0/1 labels (ties count one half); 0.5 when one class is
// missing. Throws bad_request for sizes that differ.
double auc(const std::vector<double>& scores, const std::vector<float>& labels);
// Mean log loss of probabilities (clamped to [1e-7, 1 - 1e-7]) against 0/1 labels.
double logloss(const std::vector<double>& probabilities, const std::vector<float>& labels);

// Ranks 1..n with P(k) proportional to k^-exponent (inverse CDF over a table of n). A
// guide table (where the CDF crosses each of m even steps) narrows each search to a few
// neighbouring entries: a plain binary search over 10^7 entries took ~23 cache misses a
// draw, and bench_sparse's load generator competed with the shard for the same 2 cores.
class zipf_sampler {
 public:
  zipf_sampler(std::uint64_t n, double exponent);  // throws bad_request for n = 0 or exponent <= 0
  std::uint64_t operator()(std::mt19937_64& rng) const;
 private:
  std::vector<double> cdf_;
  std::vector<std::uint32_t> guide_;  // guide_[j]: the first k with cdf_[k] >= j / m (m + 1 entries)
};

// The truth is learnable by design: each field's `head` most frequent ids carry a weight
// of their own and the long tail none (an id seen a handful of times in a million rows
// could not be learned by any model, and the Bayes AUC would then be out of every
// model's reach), and the two interactions act between ids among the top
// `interaction_head` of their fields (others: none).
struct ctr_truth {
  std::uint64_t vocabulary = 100000;
  double zipf = 1.1;
  std::uint64_t seed = 1;
  std::uint64_t head = 200;
  std::uint64_t interaction_head = 10;
  // A row of Criteo's format and its true click probability.
  struct sample {
    criteo_row row;
    double probability = 0;
  };
  // The i-th row of a stream (train and test use different streams): the same for a seed.
  sample draw(std::mt19937_64& rng, const zipf_sampler& ids) const;
  // The model's logit for a row's features.
  double logit(const criteo_row& row) const;
};

// criteo_row as a TSV line (missing fields empty).
std::string criteo_line(const criteo_row& row);

}  // namespace ps

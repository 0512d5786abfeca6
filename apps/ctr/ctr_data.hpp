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

#include "apps/ctr/criteo.hpp"

namespace ps {

// ROC AUC of scores against 0/1 labels (ties count one half); 0.5 when one class is
// missing. Throws bad_request for sizes that differ.
double auc(const std::vector<double>& scores, const std::vector<float>& labels);
// Mean log loss of probabilities (clamped to [1e-7, 1 - 1e-7]) against 0/1 labels.
double logloss(const std::vector<double>& probabilities, const std::vector<float>& labels);

// Ranks 1..n with P(k) proportional to k^-exponent, by rejection-inversion (Hörmann and
// Derflinger, 1996, as Apache Commons RNG samples Zipf): a few log/exp a draw and no
// table. The inverse-CDF table it replaced took 8 bytes a rank (816 MB in bench_sparse's
// worker at 10^8 rows), and its draws, with a cache miss or two in the table each, took
// 8% of the 2 cores in a bench_sparse cell, beside the shard it loads (BENCHMARKS.md).
class zipf_sampler {
 public:
  zipf_sampler(std::uint64_t n, double exponent);  // throws bad_request for n = 0 or exponent <= 0
  std::uint64_t operator()(std::mt19937_64& rng) const;

 private:
  double h(double x) const;                   // x^-exponent: the law's density, unnormalized
  double h_integral(double x) const;          // an antiderivative of h
  double h_integral_inverse(double y) const;  // its inverse
  std::uint64_t n_;
  double exponent_;
  double h_integral_first_;  // h_integral(1.5) - 1: the start of the area drawn from
  double h_integral_end_;    // h_integral(n + 0.5): its end
  double squeeze_;           // a draw this close to its rank is accepted without the test
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

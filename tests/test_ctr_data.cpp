// Synthetic click data and its metrics (apps/ctr/ctr_data.hpp).
#include <doctest/doctest.h>

#include <cmath>

#include "apps/ctr/ctr_data.hpp"
#include "libps/keys/keys.hpp"

using namespace ps;

TEST_CASE("auc and logloss on cases worked by hand") {
  CHECK(auc({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}) == doctest::Approx(0.75));
  CHECK(auc({0.9, 0.8, 0.2, 0.1}, {1, 1, 0, 0}) == 1.0);
  CHECK(auc({0.5, 0.5, 0.5, 0.5}, {1, 0, 1, 0}) == 0.5);  // ties count one half
  CHECK(auc({0.3, 0.7}, {1, 1}) == 0.5);                  // one class only
  CHECK(logloss({0.5, 0.5}, {1, 0}) == doctest::Approx(std::log(2.0)));
  CHECK(logloss({1.0}, {0}) == doctest::Approx(-std::log(1e-7)));  // clamped, not infinite
  CHECK_THROWS_AS(auc({0.1}, {1, 0}), bad_request);
}

TEST_CASE("zipf sampler: rank 1 is the most frequent, at about its share") {
  zipf_sampler z(1000, 1.1);
  std::mt19937_64 rng(3);
  std::vector<int> seen(1001);
  for (int i = 0; i < 100000; ++i) ++seen[z(rng)];
  double h = 0;
  for (int k = 1; k <= 1000; ++k) h += std::pow(k, -1.1);
  CHECK(seen[1] / 100000.0 == doctest::Approx(1 / h).epsilon(0.05));
  CHECK(seen[1] > seen[2]);
  CHECK(seen[2] > seen[10]);
  CHECK_THROWS_AS(zipf_sampler(0, 1.1), bad_request);
}

TEST_CASE("zipf sampler: ranks come at their shares k^-s / H(n, s), near s = 1 too, never outside 1..n") {
  // Shares within 3% for ranks drawn often, and the tail beyond rank 100 as a whole.
  for (auto [n, s] : {std::pair<std::uint64_t, double>{1, 1.05}, {7, 0.8}, {5000, 1.0}, {5000, 1.05}, {5000, 1.2},
                      {(1ull << 22) + 123, 1.05}}) {
    CAPTURE(n);
    CAPTURE(s);
    zipf_sampler z(n, s);
    double h = 0;
    for (std::uint64_t k = 1; k <= n; ++k) h += std::pow(static_cast<double>(k), -s);
    std::mt19937_64 rng(11);
    const int draws = 400000;
    std::vector<double> seen(11, 0);
    double beyond_100 = 0;
    for (int i = 0; i < draws; ++i) {
      auto k = z(rng);
      REQUIRE(k >= 1);
      REQUIRE(k <= n);
      if (k <= 10) ++seen[k];
      if (k > 100) ++beyond_100;
    }
    for (std::uint64_t k = 1; k <= std::min<std::uint64_t>(n, 10); ++k)
      CHECK(seen[k] / draws == doctest::Approx(std::pow(static_cast<double>(k), -s) / h).epsilon(0.03));
    double tail = 0;
    for (std::uint64_t k = 101; k <= n; ++k) tail += std::pow(static_cast<double>(k), -s);
    CHECK(beyond_100 / draws == doctest::Approx(tail / h).epsilon(0.03));
  }
  CHECK_THROWS_AS(zipf_sampler(5, 0.0), bad_request);
}

TEST_CASE("ctr truth: rows are Criteo lines, the same for a seed, and the true probability ranks clicks well") {
  ctr_truth truth{5000, 1.1, 9};
  zipf_sampler ids(5000, 1.1);
  std::mt19937_64 a(1), b(1);
  std::vector<double> p;
  std::vector<float> y;
  for (int i = 0; i < 20000; ++i) {
    auto s = truth.draw(a, ids);
    auto t = truth.draw(b, ids);
    REQUIRE(criteo_line(s.row) == criteo_line(t.row));  // deterministic for a seed
    auto back = parse_criteo_line(criteo_line(s.row), "generated");  // a valid line of the format
    CHECK(back.label == s.row.label);
    CHECK(truth.logit(back) == truth.logit(s.row));
    p.push_back(s.probability);
    y.push_back(s.row.label);
  }
  double bayes = auc(p, y);
  MESSAGE("bayes AUC of 20000 generated rows: " << bayes);
  CHECK(bayes > 0.65);  // the features carry signal ...
  CHECK(bayes < 0.95);  // ... and the clicks noise
}

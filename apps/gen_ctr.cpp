// gen_ctr: synthetic click logs in Criteo's TSV format from a known ground truth
// (apps/ctr/ctr_data.hpp), so train_ctr's accuracy can be checked without the real data.
//   gen_ctr --out=DIR [--train-rows=N] [--test-rows=N] [--vocabulary=N] [--zipf=A] [--seed=S]
// writes DIR/train.tsv, DIR/test.tsv and DIR/truth.json, whose bayes_auc is the AUC of
// the true click probabilities on the test rows: what a perfect model would reach.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/ctr/ctr_data.hpp"
#include "libps/keys/keys.hpp"
#include "libps/observe/text.hpp"

namespace {

struct options {
  std::string out;
  // 4,000,000: what train_ctr's defaults need to come within 0.01 of bayes_auc (docs/click-prediction.md).
  std::uint64_t train_rows = 4000000, test_rows = 100000, vocabulary = 100000, seed = 1;
  std::uint64_t head = ps::ctr_truth{}.head, interaction_head = ps::ctr_truth{}.interaction_head;
  double zipf = 1.1;
};

options parse(int argc, char** argv) {
  options o;
  std::map<std::string, std::uint64_t*> counts{{"--train-rows", &o.train_rows}, {"--test-rows", &o.test_rows},
                                               {"--vocabulary", &o.vocabulary}, {"--seed", &o.seed},
                                               {"--head", &o.head}, {"--interaction-head", &o.interaction_head}};
  for (const auto& arg : ps::split_flags(argc, argv)) {
    const auto& flag = arg.name;
    if (flag == "--help") {
      std::printf("gen_ctr --out=DIR [--train-rows=4000000] [--test-rows=100000] [--vocabulary=100000] "
                  "[--zipf=1.1] [--seed=1] [--head=%llu] [--interaction-head=%llu]\n",
                  static_cast<unsigned long long>(o.head), static_cast<unsigned long long>(o.interaction_head));
      std::exit(0);
    }
    const auto& value = arg.needed();
    if (flag == "--out") {
      o.out = value;
    } else if (flag == "--zipf") {
      auto v = ps::parse_number(value);
      if (!v || *v <= 0) throw ps::bad_request("--zipf=" + value + " is not a number > 0");
      o.zipf = *v;
    } else if (auto it = counts.find(flag); it != counts.end()) {
      auto v = ps::parse_count(value);
      if (!v) throw ps::bad_request(flag + "=" + value + " is not a count");
      *it->second = *v;
    } else {
      throw ps::bad_request("unknown flag " + flag + " (--help lists them)");
    }
  }
  if (o.out.empty()) throw ps::bad_request("--out=DIR is required");
  if (o.test_rows == 0 || o.train_rows == 0) throw ps::bad_request("--train-rows and --test-rows must be >= 1");
  return o;
}

// Writes `rows` rows of stream `stream` to path; returns the test metrics' inputs.
void write_rows(const std::string& path, std::uint64_t rows, const ps::ctr_truth& truth, const ps::zipf_sampler& ids,
                std::uint64_t stream, std::vector<double>* probabilities, std::vector<float>* labels) {
  std::ofstream f(path);
  if (!f) throw ps::bad_request("cannot create " + path + ": " + std::strerror(errno));
  std::mt19937_64 rng(truth.seed * 1000003 + stream);
  for (std::uint64_t i = 0; i < rows; ++i) {
    auto s = truth.draw(rng, ids);
    f << ps::criteo_line(s.row) << '\n';
    if (probabilities) {
      probabilities->push_back(s.probability);
      labels->push_back(s.row.label);
    }
    if ((i + 1) % 1000000 == 0) std::fprintf(stderr, "gen_ctr: %s: %llu rows\n", path.c_str(), static_cast<unsigned long long>(i + 1));
  }
  if (!f.flush()) throw ps::bad_request("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto o = parse(argc, argv);
    std::filesystem::create_directories(o.out);
    ps::ctr_truth truth{o.vocabulary, o.zipf, o.seed, o.head, o.interaction_head};
    ps::zipf_sampler ids(o.vocabulary, o.zipf);
    write_rows(o.out + "/train.tsv", o.train_rows, truth, ids, 1, nullptr, nullptr);
    std::vector<double> p;
    std::vector<float> y;
    write_rows(o.out + "/test.tsv", o.test_rows, truth, ids, 2, &p, &y);
    double clicks = 0;
    for (auto v : y) clicks += v;
    nlohmann::ordered_json out{{"train_rows", o.train_rows}, {"test_rows", o.test_rows}, {"vocabulary", o.vocabulary},
                               {"zipf", o.zipf},           {"seed", o.seed},           {"head", o.head},
                               {"interaction_head", o.interaction_head},               {"bayes_auc", ps::auc(p, y)},
                               {"bayes_logloss", ps::logloss(p, y)}, {"test_click_rate", clicks / y.size()}};
    std::ofstream(o.out + "/truth.json") << out.dump() << '\n';
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gen_ctr: %s\n", e.what());
    return 2;
  }
}

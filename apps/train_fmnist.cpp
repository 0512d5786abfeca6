// train_fmnist: data-parallel training on Fashion-MNIST with the parameters on ActorPS
// server shards. Shows progress on stderr; the last stdout line is one JSON object.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "apps/apps.hpp"
#include "libps/consistency.hpp"

int main(int argc, char** argv) {
  ps::node_config cfg;
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  ps::apply_runtime_defaults(cfg);
  try {
    auto settings = ps::settings_for_app(cfg, "fmnist");
    auto& rule = settings.rule;
    caf::actor_system sys{cfg};
    std::fprintf(stderr,
                 "train_fmnist: model=%s cluster=%s servers=%zu workers=%zu epochs=%zu lr=%g rule=%s "
                 "consistency=%s staleness=%s pipeline=%s\n",
                 cfg.model.c_str(), cfg.cluster.c_str(), cfg.servers, cfg.workers, cfg.epochs, cfg.lr,
                 ps::update_rule::name(rule.kind), ps::consistency_name(settings.staleness),
                 ps::staleness_to_string(settings.staleness).c_str(), cfg.pipeline.c_str());
    auto res = ps::run_job(sys, cfg, ps::find_app("fmnist"), "fmnist", settings,
                           [](std::uint32_t w, const std::string& text) {
                             if (w == UINT32_MAX)  // from the checkpoint writer: keep the line
                               std::fprintf(stderr, "\r%s\033[K\n", text.c_str());
                             else
                               std::fprintf(stderr, "\r[worker %u] %s\033[K", w, text.c_str());
                           });
    std::fprintf(stderr, "\n");
    if (!res.ok) {
      for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
      return 1;
    }
    // Worker 0 evaluates; samples and training time come from every worker's result.
    double accuracy = -1, train_seconds = 0;
    std::string to_target = "null";
    std::uint64_t samples = 0;
    for (const auto& [w, text] : res.results) {
      auto take = [&](const std::string& field) -> std::string {
        auto at = text.find("\"" + field + "\":");
        if (at == std::string::npos) return {};
        auto from = at + field.size() + 3;
        return text.substr(from, text.find_first_of(",}", from) - from);
      };
      if (auto s = take("samples"); !s.empty()) samples += std::stoull(s);
      if (auto t = take("train_seconds"); !t.empty()) train_seconds = std::max(train_seconds, std::stod(t));
      if (auto a = take("test_accuracy"); !a.empty()) accuracy = std::stod(a);
      if (auto t = take("seconds_to_target"); !t.empty()) to_target = t;
    }
    auto staleness = settings.staleness;
    std::ostringstream out;
    out << "{\"model\":\"" << cfg.model << "\",\"cluster\":\"" << cfg.cluster << "\",\"servers\":" << cfg.servers
        << ",\"workers\":" << cfg.workers << ",\"epochs\":" << cfg.epochs << ",\"lr\":" << cfg.lr
        << ",\"consistency\":\"" << ps::consistency_name(staleness) << "\",\"staleness\":"
        << (staleness == ps::infinite_staleness ? std::string("\"inf\"") : std::to_string(staleness))
        << ",\"pipelined\":" << (cfg.pipeline == "on" ? "true" : "false")
        << ",\"test_accuracy\":" << accuracy << ",\"final_accuracy\":" << accuracy
        << ",\"target_accuracy\":" << cfg.target_accuracy << ",\"seconds_to_target\":" << to_target
        << ",\"train_seconds\":" << train_seconds << ",\"seconds\":" << res.seconds
        << ",\"samples_per_s\":" << (train_seconds > 0 ? samples / train_seconds : 0) << "}";
    std::cout << out.str() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

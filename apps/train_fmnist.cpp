// train_fmnist: data-parallel training on Fashion-MNIST with the parameters on ActorPS
// server shards. Shows progress on stderr; the last stdout line is one JSON object.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "apps/apps.hpp"

int main(int argc, char** argv) {
  ps::node_config cfg;
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  ps::apply_runtime_defaults(cfg);
  try {
    auto rule = ps::rule_from(cfg, ps::default_rule_for_app("fmnist"));
    caf::actor_system sys{cfg};
    std::fprintf(stderr, "train_fmnist: model=%s cluster=%s servers=%zu workers=%zu epochs=%zu lr=%g rule=%s\n",
                 cfg.model.c_str(), cfg.cluster.c_str(), cfg.servers, cfg.workers, cfg.epochs, cfg.lr,
                 ps::update_rule::name(rule.kind));
    auto res = ps::run_job(sys, cfg, ps::find_app("fmnist"), "fmnist", rule,
                           [](std::uint32_t w, const std::string& text) {
                             std::fprintf(stderr, "\r[worker %u] %s\033[K", w, text.c_str());
                           });
    std::fprintf(stderr, "\n");
    if (!res.ok) {
      for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
      return 1;
    }
    // Worker 0 evaluates; total samples come from every worker's result.
    double accuracy = -1;
    std::uint64_t samples = 0;
    for (const auto& [w, text] : res.results) {
      auto take = [&](const std::string& field) -> std::string {
        auto at = text.find("\"" + field + "\":");
        if (at == std::string::npos) return {};
        return text.substr(at + field.size() + 3);
      };
      if (auto s = take("samples"); !s.empty()) samples += std::stoull(s);
      if (auto a = take("test_accuracy"); !a.empty()) accuracy = std::stod(a);
    }
    std::ostringstream out;
    out << "{\"model\":\"" << cfg.model << "\",\"cluster\":\"" << cfg.cluster << "\",\"servers\":" << cfg.servers
        << ",\"workers\":" << cfg.workers << ",\"epochs\":" << cfg.epochs << ",\"lr\":" << cfg.lr
        << ",\"test_accuracy\":" << accuracy << ",\"seconds\":" << res.seconds
        << ",\"samples_per_s\":" << (res.seconds > 0 ? samples / res.seconds : 0) << "}";
    std::cout << out.str() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

// hello_kv: an embedded ActorPS cluster (--servers shards, --workers workers, all in this
// process); worker w pushes w + 1 to 10 keys, then every worker pulls the sums. Exits 0
// when every sum is 1 + 2 + ... + workers.
#include <actorps/actorps.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr ps::key_type num_keys = 10;

std::string hello(ps::worker_context& ctx) {
  auto keys = ps::key_set::single({0, num_keys});
  ctx.kv.push(keys, std::vector<float>(num_keys, static_cast<float>(ctx.id + 1))).get();
  ctx.barrier();  // every worker's push is in
  auto sums = ctx.kv.pull(keys).get();
  ctx.barrier();  // nobody leaves while the other still pulls
  const float expected = ctx.num_workers * (ctx.num_workers + 1) / 2.0f;
  bool right = std::all_of(sums.begin(), sums.end(), [&](float v) { return v == expected; });
  return nlohmann::json{{"worker", ctx.id}, {"sums", sums}, {"right", right}}.dump();
}

}  // namespace

int main(int argc, char** argv) {
  ps::register_app({"hello_kv", "push and pull sums", hello, "sum", "asp",
                    [](const ps::node_config&) { return std::vector<ps::tensor_spec>{{"hello", {0, num_keys}, {num_keys}}}; },
                    {}});
  ps::node_config cfg;
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  cfg.cluster = "embedded";
  caf::actor_system sys{cfg};
  auto res = ps::run_job(sys, cfg, ps::find_app("hello_kv"), "hello_kv", ps::settings_for_app(cfg, "hello_kv"));
  bool right = res.ok && res.results.size() == cfg.workers;
  for (const auto& [w, text] : res.results) {
    std::printf("%s\n", text.c_str());
    right = right && nlohmann::json::parse(text).value("right", false);
  }
  for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
  return right ? 0 : 1;
}

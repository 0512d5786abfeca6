// An update rule an app adds in one file: registered here alone, it is used by a whole job
// (an embedded cluster of 2 shards and 2 workers), travels the wire by its name and is
// named in a checkpoint's header.
#include <doctest/doctest.h>

#include <actorps/actorps.hpp>

#include <algorithm>
#include <filesystem>

#include "libps/persist/checkpoint.hpp"
#include "libps/core/update_rule.hpp"

namespace {

// w += g / 2, and slot 0 counts the gradients each parameter received: a rule with state,
// so that the shards must keep the slot the table says it needs.
void apply_halved_counted(const ps::update_rule&, float* w, float* const* state, const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    w[i] += g[i] / 2;
    state[0][i] += 1;
  }
}

std::size_t one_slot(const ps::update_rule&) { return 1; }

const ps::rule_registration halved_counted{{"halved_counted", "w += g/2; n += 1", one_slot, apply_halved_counted}};

constexpr ps::key_type num_keys = 8;

std::string push_and_pull(ps::worker_context& ctx) {
  auto keys = ps::key_set::single({0, num_keys});
  if (ctx.id == 0) ctx.kv.init(keys, std::vector<float>(num_keys, 0.0f)).get();  // a rule with state starts from init
  ctx.barrier();
  ctx.kv.push(keys, std::vector<float>(num_keys, static_cast<float>(ctx.id + 1))).get();
  ctx.barrier();
  auto values = ctx.kv.pull(keys).get();
  ctx.barrier();
  return nlohmann::json{{"values", values}}.dump();
}

}  // namespace

TEST_CASE("a rule registered from one file is in the table, by name, with its slots") {
  auto names = ps::rule_names();
  CHECK(std::find(names.begin(), names.end(), "halved_counted") != names.end());
  ps::update_rule r;
  r.kind = "halved_counted";
  CHECK(r.state_slots() == 1);
  CHECK(r.kind.name() == "halved_counted");
  CHECK_THROWS_WITH_AS(ps::register_rule({"halved_counted", "again", one_slot, apply_halved_counted}),
                       doctest::Contains("registered already"), ps::bad_request);
  CHECK_THROWS_WITH_AS(ps::register_rule({"no_apply", "", one_slot, nullptr}), doctest::Contains("needs state_slots and apply"),
                       ps::bad_request);
}

TEST_CASE("a job whose servers apply the registered rule") {
  ps::register_app({"halved_job", "pushes under halved_counted", push_and_pull, "halved_counted", "asp",
                    [](const ps::node_config&) { return std::vector<ps::tensor_spec>{{"w", {0, num_keys}, {num_keys}}}; },
                    {}});
  ps::node_config cfg;
  const char* argv[] = {"test_user_rule", "--servers=2", "--workers=2"};
  REQUIRE(cfg.parse_args(3, const_cast<char**>(argv)));
  cfg.cluster = "embedded";
  caf::actor_system sys{cfg};
  auto settings = ps::settings_for_app(cfg, "halved_job");
  CHECK(settings.rule.kind.name() == "halved_counted");
  auto res = ps::run_job(sys, cfg, ps::find_app("halved_job"), "halved_job", settings);
  std::string why = res.reason;
  for (const auto& f : res.failures) why += "; " + f;
  INFO(why);
  REQUIRE(res.ok);
  REQUIRE(res.results.size() == 2);
  for (const auto& [w, text] : res.results) {
    INFO(text);
    auto values = nlohmann::json::parse(text)["values"].get<std::vector<float>>();
    // Workers pushed 1 and 2: under the rule, (1 + 2) / 2 each; under sum it would be 3.
    CHECK(values == std::vector<float>(num_keys, 1.5f));
  }
}

TEST_CASE("a checkpoint names the registered rule and reads it back") {
  auto dir = std::filesystem::temp_directory_path() / ("user-rule-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ps::checkpoint c;
  c.header.model = "halved/job";
  c.header.clock = 3;
  c.header.shard_ids = {0};
  c.header.rule = "halved_counted";
  c.header.state_slots = 1;
  c.shards = {{0, {}, {}, {}, 0}};
  auto back = ps::read_checkpoint(ps::write_checkpoint(dir.string(), c));
  CHECK(back.header.rule == "halved_counted");
  std::filesystem::remove_all(dir);
}

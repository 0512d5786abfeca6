// An update rule an app adds in one file: registered here alone, it is used by a whole job
// (an embedded cluster of 2 shards and 2 workers), travels the wire by its name and is
// named in a checkpoint's header.
#include <doctest/doctest.h>

#include <actorps/actorps.hpp>

#include <algorithm>
#include <filesystem>

#include "actors/messages.hpp"
#include "libps/persist/checkpoint.hpp"
#include "libps/core/update_rule.hpp"
#include "runtime/job_contract.hpp"

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

// w += factor * g + offset: a rule with hyper-parameters of its own, one with a range.
void apply_scaled(const ps::update_rule& r, float* w, float* const*, const float* g, std::size_t n) {
  const float factor = r.param(0), offset = r.param(1);
  for (std::size_t i = 0; i < n; ++i) w[i] += factor * g[i] + offset;
}
std::size_t no_slots(const ps::update_rule&) { return 0; }
void check_scaled(const ps::update_rule& r) {
  if (!(r.param(0) > 0)) throw ps::bad_request("scaled: factor must be > 0");
}
const ps::rule_registration scaled{
  {"scaled", "w += factor*g + offset", no_slots, apply_scaled, {{"factor", 1.0f}, {"offset", 0.0f}}, check_scaled}};

constexpr ps::key_type num_keys = 8;
std::string no_result(ps::worker_context&) { return "{}"; }
[[maybe_unused]] const bool scaled_app = [] {
  ps::register_app({"scaled_job", "a job under the scaled rule", no_result, "scaled", "asp", {}, {}});
  return true;
}();

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

TEST_CASE("a rule's own hyper-parameters: set by name, the rest at their fallbacks, checked by the rule") {
  ps::update_rule r;
  r.kind = "scaled";
  CHECK(r.param(0) == 1.0f);  // none set: the fallbacks
  CHECK(r.params_text() == "factor=1,offset=0");
  r.set_params("offset=0.5");
  CHECK(r.param(0) == 1.0f);
  CHECK(r.param(1) == 0.5f);
  CHECK(r.params_text() == "factor=1,offset=0.5");
  CHECK_THROWS_WITH_AS(r.set_params("scale=2"),
                       doctest::Contains("update rule scaled has no hyper-parameter \"scale\" (it has factor, offset)"),
                       ps::bad_request);
  CHECK_THROWS_WITH_AS(r.set_params("factor=2,factor=3"), doctest::Contains("factor is given twice"), ps::bad_request);
  CHECK_THROWS_WITH_AS(r.set_params("factor=x"), doctest::Contains("factor = \"x\" is not a number"), ps::bad_request);
  CHECK_THROWS_WITH_AS(r.set_params("factor"), doctest::Contains("\"factor\" is not NAME=VALUE"), ps::bad_request);
  r.set_params("factor=-1");
  CHECK_THROWS_WITH_AS(r.validate(), doctest::Contains("scaled: factor must be > 0"), ps::bad_request);
  ps::update_rule sgd;
  sgd.kind = "sgd";
  CHECK(sgd.params_text().empty());
  CHECK_THROWS_WITH_AS(sgd.set_params("alpha=1"), doctest::Contains("(it has none of its own)"), ps::bad_request);
}

TEST_CASE("a rule's own hyper-parameters cross the wire and bind the job's members") {
  ps::update_rule r;
  r.kind = "scaled";
  r.set_params("factor=0.25,offset=-2");
  auto back = ps::rule_msg::from(r).to_rule();
  CHECK(back.param(0) == 0.25f);
  CHECK(back.param(1) == -2.0f);
  ps::node_config job;
  const char* argv[] = {"test_user_rule", "--app=scaled_job", "--ps.rule-params=offset=1"};
  REQUIRE(job.parse_args(3, const_cast<char**>(argv)));
  auto settings = ps::settings_for_app(job, "scaled_job");
  auto spec = ps::spec_of(job, "scaled_job", settings, {});
  CHECK(spec.get("ps.rule-params") == "factor=1,offset=1");
  // The same values written otherwise are the same job; other values are named.
  ps::node_config same, other, bad;
  // (The rule by the app's default or named: the same.)
  const char* same_argv[] = {"m", "--app=scaled_job", "--ps.rule-params=offset=1,factor=1"};
  const char* other_argv[] = {"m", "--ps.rule=scaled", "--ps.rule-params=offset=2"};
  REQUIRE(same.parse_args(3, const_cast<char**>(same_argv)));
  REQUIRE(other.parse_args(3, const_cast<char**>(other_argv)));
  CHECK(spec.differences(ps::given_settings(same)).empty());
  CHECK(ps::describe_differences(spec.differences(ps::given_settings(other))) ==
        "--ps.rule-params=factor=1,offset=2 (the job has factor=1,offset=1)");
  // A value the rule refuses is refused where the flags are read.
  const char* bad_argv[] = {"m", "--ps.rule=scaled", "--ps.rule-params=factor=0"};
  CHECK_FALSE(bad.parse_args(3, const_cast<char**>(bad_argv)));
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

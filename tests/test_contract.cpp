// The job contract end to end in one process: which flags count as given, adopting the
// job's settings, and the coordinator refusing a member whose settings or version differ
// (on CAF's deterministic scheduler).
#include "tests/actor_fixture.hpp"

#include "runtime/node.hpp"
#include "runtime/app_registry.hpp"
#include "runtime/job_contract.hpp"
#include "tests/parsed_config.hpp"

using namespace ps;
using namespace ps::test;

namespace {

std::string no_result(worker_context&) { return "{}"; }

// Two apps of this test's own (the built-in ones live in ps_apps): a training app with
// a flag of its own, and an asynchronous key-value app.
[[maybe_unused]] const bool apps_registered = [] {
  register_app({"contract_train", "sgd under BSP", no_result, "sgd", "bsp", {},
                {{"steps", app_flag_kind::count, "10", "contract_train: steps per worker",
                  [](const node_config& c) { return c.app_count("steps") >= 1 ? "" : "must be >= 1"; }}}});
  register_app({"contract_kv", "sums under ASP", no_result, "sum", "asp", {}, {}});
  return true;
}();

job_spec softmax_spec(const std::vector<std::string>& flags) {
  parsed_config c(flags);
  REQUIRE(c.ok);
  job_settings s{rule_from(c.cfg, "sgd"), c.cfg.staleness_bound("bsp"), {}, 12};
  return spec_of(c.cfg, "contract_train", s, {{"softmax", {0, 7850}, {7850}}});
}

std::string value(const std::vector<job_setting>& given, const std::string& name) {
  for (const auto& g : given)
    if (g.name == name) return g.value;
  return "(absent)";
}

}  // namespace

TEST_CASE("contract: only job settings given on the command line are compared") {
  parsed_config c({"--app=contract_train", "--model=mlp", "--ps.vnodes=64", "--ps.timeout-ms=500", "--lr=0.25"});
  REQUIRE(c.ok);
  auto given = given_settings(c.cfg);
  CHECK(value(given, "app") == "contract_train");
  CHECK(value(given, "model") == "mlp");
  CHECK(value(given, "ps.vnodes") == "64");
  CHECK(value(given, "lr") == "0.25");
  CHECK(value(given, "ps.timeout-ms") == "(absent)");  // a member's own tuning, not the job's
  CHECK(value(given, "epochs") == "(absent)");         // not given: adopted from the job
}

TEST_CASE("contract: the spec holds the effective consistency and rule, and a member adopts what it was not given") {
  auto spec = softmax_spec({"--app=contract_train", "--consistency=ssp", "--staleness=2", "--epochs=3", "--lr=0.05"});
  CHECK(spec.get("consistency") == "ssp");
  CHECK(spec.get("staleness") == "2");
  CHECK(spec.get("ps.rule") == "sgd");
  CHECK(spec.get("epochs") == "3");
  parsed_config member({"--app=contract_train", "--epochs=3"});
  REQUIRE(member.ok);
  CHECK(spec.differences(given_settings(member.cfg)).empty());
  adopt(member.cfg, spec);
  CHECK(member.cfg.lr == 0.05);
  CHECK(member.cfg.staleness_bound("bsp") == 2);
  CHECK(member.cfg.epochs == 3);
  // A member given other values is told every one of them.
  parsed_config other({"--app=contract_train", "--epochs=4", "--consistency=bsp"});
  REQUIRE(other.ok);
  auto text = describe_differences(spec.differences(given_settings(other.cfg)));
  CHECK(text == "--consistency=bsp (the job has ssp), --epochs=4 (the job has 3)");
}

TEST_CASE("contract: an app's own flag is a job setting: in the spec, compared when given, adopted when not") {
  auto spec = softmax_spec({"--app=contract_train", "--steps=25"});
  CHECK(spec.get("steps") == "25");
  parsed_config adopter({"--app=contract_train"});
  REQUIRE(adopter.ok);
  CHECK(adopter.cfg.app_count("steps") == 10);  // the app's default until it adopts the job's
  CHECK(value(given_settings(adopter.cfg), "steps") == "(absent)");
  adopt(adopter.cfg, spec);
  CHECK(adopter.cfg.app_count("steps") == 25);
  parsed_config other({"--app=contract_train", "--steps=30"});
  REQUIRE(other.ok);
  CHECK(describe_differences(spec.differences(given_settings(other.cfg))) == "--steps=30 (the job has 25)");
  // The app's check runs with the built-in ones; a flag no app declares is unknown.
  CHECK_FALSE(parsed_config({"--app=contract_train", "--steps=0"}).ok);
  CHECK_FALSE(parsed_config({"--app=contract_train", "--laps=3"}).ok);
  CHECK_THROWS_WITH_AS(adopter.cfg.app_count("laps"), doctest::Contains("no registered app declares a count flag --laps"),
                       bad_request);
  // Another app may not declare the same flag differently.
  CHECK_THROWS_WITH_AS(register_app({"contract_other", "x", no_result, "sum", "asp", {},
                                     {{"steps", app_flag_kind::number, "1.5", "other steps", {}}}}),
                       doctest::Contains("flag --steps differs from app contract_train's"), bad_request);
}

TEST_CASE("contract: an asynchronous job's spec says so and a member adopts it") {
  parsed_config c({"--app=contract_kv"});
  REQUIRE(c.ok);
  job_settings s{rule_from(c.cfg, "sum"), c.cfg.staleness_bound("asp"), {}, 12};
  auto spec = spec_of(c.cfg, "contract_kv", s, {});
  CHECK(spec.get("staleness") == "inf");
  parsed_config member({"--app=contract_kv"});
  adopt(member.cfg, spec);
  CHECK(member.cfg.staleness_bound("bsp") == infinite_staleness);
}

TEST_CASE("contract: a spec value this build cannot read is refused by name") {
  job_spec spec;
  spec.set("epochs", "many");
  parsed_config member({"--app=contract_train"});
  CHECK_THROWS_WITH_AS(adopt(member.cfg, spec), doctest::Contains("epochs = \"many\""), bad_request);
}

TEST_CASE_FIXTURE(fixture, "contract: the coordinator refuses a member with other settings and, before the job formed, fails it") {
  coordinator_options o;
  o.servers = 1;
  o.workers = 1;
  o.spec = softmax_spec({"--app=contract_train"});
  auto coord = sys.spawn(coordinator, o);
  auto box = std::make_shared<inbox>();
  sched.run();
  auto reply = std::make_shared<caf::error>();
  alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(coord);
    node_info me{"worker", "", 0, 42, {}, 0, 0, protocol_version, {{"model", "mlp"}, {"app", "contract_train"}}};
    self->request(coord, caf::infinite, register_atom::value, me)
      .then([](registration&) {}, [=](caf::error& e) { *reply = e; });
    self->set_down_handler([=](caf::down_msg& dm) { box->messages.push_back(caf::make_message(dm.reason)); });
    return {[](caf::unit_t) {}};
  }));
  sched.run();
  REQUIRE(*reply);
  CHECK(code_of(*reply) == errc::refused);
  CHECK(describe(*reply) == "the coordinator refused worker (pid 42): its settings differ from the job's: "
                            "--model=mlp (the job has softmax)");
  // The coordinator ended the job with the same reason (exit status 1 everywhere), after
  // a grace period for registrations on their way.
  CHECK(box->count<caf::error>() == 0);
  sched.clock().advance_time(std::chrono::seconds(1));
  sched.run();
  REQUIRE(box->count<caf::error>() == 1);
  for (const auto& m : box->messages)
    if (m.match_elements<caf::error>()) {
      CHECK(code_of(m.get_as<caf::error>(0)) == errc::job_failed);
      CHECK(exit_status_of(code_of(m.get_as<caf::error>(0))) == 1);
    }
}

TEST_CASE_FIXTURE(fixture, "contract: a member of another protocol version is refused naming both versions") {
  coordinator_options o;
  o.spec = softmax_spec({"--app=contract_train"});
  auto coord = sys.spawn(coordinator, o);
  auto reply = std::make_shared<caf::error>();
  alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    node_info me{"server", "", 0, 7, {}, 0, 0, protocol_version + 1, {}};
    self->request(coord, caf::infinite, register_atom::value, me)
      .then([](registration&) {}, [=](caf::error& e) { *reply = e; });
    return {[](caf::unit_t) {}};
  }));
  sched.run();
  REQUIRE(*reply);
  CHECK(code_of(*reply) == errc::refused);
  CHECK(describe(*reply).find("protocol version " + std::to_string(protocol_version + 1)) != std::string::npos);
  CHECK(describe(*reply).find("version " + std::to_string(protocol_version) + ")") != std::string::npos);
  sched.clock().advance_time(std::chrono::seconds(1));  // the failed job's grace period ends
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "contract: a registration carries the job's spec and its fingerprint") {
  coordinator_options o;
  o.servers = 1;
  o.workers = 1;
  o.spec = softmax_spec({"--app=contract_train", "--epochs=2"});
  auto coord = sys.spawn(coordinator, o);
  auto slot = register_worker(coord);
  auto shard_reply = std::make_shared<std::optional<registration>>();
  alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    node_info me{"server", "", 0, 7, {}, 0, 0, protocol_version, {{"epochs", "2"}}};
    self->request(coord, caf::infinite, register_atom::value, me).then([=](registration& r) { *shard_reply = r; });
    return {[](caf::unit_t) {}};
  }));
  sched.run();
  REQUIRE(*slot);
  REQUIRE(*shard_reply);
  const auto& m = (*slot)->spec;
  CHECK(m.fingerprint == o.spec.fingerprint());
  auto back = job_spec::from_parts(m.version, m.settings, m.tensors);
  CHECK(back.fingerprint() == m.fingerprint);
  CHECK(back.get("epochs") == "2");
  CHECK(back.tensors().size() == 1);
}

TEST_CASE_FIXTURE(fixture, "contract: the map every member gets spreads the spec's tensors over the shards") {
  coordinator_options o;
  o.servers = 2;
  o.workers = 1;
  o.spec = softmax_spec({"--app=contract_train"});
  o.bucket_bits = partitioner::bucket_bits_for(7850, 2);
  auto coord = sys.spawn(coordinator, o);
  auto worker = register_worker(coord);
  for (int i = 0; i < 2; ++i)
    alive.push_back(sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
      node_info me{"server", "", 0, 7, {}, 0, 0, protocol_version, {}};
      self->request(coord, caf::infinite, register_atom::value, me).then([](registration&) {});
      return {[](caf::unit_t) {}};
    }));
  sched.run();
  REQUIRE(*worker);
  // The client's own map (kv_client routes by map_of): not the default ring, which put
  // all 7,850 keys of 2 buckets on shard 0.
  auto map = map_of((*worker)->view);
  CHECK(map.balanced() == std::vector<key_range>{{0, 7850}});
  std::vector<double> keys(2);
  for (const auto& p : map.split(key_set::single({0, 7850}))) keys[p.shard] += p.keys.size();
  INFO("shard 0: " << keys[0] << " keys, shard 1: " << keys[1]);
  CHECK(std::abs(keys[0] / 3925 - 1) <= 0.10);
  CHECK(std::abs(keys[1] / 3925 - 1) <= 0.10);
}

TEST_CASE("runtime defaults: servers and workers run one scheduler thread unless told otherwise; others CAF's") {
  auto threads = [](std::vector<std::string> flags) {
    parsed_config c(std::move(flags));
    REQUIRE(c.ok);
    apply_runtime_defaults(c.cfg);
    return caf::get_or(c.cfg, "scheduler.max-threads", caf::config_value::integer{0});
  };
  CHECK(threads({"--role=server"}) == 1);
  CHECK(threads({"--role=worker"}) == 1);
  CHECK(threads({"--role=worker", "--scheduler.max-threads=3"}) == 3);
  CHECK(threads({"--role=coordinator"}) == 0);  // not set: CAF's own default
  CHECK(threads({}) == 0);
}

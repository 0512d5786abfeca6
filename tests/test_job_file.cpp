// Job files (runtime/job_file.hpp): an app's part of the job written as JSON and read
// back by a coordinator that does not run the app; bad files refused naming what is wrong.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "runtime/app_registry.hpp"
#include "runtime/job_contract.hpp"
#include "runtime/job_file.hpp"
#include "tests/parsed_config.hpp"

using namespace ps;
using namespace ps::test;

namespace {

// An app with a tensor and a table, as a Python script declares them.
[[maybe_unused]] const bool app_registered = [] {
  app_definition app;
  app.name = "jobfile_rows";
  app.run = [](worker_context&) { return std::string("{}"); };
  app.default_rule = "adam";
  app.default_consistency = "bsp";
  app.tensors = [](const node_config&) { return std::vector<tensor_spec>{{"tower", {0, 1000}, {10, 100}}}; };
  app.tables = [](const node_config&) {
    sparse_table_spec t;
    t.name = "C1";
    t.dim = 8;
    t.rule.kind = "adagrad";
    t.rule.lr = 0.05f;
    t.rule.eps = 0.01f;
    return std::vector<sparse_table_spec>{t};
  };
  register_app(app);
  return true;
}();

job_file described(const std::vector<std::string>& flags) {
  parsed_config c(flags);
  REQUIRE(c.ok);
  auto s = settings_for_app(c.cfg, "jobfile_rows");
  return {"jobfile_rows", s.spec, s.tables};
}

// The file's text for app `app` (one the test process has not registered: declared by it).
std::string renamed(const job_file& f, const std::string& app) {
  auto doc = nlohmann::json::parse(job_file_json(f));
  doc["app"] = app;
  doc["settings"]["app"] = app;
  return doc.dump();
}

std::string refusal(const std::string& text) {
  try {
    parse_job_file(text, "job.json");
  } catch (const bad_request& e) {
    return e.what();
  }
  return "(accepted)";
}

// Why a coordinator refuses the job file `doc` ("(accepted)" when it takes it).
std::string coordinator_refusal(const nlohmann::json& doc) {
  parsed_config c({"--role=coordinator"});
  REQUIRE(c.ok);
  try {
    take_job_file(parse_job_file(doc.dump(), "job.json"), c.cfg);
  } catch (const bad_request& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("a job file round-trips the spec and the tables") {
  auto f = described({"--app=jobfile_rows", "--servers=3", "--lr=0.002"});
  auto back = parse_job_file(job_file_json(f), "job.json");
  CHECK(back.app == "jobfile_rows");
  CHECK(back.spec.fingerprint() == f.spec.fingerprint());
  CHECK(back.spec.get("servers") == "3");
  REQUIRE(back.spec.tensors().size() == 1);
  CHECK(back.spec.tensors()[0].shape == std::vector<std::uint64_t>{10, 100});
  REQUIRE(back.tables.size() == 1);
  CHECK(back.tables[0].name == "C1");
  CHECK(back.tables[0].dim == 8);
  CHECK(back.tables[0].rule.kind.name() == "adagrad");
  CHECK(back.tables[0].rule.eps == doctest::Approx(0.01));
}

TEST_CASE("a coordinator given a job file holds the same job as the app's program") {
  auto f = described({"--app=jobfile_rows", "--workers=3", "--staleness=2"});
  auto text = renamed(f, "jobfile_declared");
  parsed_config c({"--role=coordinator"});
  REQUIRE(c.ok);
  take_job_file(parse_job_file(text, "job.json"), c.cfg);
  CHECK(c.cfg.app == "jobfile_declared");
  CHECK(c.cfg.workers == 3);
  auto s = settings_for_app(c.cfg, "jobfile_declared");
  CHECK(s.spec.get("staleness") == "2");
  CHECK(s.spec.get("ps.rule") == "adam");
  CHECK(s.spec.tensors().size() == 1);
  REQUIRE(s.tables.size() == 1);
  CHECK(s.tables[0].rule.lr == doctest::Approx(0.05));
  // The same settings and tensors: a worker of the app's program meets no difference.
  auto declared = parse_job_file(text, "job.json").spec;
  CHECK(s.spec.differences(declared.settings()).empty());
  CHECK(s.spec.fingerprint() == declared.fingerprint());
  CHECK(find_app_definition("jobfile_declared").summary == "declared by a job file");  // its workers run elsewhere

  SUBCASE("flags given to the coordinator win over the file") {
    parsed_config given({"--role=coordinator", "--workers=5"});
    REQUIRE(given.ok);
    take_job_file(parse_job_file(renamed(f, "jobfile_declared"), "job.json"), given.cfg);
    CHECK(given.cfg.workers == 5);
  }
}

TEST_CASE("bad job files are refused naming the file and what is wrong") {
  auto good = nlohmann::json::parse(job_file_json(described({"--app=jobfile_rows"})));
  CHECK(refusal("{not json").find("job.json is not JSON") != std::string::npos);
  CHECK(refusal("{\"app\": \"x\"}").find("is not a job file") != std::string::npos);
  auto bad_rule = good;
  bad_rule["tables"][0]["rule"] = "adagradd";
  CHECK(refusal(bad_rule.dump()).find("adagradd") != std::string::npos);
  auto bad_dim = good;
  bad_dim["tables"][0]["dim"] = "eight";
  CHECK(refusal(bad_dim.dump()).find("job.json: tables[0]: \"dim\" is \"eight\"") != std::string::npos);
  auto bad_version = good;
  bad_version["version"] = 1;
  CHECK(refusal(bad_version.dump()).find("job.json: ") != std::string::npos);
  auto overlapping = good;
  overlapping["tensors"].push_back({{"name", "again"}, {"begin", 500}, {"size", 10}});
  CHECK(refusal(overlapping.dump()) != "(accepted)");
  auto other_app = good;
  other_app["settings"]["app"] = "fmnist";
  CHECK(refusal(other_app.dump()).find("its setting app is fmnist") != std::string::npos);
  auto negative = good;
  negative["tensors"][0]["size"] = -1;
  CHECK(refusal(negative.dump()).find("tensors[0]: \"size\" is -1, not a non-negative integer") != std::string::npos);
  auto wrong_shape = good;
  wrong_shape["tensors"][0]["shape"] = {10, 99};
  CHECK(refusal(wrong_shape.dump()).find("\"shape\" does not hold \"size\" (1000) values") != std::string::npos);
  auto bool_dim = good;
  bool_dim["tables"][0]["dim"] = true;
  CHECK(refusal(bool_dim.dump()).find("\"dim\" is true") != std::string::npos);
  auto huge_lr = good;
  huge_lr["tables"][0]["lr"] = 1e300;
  CHECK(refusal(huge_lr.dump()).find("\"lr\" is 1e+300, not a finite number") != std::string::npos);
  auto twice = good;
  twice["tables"].push_back(twice["tables"][0]);
  CHECK(refusal(twice.dump()).find("tables[1]: another is named C1 too") != std::string::npos);
  auto format = good;
  format["job_file"] = 2;
  CHECK(refusal(format.dump()).find("job file format 2, this build reads 1") != std::string::npos);
  auto no_settings = good;
  no_settings.erase("settings");
  CHECK(refusal(no_settings.dump()).find("no \"settings\"") != std::string::npos);

  SUBCASE("a program's own app of the file's name must have the file's tensors and tables") {
    auto other = good;
    other["tensors"][0]["size"] = 999;
    other["tensors"][0]["shape"] = {999};
    CHECK(coordinator_refusal(other).find("the job file's tensors differ from those of this program's app "
                                          "jobfile_rows") != std::string::npos);
    parsed_config same({"--role=coordinator"});
    take_job_file(parse_job_file(good.dump(), "job.json"), same.cfg);  // its own description: taken
    CHECK(same.cfg.app == "jobfile_rows");
  }

  SUBCASE("an app flag of the app's own cannot be held by another program") {
    auto own = good;
    own["app"] = "jobfile_own_flag";
    own["settings"]["app"] = "jobfile_own_flag";
    own["settings"]["steps"] = "10";
    CHECK(coordinator_refusal(own).find("steps=10 is a flag of app jobfile_own_flag's own") != std::string::npos);
  }
}

// The job contract's pure part: settings, tensors, fingerprints and differences.
#include <doctest/doctest.h>

#include "libps/core/job_spec.hpp"

using namespace ps;

namespace {
job_spec softmax_job() {
  job_spec s;
  s.set("model", "softmax");
  s.set("lr", "0.1");
  s.set("app", "fmnist");
  s.add_tensor({"softmax", {0, 7850}, {785, 10}});
  return s;
}
}  // namespace

TEST_CASE("job_spec keeps settings sorted and replaces a setting set twice") {
  auto s = softmax_job();
  s.set("lr", "0.2");
  REQUIRE(s.settings().size() == 3);
  CHECK(s.settings()[0].name == "app");
  CHECK(s.settings()[1].name == "lr");
  CHECK(s.get("lr") == "0.2");
  CHECK(!s.get("epochs"));
  CHECK(s.num_keys() == 7850);
}

TEST_CASE("the fingerprint changes with any setting, tensor or version") {
  auto a = softmax_job(), b = softmax_job();
  CHECK(a.fingerprint() == b.fingerprint());
  b.set("lr", "0.10000001");
  CHECK(a.fingerprint() != b.fingerprint());
  auto c = softmax_job();
  c.add_tensor({"extra", {8000, 8001}, {1}});
  CHECK(a.fingerprint() != c.fingerprint());
  auto d = softmax_job();
  d.version = protocol_version + 1;
  CHECK(a.fingerprint() != d.fingerprint());
  // Name and value boundaries count: ("ab","c") is not ("a","bc").
  job_spec e, f;
  e.set("ab", "c");
  f.set("a", "bc");
  CHECK(e.fingerprint() != f.fingerprint());
}

TEST_CASE("differences name every given setting that differs, with both values") {
  auto s = softmax_job();
  CHECK(s.differences({{"model", "softmax"}, {"lr", "0.1"}}).empty());
  auto d = s.differences({{"model", "mlp"}, {"lr", "0.1"}, {"lr2", "x"}});
  REQUIRE(d.size() == 2);
  CHECK(d[0].name == "lr2");
  CHECK(d[0].job_value == "(not set)");
  CHECK(d[1].name == "model");
  CHECK(d[1].job_value == "softmax");
  CHECK(d[1].given_value == "mlp");
  CHECK(describe_differences(d) == "--lr2=x (the job has (not set)), --model=mlp (the job has softmax)");
}

TEST_CASE("tensors must not overlap and their shape must hold their keys") {
  auto s = softmax_job();
  CHECK_THROWS_WITH_AS(s.add_tensor({"b", {7000, 9000}, {2000}}), doctest::Contains("overlaps tensor softmax"),
                       bad_request);
  CHECK_THROWS_WITH_AS(s.add_tensor({"c", {9000, 9010}, {3, 3}}), doctest::Contains("shape holds 9 values, keys 10"),
                       bad_request);
  CHECK_THROWS_AS(s.add_tensor({"d", {5, 5}, {}}), bad_request);
}

TEST_CASE("a spec rebuilt from its parts is the same spec; damaged parts are refused") {
  auto s = softmax_job();
  auto back = job_spec::from_parts(s.version, s.settings(), s.tensors());
  CHECK(back.fingerprint() == s.fingerprint());
  CHECK_THROWS_WITH_AS(job_spec::from_parts(2, {{"a", "1"}, {"a", "2"}}, {}), doctest::Contains("appears twice"),
                       bad_request);
  CHECK_THROWS_AS(job_spec::from_parts(2, {{"", "1"}}, {}), bad_request);
}

TEST_CASE("versions meet only when equal, and the refusal names both") {
  CHECK(version_mismatch(protocol_version, protocol_version).empty());
  auto m = version_mismatch(1, 2);
  CHECK(m.find("protocol version 1") != std::string::npos);
  CHECK(m.find("version 2") != std::string::npos);
}

TEST_CASE("keys outside every declared tensor are named with the tensors beside them") {
  std::vector<tensor_spec> tensors{{"a", {0, 10}, {10}}, {"b", {100, 110}, {10}}};  // sorted by first key
  CHECK(keys_outside({{0, 10}, {100, 110}}, tensors) == "");
  CHECK(keys_outside({{3, 7}}, tensors) == "");
  CHECK(keys_outside({{5, 15}}, tensors) ==
        "keys [10, 15) are outside every declared tensor (nearest: a [0, 10), b [100, 110))");
  CHECK(keys_outside({{50, 60}}, tensors) ==
        "keys [50, 60) are outside every declared tensor (nearest: a [0, 10), b [100, 110))");
  CHECK(keys_outside({{0, 10}, {108, 120}}, tensors) ==
        "keys [110, 120) are outside every declared tensor (nearest: b [100, 110))");
  CHECK(keys_outside({{0, 10}}, {{"x", {0, 4}, {4}}, {"y", {4, 10}, {6}}}) == "");  // across adjacent tensors
  CHECK(keys_outside({{1000, 1001}}, {}) == "");  // nothing declared: no check
}

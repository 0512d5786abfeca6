// Criteo's TSV format (apps/ctr/criteo.hpp): rows with missing fields, malformed lines named
// by file, line and field, gzipped files, and the skip policy.
#include <doctest/doctest.h>

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "apps/ctr/criteo.hpp"
#include "libps/keys/keys.hpp"

using namespace ps;

namespace {

// A line of `label`, then ints and cats as given ("" for missing), padded with missing fields.
std::string line_of(const std::string& label, std::vector<std::string> ints, std::vector<std::string> cats) {
  ints.resize(criteo_int_fields);
  cats.resize(criteo_cat_fields);
  std::string out = label;
  for (const auto& v : ints) out += "\t" + v;
  for (const auto& v : cats) out += "\t" + v;
  return out;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("actorps-criteo-" + std::to_string(::getpid()) + "-" + name)).string();
}

}  // namespace

TEST_CASE("criteo: a line with missing fields parses; each categorical value becomes its field's row id") {
  auto r = parse_criteo_line(line_of("1", {"5", "", "-3"}, {"68fd1e64", "", "80e26c9b"}), "f:1");
  CHECK(r.label == 1.0f);
  REQUIRE(r.ints[0]);
  CHECK(*r.ints[0] == 5);
  CHECK(!r.ints[1]);
  CHECK(*r.ints[2] == -3);
  CHECK(*r.cats[0] == 0x68fd1e64u);
  CHECK(!r.cats[1]);
  CHECK(!r.cats[25]);
  // The same value in two fields is two rows; the same (field, value) always one.
  CHECK(criteo_feature_id(0, 0x68fd1e64u) != criteo_feature_id(1, 0x68fd1e64u));
  CHECK(criteo_feature_id(0, 0x68fd1e64u) == criteo_feature_id(0, 0x68fd1e64u));
  CHECK(parse_criteo_line(line_of("0", {}, {}), "f:2").label == 0.0f);  // everything missing is allowed
}

TEST_CASE("criteo: malformed lines are refused naming file, line and field") {
  CHECK_THROWS_WITH_AS(parse_criteo_line("1\t2\t3", "train.tsv:7"),
                       "train.tsv:7: 3 tab-separated fields, expected 40 (label, 13 integers, 26 categorical ids)",
                       bad_request);
  CHECK_THROWS_WITH_AS(parse_criteo_line(line_of("2", {}, {}), "t:1"), "t:1: label = \"2\" is not 0 or 1", bad_request);
  CHECK_THROWS_WITH_AS(parse_criteo_line(line_of("1", {"", "x7"}, {}), "t:2"), "t:2: I2 = \"x7\" is not an integer",
                       bad_request);
  CHECK_THROWS_WITH_AS(parse_criteo_line(line_of("1", {"99999999999999999999"}, {}), "t:3"),
                       "t:3: I1 = 99999999999999999999 does not fit 64 bits", bad_request);
  CHECK_THROWS_WITH_AS(parse_criteo_line(line_of("1", {}, {"", "", "zz12"}), "t:4"),
                       "t:4: C3 = \"zz12\" is not a hex id of up to 8 digits", bad_request);
  CHECK_THROWS_WITH_AS(parse_criteo_line(line_of("1", {}, {"123456789"}), "t:5"), doctest::Contains("C1 = \"123456789\""),
                       bad_request);
}

TEST_CASE("criteo: a reader streams plain and gzipped files; stop names the bad line, skip counts it") {
  auto plain = temp_path("plain.tsv"), packed = temp_path("packed.tsv.gz");
  const std::string good = line_of("1", {"1"}, {"a"}), bad = line_of("1", {"oops"}, {});
  {
    std::ofstream f(plain);
    f << good << "\n" << bad << "\r\n" << line_of("0", {}, {"b"}) << "\n";  // CRLF tolerated
  }
  {
    gzFile z = gzopen(packed.c_str(), "wb");
    for (int i = 0; i < 1000; ++i) gzputs(z, (good + "\n").c_str());
    gzclose(z);
  }
  criteo_reader skipping(plain, criteo_reader::on_bad_line::skip);
  int rows = 0;
  while (skipping.next()) ++rows;
  CHECK(rows == 2);
  CHECK(skipping.skipped() == 1);
  CHECK(skipping.lines() == 3);
  criteo_reader stopping(plain, criteo_reader::on_bad_line::stop);
  CHECK(stopping.next());
  CHECK_THROWS_WITH_AS(stopping.next(), doctest::Contains("plain.tsv:2: I1 = \"oops\""), bad_request);
  criteo_reader gz(packed, criteo_reader::on_bad_line::stop);
  rows = 0;
  while (auto r = gz.next()) rows += r->label == 1.0f;
  CHECK(rows == 1000);
  // A gzipped file cut short is an error naming the file, not a silent end.
  auto size = std::filesystem::file_size(packed);
  std::filesystem::resize_file(packed, size / 2);
  criteo_reader cut(packed, criteo_reader::on_bad_line::stop);
  CHECK_THROWS_WITH_AS([&] { while (cut.next()) {} }(), doctest::Contains("packed.tsv.gz: cannot read line"), bad_request);
  CHECK_THROWS_WITH_AS(criteo_reader(temp_path("missing.tsv"), criteo_reader::on_bad_line::stop),
                       doctest::Contains("cannot open"), bad_request);
  std::filesystem::remove(plain);
  std::filesystem::remove(packed);
}

#include "apps/ctr/criteo.hpp"

#include <zlib.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "libps/keys/hash.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

namespace {

// Splits at tabs, keeping empty fields.
std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    auto tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) return out;
    start = tab + 1;
  }
}

std::int64_t integer_of(const std::string& text, const std::string& where, std::size_t i) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(text[0])))
    throw bad_request(where + ": I" + std::to_string(i + 1) + " = \"" + text + "\" is not an integer");
  if (errno == ERANGE) throw bad_request(where + ": I" + std::to_string(i + 1) + " = " + text + " does not fit 64 bits");
  return v;
}

std::uint32_t hex_of(const std::string& text, const std::string& where, std::size_t i) {
  bool ok = !text.empty() && text.size() <= 8;
  for (char c : text) ok = ok && std::isxdigit(static_cast<unsigned char>(c));
  if (!ok) throw bad_request(where + ": C" + std::to_string(i + 1) + " = \"" + text + "\" is not a hex id of up to 8 digits");
  return static_cast<std::uint32_t>(std::strtoul(text.c_str(), nullptr, 16));
}

}  // namespace

criteo_row parse_criteo_line(const std::string& line, const std::string& where) {
  auto f = fields_of(line);
  const auto expected = 1 + criteo_int_fields + criteo_cat_fields;
  if (f.size() != expected)
    throw bad_request(where + ": " + std::to_string(f.size()) + " tab-separated fields, expected " +
                      std::to_string(expected) + " (label, 13 integers, 26 categorical ids)");
  criteo_row r;
  if (f[0] != "0" && f[0] != "1") throw bad_request(where + ": label = \"" + f[0] + "\" is not 0 or 1");
  r.label = f[0] == "1" ? 1.0f : 0.0f;
  for (std::size_t i = 0; i < criteo_int_fields; ++i)
    if (!f[1 + i].empty()) r.ints[i] = integer_of(f[1 + i], where, i);
  for (std::size_t i = 0; i < criteo_cat_fields; ++i)
    if (!f[1 + criteo_int_fields + i].empty()) r.cats[i] = hex_of(f[1 + criteo_int_fields + i], where, i);
  return r;
}

std::uint64_t criteo_feature_id(std::size_t field, std::uint32_t value) {
  // Mixed: ids spread over the whole 64-bit space (and over the shards' buckets).
  return mix64((static_cast<std::uint64_t>(field + 1) << 32) | value);
}

// zlib's gz reader reads plain files as they are, so one path serves both.
struct criteo_reader::source {
  gzFile file = nullptr;
};

criteo_reader::criteo_reader(const std::string& path, on_bad_line policy)
    : path_(path), policy_(policy), in_(std::make_unique<source>()) {
  in_->file = gzopen(path.c_str(), "rb");
  if (!in_->file) throw bad_request("cannot open " + path + ": " + std::strerror(errno));
  gzbuffer(in_->file, 1 << 20);
}

criteo_reader::~criteo_reader() {
  if (in_->file) gzclose(in_->file);
}

bool criteo_reader::read_line(std::string& line) {
  line.clear();
  char buf[4096];
  for (;;) {
    if (!gzgets(in_->file, buf, sizeof buf)) {
      int err = 0;
      const char* msg = gzerror(in_->file, &err);
      if (err != Z_OK)  // a .gz cut short: Z_BUF_ERROR, not a silent end
        throw bad_request(path_ + ": cannot read line " + std::to_string(lines_ + 1) + ": " + msg);
      return !line.empty();
    }
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
  }
}

std::optional<criteo_row> criteo_reader::next() {
  std::string line;
  while (read_line(line)) {
    ++lines_;
    if (line.empty()) continue;
    try {
      return parse_criteo_line(line, path_ + ":" + std::to_string(lines_));
    } catch (const bad_request& e) {
      if (policy_ == on_bad_line::stop) throw;
      if (++skipped_ <= 10) std::fprintf(stderr, "skipped %s\n", e.what());
    }
  }
  return std::nullopt;
}

}  // namespace ps

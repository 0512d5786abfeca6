#include "libps/observe/text.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "libps/keys/keys.hpp"

namespace ps {

std::optional<std::uint64_t> parse_count(const std::string& text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return std::nullopt;  // no sign, no space
  errno = 0;
  char* end = nullptr;
  auto v = std::strtoull(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return static_cast<std::uint64_t>(v);
}

std::optional<double> parse_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<std::vector<std::int64_t>> parse_counts(const std::string& text) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  std::vector<std::int64_t> out;
  std::istringstream items(text.substr(1, text.size() - 2));
  for (std::string item; std::getline(items, item, ',');) {
    auto v = parse_count(item);
    if (!v) return std::nullopt;
    out.push_back(static_cast<std::int64_t>(*v));
  }
  return out;
}

std::string setting_text(double v) {
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}
std::string setting_text(std::uint64_t v) { return std::to_string(v); }
std::string setting_text(std::int64_t v) { return std::to_string(v); }
std::string setting_text(const std::vector<std::int64_t>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(v[i]);
  }
  return out + "]";
}

flag_arg split_flag(const std::string& arg) {
  auto eq = arg.find('=');
  if (eq == std::string::npos) return {arg, arg, std::nullopt};
  return {arg, arg.substr(0, eq), arg.substr(eq + 1)};
}

std::vector<flag_arg> split_flags(int argc, char** argv) {
  std::vector<flag_arg> out;
  for (int i = 1; i < argc; ++i) out.push_back(split_flag(argv[i]));
  return out;
}

const std::string& flag_arg::needed() const {
  if (!value) throw bad_request("flag " + text + " needs a value (--name=value)");
  return *value;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  for (std::size_t b = 0;;) {
    auto e = s.find(sep, b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

}  // namespace ps

std::string ps::ms_since(std::chrono::steady_clock::time_point start) {
  return std::to_string(static_cast<long long>(
    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()));
}

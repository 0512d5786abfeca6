#include "libps/text.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

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

}  // namespace ps

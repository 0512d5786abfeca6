#pragma once
// Numbers in flags and specs: the whole text must be the number (no sign on counts, no
// trailing junk, nothing non-finite); nullopt otherwise, so the caller names the flag.
#include <cstdint>
#include <optional>
#include <string>

namespace ps {

std::optional<std::uint64_t> parse_count(const std::string& text);
std::optional<double> parse_number(const std::string& text);

}  // namespace ps

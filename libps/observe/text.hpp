#pragma once
// Numbers in flags and specs: the whole text must be the number (no sign on counts, no
// trailing junk, nothing non-finite); nullopt otherwise, so the caller names the flag.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ps {

std::optional<std::uint64_t> parse_count(const std::string& text);
std::optional<double> parse_number(const std::string& text);
// A list of counts as flags write it: "[4096,65536]" ("[]": none).
std::optional<std::vector<std::int64_t>> parse_counts(const std::string& text);

// The pieces of s between the separators, empty ones included ("a,,b": a, "", b; "": none).
std::vector<std::string> split(const std::string& s, char sep);
// A command-line argument "--name=value" taken apart at its first '=': value is nullopt
// when there is none ("--help"), empty for "--name=".
struct flag_arg {
  std::string text;  // the whole argument
  std::string name;
  std::optional<std::string> value;
  // The value; throws bad_request ("flag --x needs a value (--name=value)") when none.
  const std::string& needed() const;
};
flag_arg split_flag(const std::string& arg);
// The arguments after the program's name, each taken apart.
std::vector<flag_arg> split_flags(int argc, char** argv);
// Whole milliseconds since `start` (steady clock), for news.
std::string ms_since(std::chrono::steady_clock::time_point start);

// A setting's value as the job spec holds it: the shortest text that parses back to the
// same double ("0.1", not "0.10000000000000001"), counts in decimal, lists as "[a,b]".
std::string setting_text(double v);
std::string setting_text(std::uint64_t v);
std::string setting_text(std::int64_t v);
std::string setting_text(const std::vector<std::int64_t>& v);

}  // namespace ps

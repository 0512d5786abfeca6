#pragma once
// Criteo's click-log format (the Display Advertising Challenge's TSV): per line a label
// (0 or 1), 13 integer features and 26 categorical features as 32-bit hex ids, separated
// by tabs; any feature may be empty (missing), and they often are. Files may be gzipped.
// A categorical value becomes a 64-bit row id of its field's embedding table by hashing
// (field, value), so ids of different fields never collide by construction of the table.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ps {

inline constexpr std::size_t criteo_int_fields = 13;
inline constexpr std::size_t criteo_cat_fields = 26;

struct criteo_row {
  float label = 0;
  std::array<std::optional<std::int64_t>, criteo_int_fields> ints{};   // empty: missing
  std::array<std::optional<std::uint32_t>, criteo_cat_fields> cats{};  // empty: missing
};

// One line (without its newline). Throws bad_request naming `where` (file:line), the
// field (I3, C12, label) and what is wrong: too few or too many fields, a label that is
// not 0 or 1, an integer that is not one or does not fit 64 bits, a bad hex id.
criteo_row parse_criteo_line(const std::string& line, const std::string& where);

// The row id of categorical field `field` (0..25) with value `value`.
std::uint64_t criteo_feature_id(std::size_t field, std::uint32_t value);

// Streams rows from a file, plain or gzipped (by its magic bytes, not its name).
// on_bad_line: stop (the first bad line throws, naming file and line) or skip (it is
// counted and named on stderr, at most 10 times). Throws bad_request when the file
// cannot be opened or read.
class criteo_reader {
 public:
  enum class on_bad_line { stop, skip };
  criteo_reader(const std::string& path, on_bad_line policy);
  ~criteo_reader();
  criteo_reader(const criteo_reader&) = delete;
  criteo_reader& operator=(const criteo_reader&) = delete;

  // The next row; nothing at the end of the file.
  std::optional<criteo_row> next();
  std::uint64_t lines() const { return lines_; }
  std::uint64_t skipped() const { return skipped_; }

 private:
  bool read_line(std::string& line);
  std::string path_;
  on_bad_line policy_;
  struct source;
  std::unique_ptr<source> in_;
  std::uint64_t lines_ = 0, skipped_ = 0;
};

}  // namespace ps

#include "libps/persist/checkpoint.hpp"
#include "libps/persist/bounded_archive.hpp"
#include "libps/rows/count_min.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/persist/cereal_types.hpp"
#include "libps/observe/text.hpp"
#include "libps/core/update_rule.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

namespace ps {

template <class Archive>
void serialize(Archive& ar, shard_snapshot& s) {
  ar(s.shard, s.segments, s.tables, s.disk_rows, s.disk_row_count, s.disk_table_rows, s.sightings);
}

namespace {
// A shard's section in files of format versions 2 and 3: no counts per table or of admission.
struct shard_snapshot_v2 {
  shard_snapshot s;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(s.shard, s.segments, s.tables, s.disk_rows, s.disk_row_count);
  }
};

// A shard's section in a file of format version 1: dense tensors only.
struct shard_snapshot_v1 {
  std::uint32_t shard = 0;
  std::vector<stored_segment> segments;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(shard, segments);
  }
};
}  // namespace
template <class Archive>
void serialize(Archive& ar, checkpoint_header& h) {
  ar(h.version, h.model, h.epoch, h.clock, h.shard_ids, h.vnodes, h.bucket_bits);
  if (h.version >= 5) {
    ar(h.rule);
  } else {  // a number; only old files are read this way, none is written
    std::uint8_t code = 0;
    ar(code);
    h.rule = rule_name_of_code(code);
  }
  ar(h.state_slots);
  if (h.version >= 3) ar(h.placement);
}

namespace {

constexpr char magic[8] = {'A', 'P', 'S', 'C', 'K', 'P', 'T', '\0'};
constexpr char end_mark[4] = {'E', 'N', 'D', '\0'};
const char* suffix = ".apsckpt";

std::uint32_t crc_of(const std::string& bytes) {
  return static_cast<std::uint32_t>(
    crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

template <class T>
std::string to_bytes(const T& value) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive ar(out);
    ar(value);
  }
  return out.str();
}

// The inverse of to_bytes; throws bad_request "<what> does not decode: ...".
template <class T>
T from_bytes(const std::string& bytes, const std::string& what) {
  T value;
  try {
    bounded_input_archive ar(bytes);
    ar(value);
  } catch (const std::exception& e) {
    throw bad_request(what + " does not decode: " + e.what());
  }
  return value;
}

template <class T>
void append_pod(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void append_section(std::string& out, const std::string& bytes) {
  append_pod<std::uint64_t>(out, bytes.size());
  out += bytes;
  append_pod<std::uint32_t>(out, crc_of(bytes));
}

// Reads sections back, naming the file and the section on any problem.
struct reader {
  const std::string& path;
  const std::string& data;
  std::size_t at = 0;

  [[noreturn]] void fail(const std::string& what) const { throw bad_request(path + ": " + what); }
  void need(std::size_t n, const std::string& what) const {
    if (data.size() - at < n)
      fail("truncated in " + what + " (" + std::to_string(data.size()) + " bytes in the file)");
  }
  template <class T>
  T pod(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <class T>
  T section(const std::string& what) {
    auto n = pod<std::uint64_t>(what);
    need(n, what);
    auto bytes = data.substr(at, n);
    at += n;
    auto crc = pod<std::uint32_t>(what);
    if (crc != crc_of(bytes)) fail("checksum of " + what + " does not match (corrupt)");
    try {
      return from_bytes<T>(bytes, what);
    } catch (const bad_request& e) {
      fail(e.what());
    }
  }
};

void check_io(bool ok, const std::string& what) {
  if (!ok) throw bad_request(what + ": " + std::strerror(errno));
}

}  // namespace

std::string disk_rows_dir_name(std::uint64_t clock) { return "checkpoint-" + std::to_string(clock) + ".rows"; }

std::string disk_rows_name(std::uint64_t clock, std::uint32_t shard) {
  return saved_rows_path(disk_rows_dir_name(clock), shard);
}

std::string sibling_disk_rows(const std::string& disk_rows, std::uint32_t shard) {
  return saved_rows_path(std::filesystem::path(disk_rows).parent_path().string(), shard);
}

std::string recovery_layout_dir(const std::string& rows_dir, std::uint64_t epoch, std::uint32_t dead) {
  return (std::filesystem::path(rows_dir) / ("for-epoch-" + std::to_string(epoch) + "-shard-" + std::to_string(dead)))
    .string();
}

bool in_recovery_layout(const std::string& disk_rows) {
  return std::filesystem::path(disk_rows).parent_path().filename().string().rfind("for-epoch-", 0) == 0;
}

std::string encode_shard(const shard_snapshot& s) { return to_bytes(s); }

shard_snapshot decode_shard(const std::string& bytes) { return from_bytes<shard_snapshot>(bytes, "shard snapshot"); }

std::string write_checkpoint(const std::string& dir, const checkpoint& c) {
  if (c.shards.size() != c.header.shard_ids.size())
    throw bad_request("checkpoint: " + std::to_string(c.shards.size()) + " shard snapshots for " +
                      std::to_string(c.header.shard_ids.size()) + " shards in the header");
  std::string data(magic, sizeof(magic));
  append_pod<std::uint32_t>(data, checkpoint_format_version);
  append_section(data, to_bytes(c.header));
  for (const auto& s : c.shards) append_section(data, to_bytes(s));
  data.append(end_mark, sizeof(end_mark));
  std::filesystem::create_directories(dir);
  auto final_path = (std::filesystem::path(dir) / ("checkpoint-" + std::to_string(c.header.clock) + suffix)).string();
  auto tmp = final_path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check_io(fd >= 0, "cannot create " + tmp);
  std::size_t done = 0;
  while (done < data.size()) {
    auto n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      check_io(false, "cannot write " + tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  check_io(::fsync(fd) == 0, "cannot fsync " + tmp);
  ::close(fd);
  check_io(::rename(tmp.c_str(), final_path.c_str()) == 0, "cannot rename " + tmp);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {  // the rename itself must survive a crash
    ::fsync(dfd);
    ::close(dfd);
  }
  return final_path;
}

checkpoint read_checkpoint(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw bad_request(path + ": not a regular file");  // reading a directory throws from the stream
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad_request(path + ": cannot open: " + std::strerror(errno));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  reader r{path, data};
  r.need(sizeof(magic), "the file magic");
  if (std::memcmp(data.data(), magic, sizeof(magic)) != 0) r.fail("not an ActorPS checkpoint (bad magic)");
  r.at = sizeof(magic);
  auto version = r.pod<std::uint32_t>("the format version");
  if (version < 1 || version > checkpoint_format_version)
    r.fail("format version " + std::to_string(version) + ", this build reads 1 to " +
           std::to_string(checkpoint_format_version));
  checkpoint c;
  c.header = r.section<checkpoint_header>("the header");
  for (auto id : c.header.shard_ids) {
    auto what = "shard " + std::to_string(id);
    shard_snapshot s;
    if (version == 1) {
      auto old = r.section<shard_snapshot_v1>(what);
      s = {old.shard, std::move(old.segments), {}, {}, 0};
    } else if (version <= 3) {
      s = r.section<shard_snapshot_v2>(what).s;
    } else {
      s = r.section<shard_snapshot>(what);
    }
    if (!s.disk_table_rows.empty() &&
        std::accumulate(s.disk_table_rows.begin(), s.disk_table_rows.end(), std::uint64_t{0}) != s.disk_row_count)
      r.fail(what + ": its disk tier's rows per table do not add up to its " + std::to_string(s.disk_row_count) +
             " rows");
    for (const auto& t : s.tables)
      if (t.stride == 0 || t.rows.size() != t.ids.size() * t.stride)
        r.fail(what + ": table " + std::to_string(t.table) + " holds " + std::to_string(t.rows.size()) +
               " values for " + std::to_string(t.ids.size()) + " rows of " + std::to_string(t.stride));
    if (!s.disk_rows.empty()) {
      s.disk_rows = (std::filesystem::path(path).parent_path() / s.disk_rows).string();
      if (!std::filesystem::is_directory(s.disk_rows))
        r.fail(what + ": its rows on disk, " + s.disk_rows + ", are missing");
    }
    if (s.shard != id) r.fail("shard " + std::to_string(id) + " holds the data of shard " + std::to_string(s.shard));
    c.shards.push_back(std::move(s));
  }
  r.need(sizeof(end_mark), "the end mark");
  if (std::memcmp(data.data() + r.at, end_mark, sizeof(end_mark)) != 0) r.fail("bad end mark (corrupt)");
  if (r.at + sizeof(end_mark) != data.size()) r.fail("trailing bytes after the end mark");
  return c;
}

latest_checkpoint load_latest(const std::string& dir) {
  std::vector<std::pair<std::uint64_t, std::string>> files;
  latest_checkpoint out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) != 0 || !name.ends_with(suffix)) continue;  // .tmp files too
    auto digits = name.substr(11, name.size() - 11 - std::strlen(suffix));
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (auto clock = parse_count(digits))
      files.emplace_back(*clock, e.path().string());
    else
      out.refused.push_back(e.path().string() + ": the clock in its name, " + digits + ", is beyond 2^64");
  }
  if (ec) throw bad_request("cannot read checkpoint directory " + dir + ": " + ec.message());
  std::sort(files.rbegin(), files.rend());
  for (const auto& [clock, path] : files) {
    try {
      out.found = read_checkpoint(path);
      out.path = path;
      return out;
    } catch (const bad_request& e) {
      out.refused.push_back(e.what());
    }
  }
  return out;
}

}  // namespace ps

namespace ps {

std::string non_finite_values(const checkpoint& c) {
  std::uint64_t count = 0;
  std::string first;
  auto scan = [&](const std::vector<float>& v, const std::string& where, auto index_name) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (std::isfinite(v[i])) continue;
      if (count++ == 0) first = where + " " + index_name(i) + " is " + std::to_string(v[i]);
    }
  };
  for (const auto& s : c.shards) {
    const std::string shard = "shard " + std::to_string(s.shard);
    for (const auto& seg : s.segments) {
      scan(seg.values, shard + ":", [&](std::size_t i) { return "key " + std::to_string(seg.begin + i); });
      scan(seg.state, shard + ": optimizer state of", [&](std::size_t i) {
        return "key " + std::to_string(seg.begin + i % std::max<std::size_t>(1, seg.values.size()));
      });
    }
    for (const auto& t : s.tables)
      scan(t.rows, shard + ": table " + std::to_string(t.table), [&](std::size_t i) {
        return "row " + std::to_string(t.ids.at(i / std::max<std::uint32_t>(1, t.stride)));
      });
  }
  if (count == 0) return "";
  return std::to_string(count) + " values are not finite (the first: " + first + ")";
}

std::string unwritable_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return "cannot create directory " + dir + ": " + ec.message();
  if (!std::filesystem::is_directory(dir, ec)) return dir + " is not a directory";
  auto probe = std::filesystem::path(dir) / (".write-probe-" + std::to_string(::getpid()));
  {
    std::ofstream out(probe);
    if (!(out << "probe") || !out.flush()) return "cannot write in " + dir + ": " + std::strerror(errno);
  }
  std::filesystem::remove(probe, ec);
  return "";
}

namespace {

// The part [offset, offset + n) of a segment of `len` keys, its state slots cut alike.
stored_segment slice(const stored_segment& seg, std::uint64_t offset, std::uint64_t n) {
  const auto len = seg.end - seg.begin;
  stored_segment out;
  out.begin = seg.begin + offset;
  out.end = out.begin + n;
  out.values.assign(seg.values.begin() + offset, seg.values.begin() + offset + n);
  for (std::uint64_t slot = 0; len > 0 && slot < seg.state.size() / len; ++slot) {
    auto from = seg.state.begin() + slot * len + offset;
    out.state.insert(out.state.end(), from, from + n);
  }
  return out;
}

// The rows c's shards kept on a disk tier, laid out for map's shards in stores under
// rows_into (out's sections then name them, with their counts).
void lay_out_disk_tiers(const checkpoint& c, const partitioner& map, const std::string& rows_into, checkpoint& out) {
  std::vector<std::string> saved;
  std::vector<std::uint32_t> saved_by;  // the shard each store is of
  std::size_t tables = 0;
  for (const auto& old : c.shards) {
    if (old.disk_rows.empty()) continue;
    const auto shard = "shard " + std::to_string(old.shard) + "'s rows are on a disk tier (" + old.disk_rows + ")";
    if (rows_into.empty())
      throw bad_request(shard + ": they can only be laid out for other shards when a job restores from the checkpoint");
    if (old.disk_table_rows.empty())
      throw bad_request(shard + ", saved before checkpoints counted them per table (format 4): restore it onto as "
                        "many shards as it has");
    saved.push_back(old.disk_rows);
    saved_by.push_back(old.shard);
    tables = std::max(tables, old.disk_table_rows.size());
  }
  if (saved.empty()) return;
  std::vector<std::uint32_t> wanted;
  for (const auto& s : out.shards) wanted.push_back(s.shard);
  auto owner = [&](const row_key& k) -> std::optional<std::uint32_t> {
    auto o = map.row_owner(k.table, k.id);
    if (std::find(wanted.begin(), wanted.end(), o) == wanted.end()) return std::nullopt;  // another shard's
    return o;
  };
  // Rows follow the ring (row_owner): the saved map's is its shards' ring.
  const partitioner was(c.header.epoch, c.header.shard_ids, c.header.vnodes, c.header.bucket_bits);
  auto own = [&](std::size_t i, const row_key& k) { return was.row_owner(k.table, k.id) == saved_by[i]; };
  auto counts = lay_out_saved_rows(saved, tables, owner, wanted, rows_into, own);
  for (auto& s : out.shards) {
    s.disk_rows = saved_rows_path(rows_into, s.shard);
    s.disk_table_rows = counts.at(s.shard);
    s.disk_row_count = std::accumulate(s.disk_table_rows.begin(), s.disk_table_rows.end(), std::uint64_t{0});
  }
}

}  // namespace

checkpoint reshard(const checkpoint& c, const partitioner& map, const std::string& rows_into,
                   std::optional<std::uint32_t> only) {
  checkpoint out;
  out.header = c.header;
  out.header.shard_ids = map.shard_ids();
  std::map<std::uint32_t, std::size_t> index;  // shard id -> its place in out.shards
  for (auto id : map.shard_ids()) {
    index[id] = out.shards.size();
    out.shards.push_back(shard_snapshot{id, {}, {}, {}, 0});
  }
  for (const auto& old : c.shards) {
    if (!old.sightings.empty())  // an id's sightings were counted by its owner: the sum never counts under them
      for (auto& s : out.shards) {
        if (s.sightings.empty()) s.sightings.assign(old.sightings.size(), 0);
        add_counts(s.sightings, old.sightings);
      }
    for (const auto& seg : old.segments)
      if (seg.end > seg.begin)
        for (const auto& p : map.split(key_set::single({seg.begin, seg.end})))
          out.shards[index.at(p.shard)].segments.push_back(slice(seg, p.value_offset, p.keys.size()));
    for (const auto& t : old.tables)
      for (std::size_t r = 0; r < t.ids.size(); ++r) {
        auto& tables = out.shards[index.at(map.row_owner(t.table, t.ids[r]))].tables;
        auto it = std::find_if(tables.begin(), tables.end(), [&](const table_rows& x) { return x.table == t.table; });
        if (it == tables.end()) it = tables.insert(tables.end(), table_rows{t.table, t.stride, {}, {}});
        it->ids.push_back(t.ids[r]);
        it->rows.insert(it->rows.end(), t.rows.begin() + r * t.stride, t.rows.begin() + (r + 1) * t.stride);
      }
  }
  for (auto& s : out.shards)
    std::sort(s.segments.begin(), s.segments.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  if (only) {
    if (!index.count(*only)) throw bad_request("shard " + std::to_string(*only) + " is not in the map laid out for");
    auto section = std::move(out.shards[index.at(*only)]);
    out.shards = {std::move(section)};
  }
  lay_out_disk_tiers(c, map, rows_into, out);
  out.header.placement = map.placement();
  return out;
}

bool same_map(const checkpoint_header& h, const partitioner& map) {
  if (h.shard_ids != map.shard_ids() || h.vnodes != map.vnodes() || h.bucket_bits != map.bucket_bits()) return false;
  if (!h.placement.empty()) return h.placement == map.placement();
  return partitioner(map.epoch(), h.shard_ids, h.vnodes, h.bucket_bits, map.balanced()).placement() == map.placement();
}

checkpoint laid_out_for(checkpoint c, const partitioner& map, const std::string& rows_into,
                        std::optional<std::uint32_t> only) {
  return same_map(c.header, map) ? std::move(c) : reshard(c, map, rows_into, only);
}

}  // namespace ps

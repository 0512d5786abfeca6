#include "libps/persist/checkpoint_export.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "libps/persist/npy.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/rows/sparse_table.hpp"

namespace ps {

namespace {

// A file name from a tensor's or table's name: letters, digits, '_', '-', '.' kept.
std::string file_stem(const std::string& name) {
  std::string out = name;
  for (auto& ch : out)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.')) ch = '_';
  return out.empty() ? "unnamed" : out;
}

// Every shard's dense segments, by first key.
std::vector<const stored_segment*> segments_by_key(const checkpoint& c) {
  std::vector<const stored_segment*> all;
  for (const auto& s : c.shards)
    for (const auto& seg : s.segments) all.push_back(&seg);
  std::sort(all.begin(), all.end(), [](auto a, auto b) { return a->begin < b->begin; });
  return all;
}

// The values of keys [begin, end); throws naming the first key no segment holds.
std::vector<float> values_of(const std::vector<const stored_segment*>& segs, key_range r, const std::string& what) {
  std::vector<float> out;
  out.reserve(r.end - r.begin);
  auto k = r.begin;
  while (k < r.end) {
    auto it = std::upper_bound(segs.begin(), segs.end(), k, [](key_type key, auto s) { return key < s->begin; });
    if (it == segs.begin() || (*std::prev(it))->end <= k)
      throw bad_request("export: the checkpoint has no value for key " + std::to_string(k) + " of " + what);
    const auto* seg = *std::prev(it);
    auto stop = std::min(r.end, seg->end);
    out.insert(out.end(), seg->values.begin() + static_cast<std::ptrdiff_t>(k - seg->begin),
               seg->values.begin() + static_cast<std::ptrdiff_t>(stop - seg->begin));
    k = stop;
  }
  return out;
}

// Runs of consecutive keys, when the job's tensors are not known.
std::vector<key_range> key_runs(const std::vector<const stored_segment*>& segs) {
  std::vector<key_range> runs;
  for (const auto* s : segs) {
    if (!runs.empty() && runs.back().end == s->begin) runs.back().end = s->end;
    else runs.push_back({s->begin, s->end});
  }
  return runs;
}

void export_tables(const checkpoint& c, const std::vector<sparse_table_spec>& tables, const std::string& out_dir,
                   std::vector<exported_file>& files) {
  std::map<std::uint32_t, std::vector<const table_rows*>> by_table;
  std::vector<std::size_t> strides;  // of the job's tables, for rows on a disk tier
  for (const auto& spec : tables) strides.push_back(sparse_table(spec).stride());
  std::deque<std::vector<table_rows>> from_disk;  // rows of shards with a disk tier, loaded (pointers stay valid)
  for (const auto& s : c.shards) {
    if (!s.disk_rows.empty()) {
      if (tables.empty())
        throw bad_request("export: shard " + std::to_string(s.shard) + "'s rows are on a disk tier (" + s.disk_rows +
                          "): give --app=NAME (and its flags) so that the tables' row sizes are known");
      try {
        from_disk.push_back(read_saved_rows(s.disk_rows, strides));
      } catch (const bad_request& e) {
        throw bad_request("export: shard " + std::to_string(s.shard) + "'s rows: " + e.what());
      }
      for (const auto& t : from_disk.back())
        if (!t.ids.empty()) by_table[t.table].push_back(&t);
    }
    for (const auto& t : s.tables) by_table[t.table].push_back(&t);
  }
  for (const auto& [index, parts] : by_table) {
    const auto stride = parts.front()->stride;
    const bool known = index < tables.size();
    const std::uint32_t dim = known ? tables[index].dim : stride;
    if (dim > stride)
      throw bad_request("export: table " + std::to_string(index) + " has rows of " + std::to_string(stride) +
                        " floats, fewer than its dimension " + std::to_string(dim));
    std::vector<std::pair<std::uint64_t, const float*>> rows;
    for (const auto* p : parts)
      for (std::size_t i = 0; i < p->ids.size(); ++i) rows.emplace_back(p->ids[i], p->rows.data() + i * p->stride);
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::uint64_t> ids;
    std::vector<float> values;
    for (const auto& [id, row] : rows) {
      ids.push_back(id);
      values.insert(values.end(), row, row + dim);
    }
    auto stem = file_stem(known ? tables[index].name : "table_" + std::to_string(index));
    write_npy(out_dir + "/" + stem + ".ids.npy", {ids.size()}, ids);
    write_npy(out_dir + "/" + stem + ".npy", {ids.size(), dim}, values);
    files.push_back({stem + ".ids.npy", {ids.size()}, "row ids of table " + stem});
    files.push_back({stem + ".npy", {ids.size(), dim},
                     known ? "rows of table " + stem : "rows of table " + stem + " (value and optimizer state)"});
  }
}

}  // namespace

std::vector<exported_file> export_checkpoint(const checkpoint& c, const std::vector<tensor_spec>& tensors,
                                             const std::vector<sparse_table_spec>& tables,
                                             const std::string& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw bad_request("export: cannot make " + out_dir + ": " + ec.message());
  std::vector<exported_file> files;
  auto segs = segments_by_key(c);
  if (!tensors.empty()) {
    for (const auto& t : tensors) {
      auto shape = t.shape.empty() ? std::vector<std::uint64_t>{t.keys.end - t.keys.begin} : t.shape;
      write_npy(out_dir + "/" + file_stem(t.name) + ".npy", shape, values_of(segs, t.keys, "tensor " + t.name));
      files.push_back({file_stem(t.name) + ".npy", shape, "tensor " + t.name + ", keys " + to_string(t.keys)});
    }
  } else {
    for (auto r : key_runs(segs)) {
      auto name = "keys_" + std::to_string(r.begin) + "_" + std::to_string(r.end) + ".npy";
      write_npy(out_dir + "/" + name, {r.end - r.begin}, values_of(segs, r, "keys " + to_string(r)));
      files.push_back({name, {r.end - r.begin}, "keys " + to_string(r)});
    }
  }
  export_tables(c, tables, out_dir, files);
  nlohmann::ordered_json manifest{{"model", c.header.model}, {"clock", c.header.clock}, {"files", nlohmann::json::array()}};
  for (const auto& f : files) manifest["files"].push_back({{"name", f.name}, {"shape", f.shape}, {"holds", f.holds}});
  std::ofstream m(out_dir + "/manifest.json", std::ios::trunc);
  m << manifest.dump(1) << '\n';
  if (!m) throw bad_request("export: cannot write " + out_dir + "/manifest.json");
  return files;
}

}  // namespace ps

#include "libps/rows/row_disk.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <signal.h>
#include <unistd.h>

#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "libps/keys/keys.hpp"

namespace ps {

namespace fs = std::filesystem;

namespace {

constexpr std::size_t key_size = 12;  // table (4 bytes) then id (8), big-endian: sorted by table, then id

void encode_key(const row_key& k, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(k.table >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) out[4 + i] = static_cast<char>(k.id >> (56 - 8 * i));
}

// The row id of a key encode_key made.
std::uint64_t decode_id(const char* key) {
  std::uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id = id << 8 | static_cast<unsigned char>(key[4 + i]);
  return id;
}

rocksdb::Options store_options() {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.error_if_exists = true;
  o.use_direct_reads = true;  // misses of the RAM tier go to the device, not the page cache
  o.use_direct_io_for_flush_and_compaction = true;
  o.compression = rocksdb::kNoCompression;  // float rows barely compress; the CPU is better spent training
  o.write_buffer_size = 32 << 20;
  o.max_write_buffer_number = 2;
  o.max_background_jobs = 2;
  o.max_open_files = 512;
  o.optimize_filters_for_hits = true;  // rows read were written first: no filter for the last level
  rocksdb::BlockBasedTableOptions t;
  t.block_size = 4096;
  // Index entries delta-encoded in runs of 16 (the default, 1, stores every key whole):
  // row keys share most of their bytes, so the index is about half the size and that of
  // 10^8 rows of dimension 16 stays in the cache below, where before many row reads also
  // read an index block (bench_sparse's store_rows_per_s and device_bytes_per_row; docs/sparse-tables.md).
  t.index_block_restart_interval = 16;
  // Small (the RAM tier above is the cache of rows), mostly for index blocks: they are
  // in the high-priority pool, so data blocks read once do not push them out.
  t.block_cache = rocksdb::NewLRUCache(64 << 20, -1, false, 0.75);
  // Index and filter blocks live in that cache, partitioned, so a table of 10^8 rows
  // does not pin hundreds of MiB of them outside the shard's budget. Their partitions
  // are pinned there while the table file is open: a row read then finds its index entry
  // without a cache lookup, and reads need not fill the cache (row_disk::read).
  t.cache_index_and_filter_blocks = true;
  t.cache_index_and_filter_blocks_with_high_priority = true;
  t.metadata_cache_options.top_level_index_pinning = rocksdb::PinningTier::kAll;
  t.metadata_cache_options.partition_pinning = rocksdb::PinningTier::kAll;
  t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  t.partition_filters = true;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));  // upper levels: a row never written costs no read
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  return o;
}

std::string problem(const std::string& path, const rocksdb::Status& s) {
  return "disk tier at " + path + ": " + s.ToString();
}

// A store's files from a checkpoint: table files (never changed once written) hard-linked
// where possible, the rest (the manifest is appended to) copied. Throws bad_request.
void seed_from(const std::string& seed, const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw bad_request("disk tier at " + path + ": cannot make it: " + ec.message());
  std::error_code list_ec;
  for (const auto& e : fs::directory_iterator(seed, list_ec)) {
    auto to = fs::path(path) / e.path().filename();
    const bool table_file = e.path().extension() == ".sst";
    if (table_file) fs::create_hard_link(e.path(), to, ec);
    if (!table_file || ec) fs::copy_file(e.path(), to, ec);  // not linkable (another file system): copied
    if (ec) throw bad_request("disk tier at " + path + ": cannot take " + e.path().string() + ": " + ec.message());
  }
  if (list_ec)
    throw bad_request("disk tier at " + path + ": cannot read the checkpoint's rows at " + seed + ": " + list_ec.message());
}

}  // namespace

std::string direct_io_problem(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return dir + " is not a directory";
  auto probe = (fs::path(dir) / (".actorps-direct-io-probe-" + std::to_string(getpid()))).string();
  struct statfs fsinfo {};
  if (::statfs(dir.c_str(), &fsinfo) == 0 && fsinfo.f_type == TMPFS_MAGIC)
    return dir + " is in memory (tmpfs): a disk tier there would take RAM, not disk; choose a directory on a disk";
  int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    auto err = errno;
    ::unlink(probe.c_str());
    if (err == EINVAL) return dir + " is on a file system without direct I/O (O_DIRECT), e.g. tmpfs; choose a directory on a disk";
    return "cannot create files in " + dir + ": " + std::strerror(err);
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return {};
}

// Removes disk tiers that processes no longer running left in `dir` (a shard killed
// with SIGKILL cannot remove its own): actorps-rows-<name>-<pid> with no such pid.
static void remove_orphans(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    auto file = e.path().filename().string();
    auto dash = file.rfind('-');
    if (file.rfind("actorps-rows-", 0) != 0 || dash == std::string::npos) continue;
    char* end = nullptr;
    auto pid = std::strtol(file.c_str() + dash + 1, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

row_disk::row_disk(const std::string& dir, const std::string& name, std::vector<std::size_t> strides,
                   rocksdb::Env* env, const std::string& seed)
    : strides_(std::move(strides)) {
  if (auto why = direct_io_problem(dir); !why.empty()) throw bad_request("disk tier: " + why);
  remove_orphans(dir);
  std::string safe = name;
  for (auto& c : safe)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  path_ = (fs::path(dir) / ("actorps-rows-" + safe + "-" + std::to_string(getpid()))).string();
  std::error_code ec;
  fs::remove_all(path_, ec);  // a leftover of an earlier process with this pid
  rocksdb::DB* db = nullptr;
  auto options = store_options();
  if (env) options.env = env;
  if (!seed.empty()) {
    seed_from(seed, path_);
    options.error_if_exists = false;
  }
  auto s = rocksdb::DB::Open(options, path_, &db);
  if (!s.ok()) throw bad_request(problem(path_, s));
  db_.reset(db);
}

row_disk::~row_disk() {
  unpin();
  if (db_) {
    auto s = db_->Close();
    (void)s;
    db_.reset();
  }
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void row_disk::read(const std::vector<row_key>& keys, std::vector<std::uint8_t>& found, std::vector<float>& rows,
                    std::vector<std::uint64_t>& pushed, bool pinned) {
  if (pinned && !pinned_) throw bad_request("disk tier at " + path_ + ": no pinned view to copy rows from");
  rocksdb::ReadOptions o;
  // A row read goes into the RAM tier, so its data block is not wanted again soon:
  // putting it into the block cache took about a tenth of the readers' CPU in a profile
  // of a pull cell (BENCHMARKS.md).
  o.fill_cache = false;
  if (pinned) o.snapshot = pinned_;
  const auto n = keys.size();
  found.assign(n, 0);
  pushed.assign(n, 0);
  std::vector<char> key_bytes(n * key_size);
  std::vector<rocksdb::Slice> slices(n);
  for (std::size_t i = 0; i < n; ++i) {
    encode_key(keys[i], key_bytes.data() + i * key_size);
    slices[i] = rocksdb::Slice(key_bytes.data() + i * key_size, key_size);
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> status(n);
  db_->MultiGet(o, db_->DefaultColumnFamily(), n, slices.data(), values.data(), status.data());
  for (std::size_t i = 0; i < n; ++i) {
    if (status[i].IsNotFound()) continue;
    if (!status[i].ok()) throw bad_request(problem(path_, status[i]));
    const auto bytes = row_bytes(keys[i], values[i].size());
    found[i] = 1;
    const auto* floats = reinterpret_cast<const float*>(values[i].data());
    rows.insert(rows.end(), floats, floats + bytes / sizeof(float));
    if (values[i].size() > bytes) std::memcpy(&pushed[i], values[i].data() + bytes, sizeof(std::uint64_t));
  }
}

namespace {
// The floats' bytes of row k stored in `stored` bytes in the store at `path`.
std::size_t stored_row_bytes(const std::string& path, const std::vector<std::size_t>& strides, const row_key& k,
                             std::size_t stored) {
  if (k.table >= strides.size())
    throw bad_request("disk tier at " + path + ": row " + std::to_string(k.id) + " of table " + std::to_string(k.table) +
                      ", the job has " + std::to_string(strides.size()) + " tables (a corrupt store?)");
  const auto bytes = strides[k.table] * sizeof(float);
  if (stored != bytes && stored != bytes + sizeof(std::uint64_t))
    throw bad_request("disk tier at " + path + ": row " + std::to_string(k.id) + " of table " + std::to_string(k.table) +
                      " has " + std::to_string(stored) + " bytes, not " + std::to_string(bytes) + " (a corrupt store)");
  return bytes;
}
}  // namespace

std::size_t row_disk::row_bytes(const row_key& k, std::size_t stored) const {
  return stored_row_bytes(path_, strides_, k, stored);
}

namespace {

// Calls f(key, stored value) for every row of a saved store (row_disk::save's directory),
// opened read-only, in key order. Throws bad_request naming the path when it is missing
// or corrupt.
void each_saved_row(const std::string& dir, const std::function<void(const row_key&, std::string_view)>& f) {
  if (!fs::is_directory(dir)) throw bad_request("disk tier rows at " + dir + ": not a directory");
  auto options = store_options();
  options.create_if_missing = false;
  options.error_if_exists = false;
  rocksdb::DB* raw = nullptr;
  if (auto s = rocksdb::DB::OpenForReadOnly(options, dir, &raw); !s.ok()) throw bad_request(problem(dir, s));
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::ReadOptions o;
  o.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(o));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key().size() != key_size) throw bad_request("disk tier at " + dir + ": a key of " + std::to_string(it->key().size()) + " bytes (a corrupt store)");
    std::uint32_t table = 0;
    for (int i = 0; i < 4; ++i) table = table << 8 | static_cast<unsigned char>(it->key()[i]);
    f(row_key{table, decode_id(it->key().data())}, std::string_view(it->value().data(), it->value().size()));
  }
  if (!it->status().ok()) throw bad_request(problem(dir, it->status()));
}

// A fresh store at `path` that rows are written into in batches, then flushed to table
// files and closed (a directory a disk tier can start from, as from a checkpoint's).
class store_builder {
 public:
  explicit store_builder(std::string path) : path_(std::move(path)) {
    auto options = store_options();
    options.use_direct_io_for_flush_and_compaction = false;  // written once, wherever the checkpoints are
    rocksdb::DB* db = nullptr;
    if (auto s = rocksdb::DB::Open(options, path_, &db); !s.ok()) throw bad_request(problem(path_, s));
    db_.reset(db);
  }
  void put(const row_key& k, std::string_view value) {
    char key[key_size];
    encode_key(k, key);
    batch_.Put(rocksdb::Slice(key, key_size), rocksdb::Slice(value.data(), value.size()));
    if (static_cast<std::size_t>(batch_.Count()) >= batch_rows) write();
  }
  void finish() {
    write();
    if (auto s = db_->Flush(rocksdb::FlushOptions()); !s.ok()) throw bad_request(problem(path_, s));
    if (auto s = db_->Close(); !s.ok()) throw bad_request(problem(path_, s));
    db_.reset();
  }

 private:
  static constexpr std::size_t batch_rows = 16384;
  void write() {
    rocksdb::WriteOptions o;
    o.disableWAL = true;  // flushed before it is used
    if (auto s = db_->Write(o, &batch_); !s.ok()) throw bad_request(problem(path_, s));
    batch_.Clear();
  }
  std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteBatch batch_;
};

}  // namespace

std::vector<table_rows> read_saved_rows(const std::string& dir, const std::vector<std::size_t>& strides) {
  std::vector<table_rows> out;
  for (std::uint32_t t = 0; t < strides.size(); ++t) out.push_back({t, static_cast<std::uint32_t>(strides[t]), {}, {}});
  each_saved_row(dir, [&](const row_key& k, std::string_view value) {
    const auto bytes = stored_row_bytes(dir, strides, k, value.size());
    const auto* row = reinterpret_cast<const float*>(value.data());
    out[k.table].ids.push_back(k.id);
    out[k.table].rows.insert(out[k.table].rows.end(), row, row + bytes / sizeof(float));
  });
  return out;
}

std::map<std::uint32_t, std::vector<std::uint64_t>> lay_out_saved_rows(const std::vector<std::string>& saved,
                                                                       std::size_t tables, const row_owner_fn& owner,
                                                                       const std::vector<std::uint32_t>& shards,
                                                                       const std::string& into, const saved_row_fn& own) {
  std::error_code ec;
  fs::remove_all(into, ec);  // an earlier restore's: made again
  fs::create_directories(into, ec);
  if (ec) throw bad_request("cannot make " + into + ": " + ec.message());
  std::map<std::uint32_t, store_builder> stores;
  std::map<std::uint32_t, std::vector<std::uint64_t>> counts;
  for (auto id : shards) {
    stores.emplace(id, saved_rows_path(into, id));
    counts[id].assign(tables, 0);
  }
  for (std::size_t i = 0; i < saved.size(); ++i)
    each_saved_row(saved[i], [&](const row_key& k, std::string_view value) {
      if (k.table >= tables)
        throw bad_request("disk tier rows at " + saved[i] + ": a row of table " + std::to_string(k.table) +
                          ", the job has " + std::to_string(tables) + " tables (a corrupt store?)");
      if (own && !own(i, k)) return;
      auto to = owner(k);
      if (!to) return;
      auto store = stores.find(*to);
      if (store == stores.end())
        throw bad_request("row " + std::to_string(k.id) + " belongs to shard " + std::to_string(*to) +
                          ", not among the new shards");
      store->second.put(k, value);
      ++counts[*to][k.table];
    });
  for (auto& [id, store] : stores) store.finish();
  return counts;
}

std::string saved_rows_path(const std::string& into, std::uint32_t shard) {
  return (fs::path(into) / ("shard-" + std::to_string(shard))).string();
}

std::optional<std::uint64_t> row_disk::scan(std::uint32_t table, std::uint64_t first, std::size_t page,
                                            const std::function<void(std::uint64_t, std::string_view)>& f,
                                            bool pinned) const {
  char from[key_size], to[key_size];
  encode_key({table, first}, from);
  encode_key({table + 1, 0}, to);
  rocksdb::ReadOptions o;
  o.fill_cache = false;  // a scan: its blocks would only push the index blocks out
  rocksdb::Slice upper(to, key_size);
  o.iterate_upper_bound = &upper;
  if (pinned) o.snapshot = pinned_;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(o));
  std::optional<std::uint64_t> next;
  std::size_t scanned = 0;
  for (it->Seek(rocksdb::Slice(from, key_size)); it->Valid(); it->Next()) {
    const auto id = decode_id(it->key().data());
    if (scanned++ == page) {
      next = id;
      break;
    }
    f(id, std::string_view(it->value().data(), it->value().size()));
  }
  if (!it->status().ok()) throw bad_request(problem(path_, it->status()));
  return next;
}

swept_page row_disk::expired(const disk_sweep& sweep, std::size_t page) {
  swept_page out;
  auto next = scan(sweep.table, sweep.from, page, [&](std::uint64_t id, std::string_view value) {
    const auto bytes = row_bytes({sweep.table, id}, value.size());
    std::uint64_t pushed = 0;
    if (value.size() > bytes) std::memcpy(&pushed, value.data() + bytes, sizeof(pushed));
    if (std::max(pushed, sweep.revived_at) < sweep.before) out.ids.push_back(id);
  });
  out.more = next.has_value();
  out.next = next.value_or(0);
  return out;
}

void row_disk::add_row(moved_page& page, std::uint64_t id, std::string_view value) const {
  const auto bytes = row_bytes({page.table, id}, value.size());
  const auto* row = reinterpret_cast<const float*>(value.data());
  page.ids.push_back(id);
  page.rows.insert(page.rows.end(), row, row + bytes / sizeof(float));
}

std::optional<std::uint64_t> row_disk::delete_picked(const disk_move& move, std::size_t page,
                                                     const std::function<void(std::uint64_t, std::string_view)>& taken) {
  rocksdb::WriteBatch gone;
  char key[key_size];
  auto next = scan(move.table, move.from, page, [&](std::uint64_t id, std::string_view value) {
    if (!move.moves(id)) return;
    taken(id, value);
    encode_key({move.table, id}, key);
    gone.Delete(rocksdb::Slice(key, key_size));
  });
  if (gone.Count() == 0) return next;
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  if (auto s = db_->Write(w, &gone); !s.ok()) throw bad_request(problem(path_, s));
  return next;
}

void row_disk::check_table(std::uint32_t table) const {
  if (table >= strides_.size()) throw bad_request("disk tier at " + path_ + ": no table " + std::to_string(table));
}

moved_page row_disk::take_listed(const disk_move& move, std::size_t page) {
  check_table(move.table);
  moved_page out{move.table, {}, {}, false, 0};
  const auto end = std::min<std::uint64_t>(move.listed.size(), move.from + page);
  std::vector<row_key> keys;
  for (auto i = move.from; i < end; ++i) keys.push_back({move.table, move.listed[i]});
  std::vector<std::uint8_t> found;
  std::vector<std::uint64_t> pushed;
  read(keys, found, out.rows, pushed, move.keep);
  rocksdb::WriteBatch gone;
  char key[key_size];
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!found[i]) continue;
    out.ids.push_back(keys[i].id);
    encode_key(keys[i], key);
    gone.Delete(rocksdb::Slice(key, key_size));
  }
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  if (gone.Count() > 0 && !move.keep)
    if (auto s = db_->Write(w, &gone); !s.ok()) throw bad_request(problem(path_, s));
  out.more = end < move.listed.size();
  out.next = end;
  return out;
}

moved_page row_disk::take_moved(const disk_move& move, std::size_t page) {
  if (!move.listed.empty()) return take_listed(move, page);
  moved_page out{move.table, {}, {}, false, 0};
  auto next = delete_picked(move, page, [&](std::uint64_t id, std::string_view value) { add_row(out, id, value); });
  out.more = next.has_value();
  out.next = next.value_or(0);
  return out;
}

std::uint64_t row_disk::drop_moved(disk_move move) {
  std::uint64_t dropped = 0;
  for (std::optional<std::uint64_t> from = move.from; from; ) {  // page by page, no row kept
    move.from = *from;
    from = delete_picked(move, std::size_t{1} << 14, [&](std::uint64_t, std::string_view) { ++dropped; });
  }
  return dropped;
}

void row_disk::write(const row_write& w) {
  rocksdb::WriteBatch batch;
  std::size_t at = 0;
  char key[key_size];
  if (!w.pushed.empty() && w.pushed.size() != w.keys.size())
    throw bad_request("disk tier at " + path_ + ": a write carries " + std::to_string(w.pushed.size()) +
                      " push clocks for " + std::to_string(w.keys.size()) + " rows");
  std::string value;
  for (std::size_t i = 0; i < w.keys.size(); ++i) {
    const auto& k = w.keys[i];
    auto stride = strides_.at(k.table);
    if (at + stride > w.rows.size()) throw bad_request("disk tier at " + path_ + ": a write carries too few values");
    encode_key(k, key);
    // The row's floats, then the clock of its last push (rows written without one, as
    // fills are, read as pushed at clock 0).
    value.assign(reinterpret_cast<const char*>(w.rows.data() + at), stride * sizeof(float));
    if (!w.pushed.empty()) value.append(reinterpret_cast<const char*>(&w.pushed[i]), sizeof(std::uint64_t));
    batch.Put(rocksdb::Slice(key, key_size), value);
    at += stride;
  }
  for (const auto& k : w.deleted) {
    encode_key(k, key);
    batch.Delete(rocksdb::Slice(key, key_size));
  }
  if (at != w.rows.size())
    throw bad_request("disk tier at " + path_ + ": a write carries " + std::to_string(w.rows.size()) + " values, not " +
                      std::to_string(at));
  rocksdb::WriteOptions o;
  o.disableWAL = true;  // scratch: the RAM tier holds a row until its write completes
  auto s = db_->Write(o, &batch);
  if (!s.ok()) throw bad_request(problem(path_, s));
}

void row_disk::save(const row_write& rows, const std::string& dir) {
  if (!rows.keys.empty()) write(rows);
  std::error_code ec;
  fs::remove_all(dir, ec);  // an earlier job's at the same clock: replaced, as its file is
  fs::create_directories(fs::path(dir).parent_path(), ec);
  if (ec) throw bad_request("checkpoint of disk tier " + path_ + ": cannot make " + dir + ": " + ec.message());
  rocksdb::Checkpoint* made = nullptr;
  auto s = rocksdb::Checkpoint::Create(db_.get(), &made);
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(made);
  if (s.ok()) s = checkpoint->CreateCheckpoint(dir, 0);  // 0: flush first, so every row is in a table file
  if (!s.ok()) throw bad_request("checkpoint of disk tier " + path_ + " into " + dir + ": " + s.ToString());
}

void row_disk::pin(const row_write& rows) {
  if (!rows.keys.empty() || !rows.deleted.empty()) write(rows);
  unpin();
  pinned_ = db_->GetSnapshot();
}

moved_page row_disk::pinned_page(std::uint32_t table, std::uint64_t from, std::size_t page) const {
  if (!pinned_) throw bad_request("disk tier at " + path_ + ": no pinned view to copy rows from");
  check_table(table);
  moved_page out{table, {}, {}, false, 0};
  auto next = scan(table, from, page, [&](std::uint64_t id, std::string_view value) {
    add_row(out, id, value);
  }, true);
  out.more = next.has_value();
  out.next = next.value_or(0);
  return out;
}

void row_disk::unpin() {
  if (pinned_) db_->ReleaseSnapshot(pinned_);
  pinned_ = nullptr;
}

void row_disk::flush() {
  auto s = db_->Flush(rocksdb::FlushOptions());
  if (!s.ok()) throw bad_request(problem(path_, s));
}

std::uint64_t row_disk::fill(std::uint32_t table, std::uint64_t count, const sparse_table_spec& spec,
                            const std::function<bool(std::uint64_t)>& keep) {
  const auto stride = strides_.at(table);
  constexpr std::uint64_t ids_per_file = 4u << 20;
  std::vector<float> row(stride, 0.0f);
  char key[key_size];
  std::uint64_t written = 0;
  for (std::uint64_t start = 0; start < count; start += ids_per_file) {
    auto file = path_ + "/fill-" + std::to_string(table) + "-" + std::to_string(start) + ".sst";
    rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), store_options());
    auto s = writer.Open(file);
    std::uint64_t in_file = 0;
    for (auto id = start, end = std::min(count, start + ids_per_file); s.ok() && id < end; ++id) {
      if (!keep(id)) continue;
      initial_row(spec.seed, spec.name, id, spec.init_scale, row.data(), spec.dim);
      encode_key({table, id}, key);
      s = writer.Put(rocksdb::Slice(key, key_size),
                     rocksdb::Slice(reinterpret_cast<const char*>(row.data()), stride * sizeof(float)));
      ++in_file;
    }
    if (in_file == 0) continue;
    if (s.ok()) s = writer.Finish();
    rocksdb::IngestExternalFileOptions io;
    io.move_files = true;
    if (s.ok()) s = db_->IngestExternalFile({file}, io);
    if (!s.ok()) throw bad_request(problem(path_, s));
    written += in_file;
  }
  return written;
}

std::uint64_t row_disk::bytes_on_disk() const {
  std::uint64_t bytes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec))
    if (e.is_regular_file(ec)) bytes += e.file_size(ec);
  return bytes;
}

namespace {

// The number after `field` in a /proc file of "field value" lines (0: not found).
std::uint64_t proc_field(const char* file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) != 0) continue;
    std::istringstream rest(line.substr(field.size()));
    std::uint64_t v = 0;
    rest >> v;
    return v;
  }
  return 0;
}

}  // namespace

std::uint64_t process_disk_read_bytes() { return proc_field("/proc/self/io", "read_bytes:"); }
std::uint64_t process_peak_rss() { return proc_field("/proc/self/status", "VmHWM:") * 1024; }

}  // namespace ps

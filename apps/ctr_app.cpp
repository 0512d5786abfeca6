// ctr: click prediction on Criteo-format logs (train_ctr). Each categorical field has an
// embedding table on the shards (rows by hashed id, Adagrad); the embeddings and the
// log-transformed integers feed an MLP tower (one dense tensor, the job's rule) with a
// logistic loss. Each batch: pull the batch's rows (one request per table, all in flight)
// and the tower, compute, push the tower's gradient with the clock tick and each field's
// input gradient to its rows. After each epoch worker 0 scores the test file (AUC, log loss).
#include "apps/ctr_app.hpp"
#include "apps/apps.hpp"
#include "apps/ctr_backend.hpp"

#include <array>
#include <deque>
#include <chrono>
#include <cmath>
#include <unordered_set>

#include "apps/ctr/criteo.hpp"
#include "apps/ctr/ctr_data.hpp"
#include "apps/ctr/ctr_tower.hpp"
#include "libps/observe/progress.hpp"
#include "libps/rows/row_cache.hpp"
#include "libps/observe/text.hpp"

namespace ps {

namespace {

constexpr std::size_t fields = criteo_cat_fields;  // one embedding table per categorical field
constexpr std::size_t eval_batch = 1024;

struct ctr_settings {
  std::string train, test;
  std::uint32_t dim = 16;
  std::vector<std::size_t> hidden;
  std::size_t batch = 256;
  std::size_t epochs = 1;
  std::size_t cache_rows = 0;  // 0: no worker cache
  std::uint64_t cache_staleness = 0;
  std::vector<std::string> backends;  // --backend: one for every worker, or worker i's at i
  criteo_reader::on_bad_line policy = criteo_reader::on_bad_line::stop;
};

ctr_settings settings_of(const node_config& cfg) {
  ctr_settings s;
  s.train = cfg.app_text("train");
  s.test = cfg.app_text("test");
  s.dim = static_cast<std::uint32_t>(cfg.app_count("embedding-dim"));
  for (auto h : cfg.app_counts("hidden")) s.hidden.push_back(static_cast<std::size_t>(h));
  s.batch = cfg.batch;
  s.epochs = cfg.epochs;
  s.cache_rows = cfg.app_count("embedding-cache");
  s.cache_staleness = cfg.app_count("embedding-staleness");
  if (cfg.app_text("on-bad-line") == "skip") s.policy = criteo_reader::on_bad_line::skip;
  s.backends = split(cfg.app_text("backend"), ',');
  return s;
}

// What is wrong with --backend ("": nothing): each entry host or cuda, one for every
// worker or one per worker.
std::string check_backends(const node_config& cfg) {
  auto s = settings_of(cfg);
  for (const auto& b : s.backends)
    if (b != "host" && b != "cuda") return "\"" + b + "\" is not host or cuda";
  if (s.backends.empty()) return "name host or cuda";
  if (s.backends.size() != 1 && s.backends.size() != cfg.workers)
    return std::to_string(s.backends.size()) + " backends for " + std::to_string(cfg.workers) +
           " workers (give one for all, or one per worker)";
  return "";
}

// This worker's tower on its --backend.
std::unique_ptr<tower_compute> worker_tower(const worker_context& ctx, const ctr_settings& s, const ctr_tower& shape) {
  if (s.backends.size() == 1) return tower_on_backend(s.backends[0], shape);
  if (ctx.id >= s.backends.size())
    throw bad_request("--backend names " + std::to_string(s.backends.size()) + " workers' backends; this is worker " +
                      std::to_string(ctx.id));
  return tower_on_backend(s.backends[ctx.id], shape);
}

std::size_t tower_inputs(const ctr_settings& s) { return fields * s.dim + criteo_int_fields; }

// A field's id for a missing value: one row per field, apart from every hashed value.
std::uint64_t missing_id(std::size_t field) { return ~std::uint64_t{0} - field; }

// One batch: per field the row ids of its samples, the integer features as
// log(1 + max(v, 0)) (missing: 0), and the labels.
struct ctr_batch {
  std::array<std::vector<std::uint64_t>, fields> ids;
  std::vector<float> ints;
  std::vector<float> labels;
  std::size_t size() const { return labels.size(); }
  void add(const criteo_row& r) {
    for (std::size_t f = 0; f < fields; ++f) ids[f].push_back(r.cats[f] ? criteo_feature_id(f, *r.cats[f]) : missing_id(f));
    for (const auto& v : r.ints)
      ints.push_back(v ? static_cast<float>(std::log1p(std::max<double>(0, static_cast<double>(*v)))) : 0.0f);
    labels.push_back(r.label);
  }
  void clear() {
    for (auto& f : ids) f.clear();
    ints.clear();
    labels.clear();
  }
};

// Batches of one worker's rows of a file: row i belongs to worker i % workers.
class batch_source {
 public:
  batch_source(const ctr_settings& s, const std::string& path, std::uint32_t worker, std::uint32_t workers,
               std::size_t batch)
      : in_(path, s.policy), worker_(worker), workers_(workers), batch_(batch) {}
  bool next(ctr_batch& b) {
    b.clear();
    while (b.size() < batch_) {
      auto row = in_.next();
      if (!row) break;
      if (index_++ % workers_ == worker_) b.add(*row);
    }
    return b.size() > 0;
  }

 private:
  criteo_reader in_;
  std::uint32_t worker_, workers_;
  std::size_t batch_;
  std::uint64_t index_ = 0;
};

// The tower's input: per sample its fields' rows side by side, then its integers.
struct tower_input {
  tower_input(const ctr_batch& b, std::uint32_t dim)
      : dim(dim), width(fields * dim + criteo_int_fields), x(b.size() * width) {
    for (std::size_t s = 0; s < b.size(); ++s)
      std::copy_n(b.ints.data() + s * criteo_int_fields, criteo_int_fields, x.data() + s * width + fields * dim);
  }
  // Field f's rows, one per sample (batch * dim floats).
  void place(std::size_t f, const float* rows) {
    for (std::size_t s = 0; s * width < x.size(); ++s) std::copy_n(rows + s * dim, dim, x.data() + s * width + f * dim);
  }
  std::uint32_t dim;
  std::size_t width;
  std::vector<float> x;
};

// The tower's input for the batch, its rows pulled from the shards (one request per
// table, all in flight).
std::vector<float> inputs_of(kv_client& kv, const ctr_batch& b, std::uint32_t dim) {
  std::vector<kv_future> rows;
  for (std::uint32_t f = 0; f < fields; ++f) rows.push_back(kv.pull_rows(f, b.ids[f]));
  tower_input in(b, dim);
  for (std::size_t f = 0; f < fields; ++f) in.place(f, rows[f].get().data());
  return std::move(in.x);
}

// Field f's part of the input gradient, row by row of the batch.
std::vector<float> field_grads(const std::vector<float>& dx, std::size_t batch, std::size_t f, std::uint32_t dim) {
  const auto width = fields * dim + criteo_int_fields;
  std::vector<float> grads(batch * dim);
  for (std::size_t s = 0; s < batch; ++s) std::copy_n(dx.data() + s * width + f * dim, dim, grads.data() + s * dim);
  return grads;
}

std::size_t distinct(const std::vector<std::uint64_t>& ids) {
  return std::unordered_set<std::uint64_t>(ids.begin(), ids.end()).size();
}

// How a training worker reads and updates its rows: straight from the shards, or through
// its bounded-staleness cache, one per table (libps/rows/row_cache.hpp, after HET): a cached
// row is used while at most S clocks old and its gradients are summed locally until a
// refresh, an eviction, the bound or a flush sends them. Rows moved (pulled or pushed,
// each once however often a batch names it) are counted either way.
class row_access {
 public:
  row_access(kv_client& kv, const ctr_settings& s) : kv_(kv), dim_(s.dim) {
    if (s.cache_rows > 0)
      for (std::size_t f = 0; f < fields; ++f)
        caches_.emplace_back(s.dim, std::max<std::size_t>(1, s.cache_rows / fields), s.cache_staleness);
  }

  // The batch's rows of every field, as the tower's input (with the integers).
  std::vector<float> inputs(const ctr_batch& b, std::uint64_t clock, std::vector<kv_future>& pending) {
    if (caches_.empty()) {
      for (const auto& ids : b.ids) rows_moved_ += 2 * distinct(ids);  // pulled now, pushed by update()
      return inputs_of(kv_, b, dim_);
    }
    std::array<std::vector<std::uint64_t>, fields> missing;
    std::vector<kv_future> pulls;
    for (std::uint32_t f = 0; f < fields; ++f) {
      send(f, caches_[f].due(clock), pending);  // before the reads of clock c0 + S + 1 need them
      missing[f] = caches_[f].misses(b.ids[f], clock);
      rows_moved_ += missing[f].size();
      pulls.push_back(kv_.pull_rows(f, missing[f]));
    }
    tower_input in(b, dim_);
    std::vector<float> rows(b.size() * dim_);
    for (std::uint32_t f = 0; f < fields; ++f) {
      auto got = pulls[f].get();
      send(f, caches_[f].fill(missing[f], got.data(), clock), pending);
      caches_[f].read(b.ids[f], rows.data());
      in.place(f, rows.data());
    }
    return std::move(in.x);
  }

  // The input gradient's rows: pushed, or summed in the cache.
  void update(const ctr_batch& b, const std::vector<float>& dx, std::uint64_t clock, std::vector<kv_future>& pending) {
    for (std::uint32_t f = 0; f < fields; ++f) {
      auto grads = field_grads(dx, b.size(), f, dim_);
      if (caches_.empty()) {
        pending.push_back(kv_.push_rows(f, b.ids[f], grads));
      } else {
        caches_[f].accumulate(b.ids[f], grads.data(), clock);
      }
    }
  }

  // The next batch's rows, announced to shards that keep rows on disk (--shard-memory)
  // while this batch is computed.
  void prefetch(const ctr_batch& next) {
    for (std::uint32_t f = 0; f < fields; ++f) kv_.prefetch_rows(f, next.ids[f]);
  }

  // Every gradient summed in the caches goes to the shards (before an evaluation, at the end).
  void flush(std::vector<kv_future>& pending) {
    for (std::uint32_t f = 0; f < caches_.size(); ++f) send(f, caches_[f].drain(), pending);
  }

  std::uint64_t rows_moved() const { return rows_moved_; }
  std::pair<std::uint64_t, std::uint64_t> hits_and_misses() const {
    std::uint64_t hits = 0, missed = 0;
    for (const auto& c : caches_) {
      hits += c.hits();
      missed += c.missed();
    }
    return {hits, missed};
  }

 private:
  void send(std::uint32_t f, std::vector<row_flush> rows, std::vector<kv_future>& pending) {
    if (rows.empty()) return;
    std::vector<std::uint64_t> ids;
    std::vector<float> grads;
    for (auto& r : rows) {
      ids.push_back(r.id);
      grads.insert(grads.end(), r.grad.begin(), r.grad.end());
    }
    rows_moved_ += ids.size();
    pending.push_back(kv_.push_rows(f, ids, grads));
  }

  kv_client& kv_;
  std::uint32_t dim_;
  std::deque<row_cache> caches_;  // per table (a deque: a cache is never moved); empty: no cache
  std::uint64_t rows_moved_ = 0;
};

// What a worker counts while it trains. `bound` counts the rows an unbounded cache at
// the same staleness would move (embedding_bytes_bound, docs/sparse-tables.md).
struct ctr_counts {
  ctr_counts(std::uint64_t staleness, std::uint32_t worker, std::uint64_t epochs)
      : bound(staleness), progress(worker, epochs, 0, 0.5) {}
  std::uint64_t samples = 0, batches = 0, dense_bytes = 0;
  double loss_sum = 0, train_seconds = 0;
  cache_traffic_counter bound;
  nlohmann::json per_epoch = nlohmann::json::array();
  progress_tracker progress;  // the reports to the job's observer
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// Scores the test file with the current parameters: (AUC, log loss).
std::pair<double, double> evaluate(worker_context& ctx, const ctr_settings& s, tower_compute& tower,
                                   const key_set& keys) {
  auto params = ctx.kv.pull(keys).get();
  batch_source test(s, s.test, 0, 1, eval_batch);
  ctr_batch b;
  std::vector<double> scores;
  std::vector<float> labels;
  while (test.next(b)) {
    auto x = inputs_of(ctx.kv, b, s.dim);
    scores.resize(scores.size() + b.size());
    tower.predict(params.data(), x.data(), b.size(), scores.data() + scores.size() - b.size());
    labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  }
  return {auc(scores, labels), logloss(scores, labels)};
}

// A progress report with the row cache's lookups, for --metrics.
void report_rows(worker_context& ctx, const row_access& rows, progress_report r) {
  std::tie(r.cache_hits, r.cache_misses) = rows.hits_and_misses();
  report_progress(ctx, std::move(r));
}

// One pass over this worker's training rows; each batch is one clock.
void train_epoch(worker_context& ctx, const ctr_settings& s, tower_compute& tower, const key_set& keys,
                 row_access& rows, std::uint64_t epoch, std::uint64_t& clock, ctr_counts& counts) {
  batch_source train(s, s.train, ctx.id, ctx.num_workers, s.batch);
  ctr_batch b, next;
  const auto num_params = keys.num_keys();
  auto grad = std::make_shared<std::vector<float>>(num_params);
  std::vector<float> dx;
  std::vector<kv_future> pending;  // the last batch's pushes
  const bool announce = ctx.cfg.shard_memory > 0;  // the shards keep rows on disk: say which come next
  for (bool more = train.next(b); more; std::swap(b, next)) {
    more = train.next(next);
    if (more && announce) rows.prefetch(next);
    auto params_f = ctx.kv.pull(keys);
    for (auto& f : pending) f.get();  // the tower's gradient buffer is free again
    pending.clear();
    auto x = rows.inputs(b, clock, pending);
    auto params = params_f.get();
    dx.resize(x.size());
    const double loss = tower.loss_and_grad(params.data(), x.data(), b.labels.data(), b.size(), grad->data(), dx.data());
    counts.loss_sum += loss;
    rows.update(b, dx, clock, pending);
    for (const auto& ids : b.ids) counts.bound.batch(ids, clock);
    pending.push_back(ctx.kv.push_and_advance(keys, grad, 0, ++clock));
    counts.samples += b.size();
    ++counts.batches;
    counts.dense_bytes += 2 * num_params * sizeof(float);
    auto now = std::chrono::duration<double>(std::chrono::steady_clock::now() - counts.started).count();
    if (auto r = counts.progress.step(epoch, clock, counts.samples, loss, now)) report_rows(ctx, rows, *r);
  }
  rows.flush(pending);  // the shards have every update before anyone evaluates
  for (auto& f : pending) f.get();
}

nlohmann::json result_of(const worker_context& ctx, const ctr_settings& s, const ctr_counts& counts,
                         const row_access& rows, const tower_compute& tower) {
  const std::uint64_t row_bytes = sizeof(std::uint64_t) + s.dim * sizeof(float);
  auto [hits, misses] = rows.hits_and_misses();
  nlohmann::json out{{"worker", ctx.id},
                     {"backend", tower.backend()},
                     {"samples", counts.samples},
                     {"batches", counts.batches},
                     {"train_seconds", counts.train_seconds},
                     {"train_loss", counts.batches ? counts.loss_sum / counts.batches : 0.0},
                     {"embedding_bytes", rows.rows_moved() * row_bytes},
                     {"embedding_bytes_uncached", counts.bound.total().without_cache * row_bytes},
                     {"embedding_bytes_bound", counts.bound.total().with_cache * row_bytes},
                     {"worker_cache_hits", hits},
                     {"worker_cache_misses", misses},
                     {"dense_bytes", counts.dense_bytes}};
  if (ctx.id == 0) {
    out["per_epoch"] = counts.per_epoch;
    out["test_auc"] = counts.per_epoch.back()["test_auc"];
    out["test_logloss"] = counts.per_epoch.back()["test_logloss"];
  }
  return out;
}

std::string ctr_app(worker_context& ctx) {
  const auto s = settings_of(ctx.cfg);
  ctr_tower shape(tower_inputs(s), s.hidden);
  auto tower = worker_tower(ctx, s, shape);
  auto keys = key_set::single({0, shape.num_params()});
  if (ctx.id == 0) {  // the first writer wins: one worker is enough
    std::vector<float> init(shape.num_params());
    shape.init(init.data(), ctx.cfg.seed);
    ctx.kv.init(keys, std::move(init)).get();
  }
  ctx.barrier();
  ctr_counts counts(s.cache_staleness, ctx.id, s.epochs);
  row_access rows(ctx.kv, s);
  std::uint64_t clock = ctx.start_clock;
  for (std::size_t epoch = 1; epoch <= s.epochs; ++epoch) {
    auto start = std::chrono::steady_clock::now();
    train_epoch(ctx, s, *tower, keys, rows, epoch, clock, counts);
    counts.train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ctx.barrier();
    if (ctx.id == 0) {  // one worker scores the whole test file: an AUC does not add up from parts
      auto [test_auc, test_logloss] = evaluate(ctx, s, *tower, keys);
      counts.per_epoch.push_back({{"epoch", epoch}, {"test_auc", test_auc}, {"test_logloss", test_logloss}});
      report_rows(ctx, rows, counts.progress.close_epoch(epoch, clock, counts.samples, "auc", test_auc, 1));
    } else {
      report_rows(ctx, rows, counts.progress.close_epoch(epoch, clock, counts.samples));
    }
    ctx.barrier();
  }
  auto out = result_of(ctx, s, counts, rows, *tower);
  if (ctx.id == 0) {  // the shards' figures, once every worker is done
    out["shards"] = shard_figures(ctx.kv);
  }
  return out.dump();
}

// The job's tensors; first the data files are checked, so a job that cannot read them
// is refused before it starts, naming the file.
std::vector<tensor_spec> ctr_tensors(const node_config& cfg) {
  auto s = settings_of(cfg);
  for (const auto& [flag, path] : {std::pair{"train", s.train}, std::pair{"test", s.test}}) {
    if (path.empty()) throw bad_request(std::string("the ctr app needs --") + flag + "=FILE (Criteo's TSV format)");
    criteo_reader probe(path, s.policy);  // throws naming the file when it cannot be opened
  }
  ctr_tower tower(tower_inputs(s), s.hidden);
  return {{"tower", {0, tower.num_params()}, {tower.num_params()}}};
}

std::vector<sparse_table_spec> ctr_tables(const node_config& cfg) {
  update_rule adagrad;
  adagrad.kind = "adagrad";
  adagrad.lr = static_cast<float>(cfg.app_number("embedding-lr"));
  adagrad.eps = static_cast<float>(cfg.app_number("embedding-eps"));
  std::vector<sparse_table_spec> tables;
  for (std::size_t f = 0; f < fields; ++f) {
    std::string name = "C";  // Criteo's names of the categorical fields: C1..C26
    name += std::to_string(f + 1);
    tables.push_back({name, static_cast<std::uint32_t>(cfg.app_count("embedding-dim")), 0.01f, adagrad, cfg.seed,
                      static_cast<std::uint32_t>(cfg.app_count("admit-after")), cfg.app_count("row-expiry")});
  }
  return tables;
}

std::vector<app_flag> ctr_flags() {
  return {{"train", app_flag_kind::text, "", "ctr: training rows in Criteo's TSV format (plain or .gz)", {}},
          {"test", app_flag_kind::text, "", "ctr: test rows in Criteo's TSV format (plain or .gz)", {}},
          {"embedding-dim", app_flag_kind::count, "16", "ctr: floats per embedding row",
           [](const node_config& c) { return c.app_count("embedding-dim") >= 1 ? "" : "must be >= 1"; }},
          {"embedding-lr", app_flag_kind::number, "0.05", "ctr: Adagrad's learning rate for the embedding rows",
           [](const node_config& c) { return c.app_number("embedding-lr") > 0 ? "" : "must be > 0"; }},
          {"embedding-eps", app_flag_kind::number, "0.01",
           "ctr: Adagrad's epsilon for the embedding rows (w -= lr*g/(sqrt(h)+eps)): a row's first steps are at most "
           "lr/eps times its gradient",
           [](const node_config& c) { return c.app_number("embedding-eps") > 0 ? "" : "must be > 0"; }},
          {"hidden", app_flag_kind::counts, "[256,128]", "ctr: the tower's hidden layer widths, e.g. [256,128]",
           [](const node_config& c) {
             for (auto h : c.app_counts("hidden"))
               if (h < 1 || h > 65536) return std::string("widths must be in [1, 65536]");
             return std::string();
           }},
          {"admit-after", app_flag_kind::count, "1",
           "ctr: a row is created once its id was pushed this many times (1: on first touch); until then its "
           "gradients are dropped and pulls get its first-touch value",
           [](const node_config& c) {
             auto n = c.app_count("admit-after");
             return n >= 1 && n <= 65535 ? "" : "must be in [1, 65535]";
           }},
          {"row-expiry", app_flag_kind::count, "0",
           "ctr: clocks (batches) after which a row not pushed to is dropped (0: never)",
           {}},
          {"embedding-cache", app_flag_kind::count, "0",
           "ctr: rows a worker caches over all tables (0: none); a cached row is used while at most "
           "--embedding-staleness clocks old",
           {}},
          {"embedding-staleness", app_flag_kind::count, "0",
           "ctr: clocks (batches) a cached row may be old; its gradients are summed until then", {}},
          {"backend", app_flag_kind::text, "host",
           "ctr: where workers run the dense tower: host|cuda for all, or one per worker, e.g. host,cuda",
           check_backends},
          {"on-bad-line", app_flag_kind::text, "stop", "ctr: stop|skip at a malformed input line",
           [](const node_config& c) {
             auto v = c.app_text("on-bad-line");
             return v == "stop" || v == "skip" ? "" : "must be stop or skip";
           }}};
}

}  // namespace

app_definition ctr_definition() {
  app_definition app{"ctr", "click prediction on Criteo-format logs (train_ctr)", ctr_app, "adam", "bsp",
                     ctr_tensors, ctr_flags()};
  app.tables = ctr_tables;
  return app;
}

}  // namespace ps

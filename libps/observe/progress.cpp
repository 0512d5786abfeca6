#include "libps/observe/progress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ps {

std::string progress_report::to_json() const {
  nlohmann::ordered_json j{{"progress", 1}, {"worker", worker}, {"epoch", epoch}, {"epochs", epochs},
                           {"clock", clock},  {"clocks", clocks}, {"samples", samples}, {"loss", loss}};
  if (epoch_end) {
    j["epoch_end"] = true;
    j["epoch_loss"] = epoch_loss;
    if (!metric.empty()) {
      j["metric"] = metric;
      j["metric_value"] = metric_value;
      j["metric_count"] = metric_count;
    }
  }
  for (auto [name, l] : {std::pair{"push", &push_latency}, std::pair{"pull", &pull_latency}})
    if (l->count > 0) {
      j[std::string(name) + "_count"] = l->count;
      j[std::string(name) + "_p50_ms"] = l->p50_ms;
      j[std::string(name) + "_p99_ms"] = l->p99_ms;
    }
  if (cache_hits + cache_misses > 0) {
    j["cache_hits"] = cache_hits;
    j["cache_misses"] = cache_misses;
  }
  return j.dump();
}

std::optional<progress_report> progress_report::parse(const std::string& text) {
  if (text.rfind("{\"progress\":1,", 0) != 0) return std::nullopt;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    progress_report r;
    r.worker = j.at("worker").get<std::uint32_t>();
    r.epoch = j.at("epoch").get<std::uint64_t>();
    r.epochs = j.at("epochs").get<std::uint64_t>();
    r.clock = j.at("clock").get<std::uint64_t>();
    r.clocks = j.at("clocks").get<std::uint64_t>();
    r.samples = j.at("samples").get<std::uint64_t>();
    r.loss = j.at("loss").get<double>();
    r.epoch_end = j.value("epoch_end", false);
    r.epoch_loss = j.value("epoch_loss", 0.0);
    r.metric = j.value("metric", std::string());
    r.metric_value = j.value("metric_value", 0.0);
    r.metric_count = j.value("metric_count", std::uint64_t{0});
    for (auto [name, l] : {std::pair{"push", &r.push_latency}, std::pair{"pull", &r.pull_latency}}) {
      l->count = j.value(std::string(name) + "_count", std::uint64_t{0});
      l->p50_ms = j.value(std::string(name) + "_p50_ms", 0.0);
      l->p99_ms = j.value(std::string(name) + "_p99_ms", 0.0);
    }
    r.cache_hits = j.value("cache_hits", std::uint64_t{0});
    r.cache_misses = j.value("cache_misses", std::uint64_t{0});
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a field missing or of another type: not ours
  }
}

progress_report progress_tracker::base(std::uint64_t epoch, std::uint64_t clock, std::uint64_t samples) const {
  progress_report r;
  r.worker = worker_;
  r.epoch = epoch;
  r.epochs = epochs_;
  r.clock = clock;
  r.clocks = clocks_per_epoch_ * epochs_;
  r.samples = samples;
  return r;
}

std::optional<progress_report> progress_tracker::step(std::uint64_t epoch, std::uint64_t clock, std::uint64_t samples,
                                                       double loss, double now_s) {
  window_sum_ += loss;
  epoch_sum_ += loss;
  ++window_n_;
  ++epoch_n_;
  if (now_s - last_s_ < every_s_) return std::nullopt;
  last_s_ = now_s;
  auto r = base(epoch, clock, samples);
  r.loss = window_sum_ / static_cast<double>(window_n_);
  window_sum_ = 0;
  window_n_ = 0;
  return r;
}

progress_report progress_tracker::close_epoch(std::uint64_t epoch, std::uint64_t clock, std::uint64_t samples,
                                              const std::string& metric, double value, std::uint64_t count) {
  auto r = base(epoch, clock, samples);
  r.epoch_end = true;
  r.epoch_loss = r.loss = epoch_n_ ? epoch_sum_ / static_cast<double>(epoch_n_) : 0;
  r.metric = metric;
  r.metric_value = value;
  r.metric_count = count;
  epoch_sum_ = 0;
  epoch_n_ = 0;
  return r;
}

namespace {

std::string seconds_text(double s) {
  char buf[32];
  if (s < 90) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 5400) std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

// Hits over lookups in the reporting workers' row caches; nullopt when none looked up.
std::optional<double> cache_hit_rate(const std::map<std::uint32_t, progress_report>& reports) {
  std::uint64_t hits = 0, lookups = 0;
  for (const auto& [w, r] : reports) {
    hits += r.cache_hits;
    lookups += r.cache_hits + r.cache_misses;
  }
  if (lookups == 0) return std::nullopt;
  return static_cast<double>(hits) / static_cast<double>(lookups);
}

}  // namespace

std::string epoch_summary::text() const {
  char buf[256];
  std::string m = metric_value ? ", " + metric + " " + std::to_string(*metric_value).substr(0, 6) : "";
  std::snprintf(buf, sizeof buf, "epoch %llu/%llu: loss %.4f%s, %.0f samples/s, elapsed %s, ETA %s",
                static_cast<unsigned long long>(epoch), static_cast<unsigned long long>(epochs), loss, m.c_str(),
                samples_per_s, seconds_text(elapsed_s).c_str(), seconds_text(eta_s).c_str());
  return buf;
}

nlohmann::ordered_json epoch_summary::json() const {
  nlohmann::ordered_json j{{"type", "epoch"}, {"epoch", epoch}, {"epochs", epochs}, {"loss", loss}};
  if (metric_value) j[metric] = *metric_value;
  j["samples_per_s"] = samples_per_s;
  j["elapsed_s"] = elapsed_s;
  j["eta_s"] = eta_s;
  if (worker_cache_hit_rate) j["worker_cache_hit_rate"] = *worker_cache_hit_rate;
  return j;
}

std::vector<epoch_summary> progress_board::add(const progress_report& r, double elapsed_s) {
  // A job resumed from a checkpoint starts at a later epoch: the earlier ones are not its.
  if (latest_.empty() && summarized_ == 0 && r.epoch > 1) summarized_ = r.epoch - 1;
  latest_[r.worker] = r;
  if (r.epoch_end && r.epoch > summarized_) open_[r.epoch].closed[r.worker] = r;
  return complete(elapsed_s);
}

std::vector<epoch_summary> progress_board::worker_left(std::uint32_t worker, double elapsed_s) {
  gone_[worker] = true;
  return complete(elapsed_s);
}

std::vector<epoch_summary> progress_board::complete(double elapsed_s) {
  std::vector<epoch_summary> out;
  for (auto it = open_.find(summarized_ + 1); it != open_.end(); it = open_.find(summarized_ + 1)) {
    const auto& closed = it->second.closed;
    for (std::uint32_t w = 0; w < workers_; ++w)
      if (!gone_.count(w) && !closed.count(w)) return out;  // still training this epoch
    epoch_summary s;
    s.epoch = it->first;
    std::uint64_t samples = 0;
    double metric_weight = 0, metric_sum = 0;
    for (const auto& [w, r] : closed) {
      s.epochs = r.epochs;
      s.loss += r.epoch_loss / static_cast<double>(closed.size());
      samples += r.samples;
      if (!r.metric.empty() && r.metric_count > 0) {
        s.metric = r.metric;
        metric_sum += r.metric_value * static_cast<double>(r.metric_count);
        metric_weight += static_cast<double>(r.metric_count);
      }
    }
    if (metric_weight > 0) s.metric_value = metric_sum / metric_weight;
    s.worker_cache_hit_rate = cache_hit_rate(closed);
    double took = std::max(1e-9, elapsed_s - elapsed_at_last_summary_);
    s.samples_per_s = static_cast<double>(samples - std::min(samples, samples_at_last_summary_)) / took;
    s.elapsed_s = elapsed_s;
    s.eta_s = took * static_cast<double>(s.epochs - std::min(s.epochs, s.epoch));
    samples_at_last_summary_ = samples;
    elapsed_at_last_summary_ = elapsed_s;
    summarized_ = s.epoch;
    open_.erase(it);
    out.push_back(s);
  }
  return out;
}

double progress_board::fraction_done() const {
  double sum = 0;
  std::size_t n = 0;
  for (const auto& [w, r] : latest_) {  // a worker that left counts where it stopped
    ++n;
    if (r.clocks > 0) sum += static_cast<double>(r.clock) / static_cast<double>(r.clocks);
    else if (r.epochs > 0) sum += static_cast<double>(r.epoch - (r.epoch_end ? 0 : 1)) / static_cast<double>(r.epochs);
  }
  return n ? sum / static_cast<double>(n) : 0;
}

std::string progress_board::live_line(double elapsed_s) const {
  if (latest_.empty()) return "";
  auto snap = snapshot(elapsed_s);
  double f = snap["fraction_done"];
  const auto& any = latest_.begin()->second;
  char buf[200];
  std::snprintf(buf, sizeof buf, "epoch %llu/%llu %3.0f%% | loss %.4f | %.0f samples/s | ETA %s",
                static_cast<unsigned long long>(any.epoch), static_cast<unsigned long long>(any.epochs), 100 * f,
                snap["loss"].get<double>(), snap["samples_per_s"].get<double>(),
                f > 0 ? seconds_text(elapsed_s * (1 - f) / f).c_str() : "?");
  return buf;
}

// The workers' latest request latencies: p50 the median of theirs, p99 the worst one's.
void progress_board::add_latencies(nlohmann::ordered_json& j) const {
  for (auto [name, pick] : {std::pair{"push", &progress_report::push_latency},
                            std::pair{"pull", &progress_report::pull_latency}}) {
    std::vector<double> p50;
    double p99 = 0;
    for (const auto& [w, r] : latest_) {
      const auto& l = r.*pick;
      if (l.count == 0) continue;
      p50.push_back(l.p50_ms);
      p99 = std::max(p99, l.p99_ms);
    }
    if (p50.empty()) continue;
    std::nth_element(p50.begin(), p50.begin() + p50.size() / 2, p50.end());
    j[std::string(name) + "_p50_ms"] = p50[p50.size() / 2];
    j[std::string(name) + "_p99_ms"] = p99;
  }
}

nlohmann::ordered_json progress_board::snapshot(double elapsed_s) const {
  std::uint64_t samples = 0;
  double loss = 0;
  for (const auto& [w, r] : latest_) {
    samples += r.samples;
    loss += r.loss;
  }
  nlohmann::ordered_json j{{"type", "progress"},
                           {"elapsed_s", elapsed_s},
                           {"samples", samples},
                           {"samples_per_s", elapsed_s > 0 ? static_cast<double>(samples) / elapsed_s : 0.0}};
  if (latest_.empty()) return j;  // no loss yet: none is better than a zero
  j["loss"] = loss / static_cast<double>(latest_.size());
  j["fraction_done"] = fraction_done();
  add_latencies(j);
  if (auto rate = cache_hit_rate(latest_)) j["worker_cache_hit_rate"] = *rate;
  return j;
}

}  // namespace ps

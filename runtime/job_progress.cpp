#include "runtime/job_progress.hpp"
#include "libps/observe/log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "libps/keys/keys.hpp"

namespace ps {

job_progress::job_progress(std::uint32_t workers, const std::string& metrics_path,
                           std::chrono::milliseconds metrics_every,
                           std::function<void(const nlohmann::ordered_json&)> sink)
    : board_(workers), metrics_every_(metrics_every), sink_(std::move(sink)), live_(isatty(STDERR_FILENO) == 1 && logs(log_level::info)) {
  if (metrics_path.empty()) return;
  metrics_.open(metrics_path, std::ios::out | std::ios::trunc);
  if (!metrics_) throw bad_request("--metrics=" + metrics_path + ": cannot write there: " + std::strerror(errno));
}

job_progress::~job_progress() {
  if (live_shown_) std::fprintf(stderr, "\n");
  if (wants_metrics()) write_metrics("");
}

bool job_progress::wants_metrics() const { return metrics_.is_open() || sink_; }

double job_progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void job_progress::print_above_live_line(const std::string& line) {
  if (!logs(log_level::info)) return;  // --log-level=warning or error: the job's news and summaries are off
  std::fprintf(stderr, "%s%s\n", live_shown_ ? "\r\033[K" : "", line.c_str());
  live_shown_ = false;
}

void job_progress::write_line(const nlohmann::ordered_json& j) {
  if (sink_) sink_(j);
  if (!metrics_.is_open()) return;
  metrics_ << j.dump() << '\n';
  metrics_.flush();  // a reader (./run plot, tail -f) sees each line as it comes
}

void job_progress::report(std::uint32_t worker, const std::string& text) {
  auto r = progress_report::parse(text);
  if (!r) return print_above_live_line("[worker " + std::to_string(worker) + "] " + text);
  const double now = elapsed();
  show(board_.add(*r, now));
  if (live_) {
    std::fprintf(stderr, "\r%s\033[K", board_.live_line(now).c_str());
    live_shown_ = true;
  }
}

void job_progress::worker_left(std::uint32_t worker) { show(board_.worker_left(worker, elapsed())); }

void job_progress::show(const std::vector<epoch_summary>& summaries) {
  for (const auto& s : summaries) {
    print_above_live_line(s.text());
    write_line(s.json());
  }
}

void job_progress::news(const std::string& text) { print_above_live_line(text); }

bool job_progress::metrics_due() const {
  return wants_metrics() && std::chrono::steady_clock::now() - last_metrics_ >= metrics_every_;
}

void job_progress::write_metrics(const std::string& status_json) {
  last_metrics_ = std::chrono::steady_clock::now();
  auto line = board_.snapshot(elapsed());
  // The rate since the last line, beside the one since the start.
  const double t = line["elapsed_s"], samples = line["samples"].get<double>();
  if (t > last_line_s_) line["samples_per_s_recent"] = (samples - last_line_samples_) / (t - last_line_s_);
  last_line_s_ = t;
  last_line_samples_ = samples;
  auto status = nlohmann::json::parse(status_json, nullptr, false);
  if (status.is_object()) {
    for (const char* key : {"job", "shards", "workers", "slowest_worker"})
      if (status.contains(key)) line[key] = status[key];
    // The staleness between workers now: how far the fastest is ahead of the slowest.
    std::uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& w : status.value("workers", nlohmann::json::array()))
      if (w.contains("clock") && w["clock"].is_number_unsigned()) {
        lo = std::min(lo, w["clock"].get<std::uint64_t>());
        hi = std::max(hi, w["clock"].get<std::uint64_t>());
      }
    if (hi >= lo) line["clock_spread"] = hi - lo;
  }
  write_line(line);
}

}  // namespace ps

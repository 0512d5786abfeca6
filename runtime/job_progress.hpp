// What a job's observer (a launcher, psnode's coordinator) shows of its workers'
// progress: a summary line per epoch on stderr, a live line only when stderr is a
// terminal, and with --metrics=FILE JSON lines per epoch and every few seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "libps/observe/progress.hpp"

namespace ps {

class job_progress {
 public:
  // metrics_path "": no metrics file. Throws bad_request when the file cannot be written.
  // sink: each metrics line goes there too (none: only to the file).
  job_progress(std::uint32_t workers, const std::string& metrics_path,
               std::chrono::milliseconds metrics_every = std::chrono::seconds(2),
               std::function<void(const nlohmann::ordered_json&)> sink = {});
  ~job_progress();
  // A worker's report: a progress report (libps/observe/progress) or an app's own line.
  void report(std::uint32_t worker, const std::string& text);
  // A worker finished or died: it holds no epoch back.
  void worker_left(std::uint32_t worker);
  // News from the coordinator, printed above the live line.
  void news(const std::string& text);
  // True when a periodic metrics line is due; it then wants the coordinator's status.
  bool metrics_due() const;
  // The periodic line, with the coordinator's status object (shards, workers) if given.
  void write_metrics(const std::string& status_json);

 private:
  double elapsed() const;
  bool wants_metrics() const;
  void print_above_live_line(const std::string& line);
  void write_line(const nlohmann::ordered_json& j);
  void show(const std::vector<epoch_summary>& summaries);  // on stderr and in the metrics

  progress_board board_;
  std::ofstream metrics_;
  std::chrono::milliseconds metrics_every_;
  std::function<void(const nlohmann::ordered_json&)> sink_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_metrics_ = start_;
  double last_line_s_ = 0, last_line_samples_ = 0;  // of the last periodic line
  bool live_ = false;        // stderr is a terminal
  bool live_shown_ = false;  // a live line is on screen
};

}  // namespace ps

// bench_elastic: what moving shards costs a job under sustained load. One job (psnode
// --role=local --app=elastic: coordinator, 2 servers, 2 workers as processes, each worker
// pushing and pulling 1 MiB back to back); after --phase-seconds a third server joins
// (psnode --role=server), after another phase shard 0 leaves (psctl remove-shard 0).
// --replication=R keeps chains of R copies (the joiner's chain is built before its keys
// move; the leaver's process takes its copies along, and their chains grow back).
// With --rolling, after another phase every shard is replaced in turn (psctl rolling-restart:
// a new server joins, then the old shard leaves), one event over the whole replacement.
// One JSON line per event (with `replication`):
//   event             join | leave | rolling (servers_replaced; moved_fraction: the mean of
//                     the leaves' fractions, each leaving one of n+1 shards: ideal 1/(n+1))
//   moved_fraction    of the dense keys (the coordinator's news; ideal 1/(n+1) on a join)
//   seconds           from the event's start to the coordinator saying it is done
//   p99_stall_ms, max_stall_ms   latency of the requests that overlapped the move
//   throughput_before / _during / _after   requests per second (pushes and pulls of both
//                     workers) in the phase before, while requests overlapping the move ran,
//                     and in the phase after
//   lost_updates      keys x pushes of all workers - the final sum of every key (exact, the
//                     benchmark's own check after both moves; 0 when nothing was lost)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/apps.hpp"
#include "apps/bench_timing.hpp"
#include "libps/observe/text.hpp"

namespace {

using steady = std::chrono::steady_clock;

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(steady::now().time_since_epoch()).count();
}

// The job's merged stdout and stderr, read a line at a time.
struct job_output {
  FILE* pipe = nullptr;
  std::string all;
  // Reads until a line holds `what` (true) or the job's output ends (false).
  bool until(const std::string& what, std::string* line_out = nullptr) {
    char line[65536];
    while (pipe && std::fgets(line, sizeof line, pipe)) {
      all += line;
      if (std::string(line).find(what) != std::string::npos) {
        if (line_out) *line_out = line;
        return true;
      }
    }
    return false;
  }
};

// "(0.333 of the dense keys moved)" in a news line; -1 when absent.
double moved_fraction_in(const std::string& text) {
  auto at = text.find(" of the dense keys moved");
  if (at == std::string::npos) return -1;
  auto from = text.rfind('(', at);
  return from == std::string::npos ? -1 : std::atof(text.c_str() + from + 1);
}

struct sample {
  std::int64_t end_us, took_us;
};

struct event_window {
  const char* name;
  std::int64_t start_us, end_us;
  double moved_fraction;
  std::size_t shards_before;
};

nlohmann::ordered_json measure(const event_window& ev, const std::vector<sample>& all, double phase_seconds,
                               double lost_updates) {
  std::vector<double> stalls;
  std::int64_t until = ev.end_us;
  for (const auto& s : all)
    if (s.end_us - s.took_us <= ev.end_us && s.end_us >= ev.start_us) {
      stalls.push_back(s.took_us / 1000.0);
      until = std::max(until, s.end_us);
    }
  std::sort(stalls.begin(), stalls.end());
  const auto phase_us = static_cast<std::int64_t>(phase_seconds * 1e6);
  auto rate = [&](std::int64_t from, std::int64_t to) {
    auto n = std::count_if(all.begin(), all.end(), [&](const sample& s) { return s.end_us >= from && s.end_us < to; });
    return to > from ? static_cast<double>(n) / ((to - from) / 1e6) : 0.0;
  };
  auto p99 = stalls.empty() ? 0.0 : stalls[std::min(stalls.size() - 1, stalls.size() * 99 / 100)];
  return {{"bench", "elastic"},
          {"event", ev.name},
          {"shards_before", ev.shards_before},
          {"moved_fraction", ev.moved_fraction},
          {"ideal_fraction", std::string(ev.name) == "leave" ? 1.0 / ev.shards_before : 1.0 / (ev.shards_before + 1)},
          {"seconds", (ev.end_us - ev.start_us) / 1e6},
          {"p99_stall_ms", p99},
          {"max_stall_ms", stalls.empty() ? 0.0 : stalls.back()},
          {"throughput_before", rate(ev.start_us - phase_us, ev.start_us)},
          {"throughput_during", rate(ev.start_us, until + 1)},
          {"throughput_after", rate(until + 1, until + 1 + phase_us)},
          {"lost_updates", lost_updates}};
}

// The workers' result lines: every request's end and latency, their pushes, the lowest sum
// of every key any of them read at the end.
struct worker_results {
  std::vector<sample> samples;
  double pushes = 0, worst_sum = -1;
  double row_values_pushed = 0, worst_row_sum = -1;  // with --rows
  int workers = 0;
};
worker_results results_of(const std::string& output) {
  worker_results r;
  for (const auto& j : ps::json_lines_of(output)) {
    if (!j.contains("took_us")) continue;
    ++r.workers;
    r.pushes += j["pushes"].get<double>();
    auto sum = j["final_sum"].get<double>();
    r.worst_sum = r.worst_sum < 0 ? sum : std::min(r.worst_sum, sum);
    r.row_values_pushed += j.value("row_values_pushed", 0.0);
    auto row_sum = j.value("final_row_sum", 0.0);
    r.worst_row_sum = r.worst_row_sum < 0 ? row_sum : std::min(r.worst_row_sum, row_sum);
    auto ends = j["ends_us"].get<std::vector<std::int64_t>>();
    auto took = j["took_us"].get<std::vector<std::int64_t>>();
    for (std::size_t i = 0; i < ends.size() && i < took.size(); ++i) r.samples.push_back({ends[i], took[i]});
  }
  return r;
}

// The epoch after `marker` in text ("epoch 4" -> 4; 0 when absent).
std::uint64_t epoch_after(const std::string& text, const std::string& marker) {
  auto at = text.find(marker);
  return at == std::string::npos ? 0 : std::strtoull(text.c_str() + at + marker.size(), nullptr, 10);
}

// What the givers with a disk tier said of the map changes of epochs [first, last] in the
// job's output (their lines name the epoch; several processes' lines interleave in any
// order): rows copied ahead of the cut, rows sent at the cut, the longest cut.
nlohmann::ordered_json tier_figures(const std::string& output, std::uint64_t first, std::uint64_t last) {
  double ahead = 0, at_cut = 0, cut_ms = 0;
  std::size_t at = 0;
  for (std::size_t end; (end = output.find('\n', at)) != std::string::npos; at = end + 1) {
    const auto line = output.substr(at, end - at);
    if (auto p = line.find(": copied "); p != std::string::npos) {
      const auto epoch = epoch_after(line, " rows ahead of epoch ");
      if (epoch >= first && epoch <= last) ahead += std::atof(line.c_str() + p + 9);
    }
    if (auto p = line.find(": cut of epoch "); p != std::string::npos) {
      const auto epoch = epoch_after(line, ": cut of epoch ");
      if (epoch < first || epoch > last) continue;
      at_cut += std::atof(line.c_str() + line.find(": ", p + 2) + 2);
      cut_ms = std::max(cut_ms, std::atof(line.c_str() + line.rfind(" in ") + 4));
    }
  }
  return {{"rows_copied_ahead", ahead}, {"rows_sent_at_cut", at_cut}, {"cut_ms", cut_ms}};
}

constexpr const char* usage =
  "usage: bench_elastic [--phase-seconds=2] [--replication=1] [--rolling] [--rows=N --shard-memory=BYTES\n"
  "                     [--handoff=copy-ahead|cut]]\n"
  "A job of 2 servers and 2 workers (processes, 1 MiB pushes and pulls back to back): a third server joins\n"
  "after one phase, shard 0 leaves after the next; with --rolling, every shard is then replaced in turn\n"
  "(psctl rolling-restart). With --rows, a sparse table of N rows (filled first;\n"
  "batches of 1,024 Zipf rows pushed and pulled each round too), on a disk tier with --shard-memory.\n"
  "One JSON line per event (see the source's header).\n";

struct bench_flags {
  double phase = 2;
  int replication = 1;
  std::uint64_t rows = 0, shard_memory = 0;
  std::string handoff = "copy-ahead";
  bool rolling = false;
  // The flags every psnode of the job gets (the joiner too).
  std::string node_flags() const {
    if (rows == 0) return "";
    return " --elastic-rows=" + std::to_string(rows) + " --shard-memory=" + std::to_string(shard_memory) +
           " --handoff=" + handoff;
  }
};

// Parses argv into flags; nullopt after printing the usage (exit code in `rc`).
std::optional<bench_flags> parse_flags(int argc, char** argv, int& rc) {
  bench_flags f;
  auto number_after = [](const std::string& a, const char* name) { return std::strtoull(a.c_str() + std::strlen(name), nullptr, 10); };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      rc = 0;
      return std::nullopt;
    }
    if (a.rfind("--phase-seconds=", 0) == 0 && std::atof(a.c_str() + 16) > 0) f.phase = std::atof(a.c_str() + 16);
    else if (a == "--replication=1" || a == "--replication=2") f.replication = a.back() - '0';  // a third copy needs a third process
    else if (a.rfind("--rows=", 0) == 0 && number_after(a, "--rows=") > 0) f.rows = number_after(a, "--rows=");
    else if (a.rfind("--shard-memory=", 0) == 0 && number_after(a, "--shard-memory=") >= (1u << 20))
      f.shard_memory = number_after(a, "--shard-memory=");
    else if (a == "--handoff=copy-ahead" || a == "--handoff=cut") f.handoff = a.substr(10);
    else if (a == "--rolling") f.rolling = true;
    else {
      std::fprintf(stderr, "bench_elastic: unknown or bad flag %s\n%s", a.c_str(), usage);
      rc = 2;
      return std::nullopt;
    }
  }
  if ((f.rows > 0) != (f.shard_memory > 0)) {
    std::fprintf(stderr, "bench_elastic: --rows and --shard-memory (at least 1 MiB) go together\n%s", usage);
    rc = 2;
    return std::nullopt;
  }
  return f;
}

// Starts the job (2 servers, 2 workers, the elastic app's load for a phase before and after
// each move, and room to spare); the --coordinator flag that reaches it once its workers
// load, or nullopt (said on stderr).
std::optional<std::string> start_job(job_output& job, const std::string& psnode, const bench_flags& f) {
  auto load = std::to_string(4 * f.phase + 4 + (f.rolling ? 2 * f.phase + 20 : 0));  // 20 s: two replacements and room
  job.pipe = popen((psnode + " --role=local --app=elastic --servers=2 --workers=2 --replication=" +
                    std::to_string(f.replication) + " --load-seconds=" + load + f.node_flags() + " 2>&1").c_str(), "r");
  std::string line;
  if (!job.pipe || !job.until("listening on 127.0.0.1:", &line)) {
    std::fprintf(stderr, "bench_elastic: the job did not start:\n%s", job.all.c_str());
    return std::nullopt;
  }
  auto at = line.find("listening on 127.0.0.1:") + 23;
  auto port = line.substr(at, line.find_first_not_of("0123456789", at) - at);
  if (!job.until("[worker 1] load started")) {
    std::fprintf(stderr, "bench_elastic: the workers did not start:\n%s", job.all.c_str());
    return std::nullopt;
  }
  return " --coordinator=127.0.0.1:" + port;
}

// psctl rolling-restart of the job's 2 shards, timed; nullopt when it failed (said on stderr).
std::optional<event_window> rolling_event(const std::string& psnode, const std::string& psctl,
                                          const std::string& coordinator, const bench_flags& f) {
  event_window ev{"rolling", now_us(), 0, -1, 2};
  auto start = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive " + psnode + " --role=server" + coordinator + f.node_flags() +
               " >/dev/null 2>&1";
  auto out = ps::output_of(psctl + coordinator + " rolling-restart --start='" + start + "'");
  ev.end_us = now_us();
  if (!out) return std::nullopt;
  double sum = 0;
  int leaves = 0;
  for (const auto& line : ps::split(*out, '\n'))
    if (auto fraction = moved_fraction_in(line); fraction >= 0) sum += fraction, ++leaves;
  ev.moved_fraction = leaves > 0 ? sum / leaves : -1;
  return ev;
}

// One JSON line per event (join, then leave) with its throughput dip and, with rows, the tier's figures.
void print_lines(const bench_flags& f, const std::string& output, const worker_results& results,
                 std::initializer_list<const event_window*> events, std::uint64_t join_epoch, double lost) {
  for (const auto* ev : events) {
    auto out = measure(*ev, results.samples, f.phase, lost);
    out["replication"] = f.replication;
    if (f.rows > 0) {
      out["rows"] = f.rows;
      out["shard_memory"] = f.shard_memory;
      out["handoff"] = f.handoff;
      out.update(ev == *events.begin() ? tier_figures(output, join_epoch, join_epoch)
                                       : tier_figures(output, join_epoch + 1, UINT64_MAX));
    }
    ps::bench::print_line(out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rc = 0;
  auto flags = parse_flags(argc, argv, rc);
  if (!flags) return rc;
  const double phase = flags->phase;
  auto bin = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  auto psnode = (bin / "psnode").string(), psctl = (bin / "psctl").string();
  job_output job;
  const auto coordinator = start_job(job, psnode, *flags);
  if (!coordinator) return 1;
  std::string line;
  auto pause = [&] { std::this_thread::sleep_for(std::chrono::duration<double>(phase)); };
  pause();
  event_window join{"join", now_us(), 0, -1, 2};
  // As the launcher starts its servers on a shared host: one passive OpenMP thread (teams
  // spinning in several processes on 2 cores halved the job's throughput).
  FILE* joiner =
    popen(("OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive " + psnode + " --role=server" + *coordinator + flags->node_flags() + " 2>&1").c_str(), "r");
  if (!joiner || !job.until("joined; its keys and rows were handed over", &line)) {
    std::fprintf(stderr, "bench_elastic: the server did not join:\n%s", job.all.c_str());
    return 1;
  }
  join.end_us = now_us();
  const auto join_epoch = epoch_after(line, "; epoch ");  // later changes are the leave's
  join.moved_fraction = moved_fraction_in(line);
  pause();
  event_window leave{"leave", now_us(), 0, -1, 3};
  auto removed = ps::output_of(psctl + *coordinator + " remove-shard 0");
  leave.end_us = now_us();
  if (!removed) return 1;
  leave.moved_fraction = moved_fraction_in(*removed);
  std::optional<event_window> rolling;
  if (flags->rolling) {
    pause();
    if (rolling = rolling_event(psnode, psctl, *coordinator, *flags); !rolling) return 1;
  }
  job.until(std::string(1, '\0'));  // no line holds it: the rest of the output
  int status = pclose(job.pipe);
  char rest[4096];
  while (std::fgets(rest, sizeof rest, joiner)) {
  }
  pclose(joiner);
  auto results = results_of(job.all);
  if (status != 0 || results.workers != 2) {
    std::fprintf(stderr, "bench_elastic: the job failed (status %d, %d worker results):\n%s", status, results.workers,
                 job.all.c_str());
    return 1;
  }
  const double keys = 1u << 18;
  const double lost = keys * results.pushes - results.worst_sum + results.row_values_pushed - results.worst_row_sum;
  print_lines(*flags, job.all, results, {&join, &leave}, join_epoch, lost);
  if (rolling) {
    auto out = measure(*rolling, results.samples, flags->phase, lost);
    out["servers_replaced"] = rolling->shards_before;
    out["replication"] = flags->replication;
    ps::bench::print_line(out);
  }
  return lost == 0 ? 0 : 1;
}

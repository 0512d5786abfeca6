// The job launcher: a whole job on this machine, embedded (one process) or as psnode
// processes on loopback, watched until it ends.
#include "libps/observe/log.hpp"
#include "runtime/node_parts.hpp"
#include "runtime/job_progress.hpp"
#include "runtime/app_registry.hpp"
#include "runtime/job_contract.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "actors/checkpointer.hpp"
#include "actors/server_shard.hpp"
#include "runtime/signals.hpp"

extern char** environ;

namespace ps {

using std::chrono::milliseconds;

// ---- launcher -------------------------------------------------------------------------

namespace {

struct child {
  pid_t pid;
  std::string name;
  bool server = false;
  bool exited = false;
  int status = 0;
};

pid_t spawn_process(const std::string& exe, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // A local cluster runs several processes per core: OpenMP teams inside each (the host
  // kernels) would spin against each other (softmax demo: 82 k samples/s with teams,
  // 100-118 k with one thread each). Children get one OpenMP thread unless the user says.
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  auto set_default = [&](const std::string& name, const std::string& value) {
    for (const auto& e : env_store)
      if (e.rfind(name + "=", 0) == 0) return;
    env_store.push_back(name + "=" + value);
  };
  set_default("OMP_NUM_THREADS", "1");
  set_default("OMP_WAIT_POLICY", "passive");
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  // The launcher's stdout is its own JSON result: a child's status line goes to stderr.
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_adddup2(&files, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, exe.c_str(), &files, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0) throw bad_request("cannot start " + exe + ": " + std::strerror(rc));
  return pid;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

struct child_command {
  std::string path;
  std::vector<std::string> leading;  // before the flags
};
child_command& child_program_slot() {
  static child_command c;
  return c;
}

// Arguments for a psnode child: this process's own flags (they share one option set),
// minus the ones that say what this process is or where it listens, plus the child's role.
// A local cluster lives on loopback: its children listen and announce 127.0.0.1.
std::vector<std::string> child_args(const node_config& cfg, std::vector<std::string> extra) {
  static const char* const own[] = {"--role=",   "--coordinator=", "--app=",  "--port=",
                                     "--host=",  "--listen=",      "--advertise=", "--ps.data-plane-port=",
                                     "--metrics=", "--metrics-port="};
  std::vector<std::string> out = child_program_slot().leading;
  for (const auto& a : cfg.args)
    if (std::none_of(std::begin(own), std::end(own), [&](const char* p) { return a.rfind(p, 0) == 0; }))
      out.push_back(a);
  out.push_back("--host=127.0.0.1");
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

}  // namespace

void set_child_program(std::string path, std::vector<std::string> leading) {
  child_program_slot() = {std::move(path), std::move(leading)};
}

const std::string& child_program() {
  auto& path = child_program_slot().path;
  if (path.empty()) path = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "psnode").string();
  return path;
}

pid_t spawn_psnode(const std::vector<std::string>& args) {
  return spawn_process(child_program(), args);
}


// What this job's checkpoints say about it (the clock is filled in per file).
checkpoint_header job_header(const node_config& cfg, const job_settings& settings, const std::string& app_name) {
  checkpoint_header h;
  h.model = app_name + "/" + cfg.model;
  h.epoch = 1;
  for (std::uint32_t i = 0; i < cfg.servers; ++i) h.shard_ids.push_back(i);
  h.vnodes = static_cast<std::uint32_t>(cfg.vnodes);
  h.bucket_bits = settings.bucket_bits;
  h.rule = settings.rule.kind.name();
  h.state_slots = static_cast<std::uint32_t>(settings.rule.state_slots());
  return h;
}

// The checkpoint writer, when --checkpoint-dir is given (else an empty handle).
checkpointer_actor spawn_checkpointer(caf::actor_system& sys, const node_config& cfg, const job_settings& settings,
                              const std::string& app_name, observer_actor observer) {
  if (cfg.checkpoint_dir.empty()) return {};
  checkpointer_options o;
  o.dir = cfg.checkpoint_dir;
  o.observer = observer;
  o.header = job_header(cfg, settings, app_name);
  return sys.spawn(checkpointer, o);
}

// --restore: the newest intact checkpoint in the directory, if it fits this job; throws
// bad_request naming the file and the mismatch. Refused newer files are told on stderr.
// --state-dir, --resume: the saved job, when it is this job. A fresh coordinator refuses a
// directory that holds a job (resuming it, or removing the file, is the operator's call).
std::shared_ptr<const coordinator_record> load_resume(const node_config& cfg, const job_settings& settings) {
  if (cfg.state_dir.empty()) return nullptr;
  if (!cfg.resume) {
    if (std::filesystem::exists(record_path(cfg.state_dir)))
      throw bad_request("--state-dir=" + cfg.state_dir + " holds the state of a job whose coordinator did not end it (" +
                        record_path(cfg.state_dir) + "): resume it with --resume, or remove that file to start afresh");
    return nullptr;
  }
  auto record = load_record(cfg.state_dir);
  if (record.job_fingerprint != fingerprint_text(settings.spec))
    throw bad_request("cannot resume: " + record_path(cfg.state_dir) + " holds job " + record.job_fingerprint +
                      ", these flags make job " + fingerprint_text(settings.spec) + " (start it with the same flags)");
  std::fprintf(stderr, "resume: job %s from %s (epoch %llu, %zu of %zu workers finished)\n", record.job_fingerprint.c_str(),
               record_path(cfg.state_dir).c_str(), static_cast<unsigned long long>(record.epoch),
               static_cast<std::size_t>(std::count(record.worker_done.begin(), record.worker_done.end(), true)),
               record.worker_done.size());
  return std::make_shared<const coordinator_record>(std::move(record));
}

std::shared_ptr<const checkpoint> load_restore(const node_config& cfg, const job_settings& settings,
                                               const std::string& app_name) {
  if (cfg.restore.empty()) return nullptr;
  auto latest = load_latest(cfg.restore);
  for (const auto& r : latest.refused) std::fprintf(stderr, "restore: skipped %s\n", r.c_str());
  if (!latest.found) throw bad_request("--restore=" + cfg.restore + ": no intact checkpoint in it");
  const auto& got = latest.found->header;
  auto want = job_header(cfg, settings, app_name);
  auto mismatch = [&](const std::string& what, const std::string& have, const std::string& need) {
    throw bad_request(latest.path + ": cannot restore: it holds " + what + " " + have + ", this job has " + need);
  };
  if (got.model != want.model) mismatch("model", got.model, want.model);
  if (got.rule != want.rule || got.state_slots != want.state_slots)
    mismatch("update rule", got.rule, want.rule);
  if (auto bad = non_finite_values(*latest.found); !bad.empty()) {
    if (!cfg.restore_non_finite)
      throw bad_request(latest.path + ": cannot restore: " + bad + "; --restore-non-finite restores it anyway");
    std::fprintf(stderr, "restore: %s: %s (restored anyway: --restore-non-finite)\n", latest.path.c_str(), bad.c_str());
  }
  std::fprintf(stderr, "restore: parameters from %s (clock %llu)\n", latest.path.c_str(),
               static_cast<unsigned long long>(got.clock));
  const auto map = job_map(cfg, settings);
  if (same_map(got, map)) return std::make_shared<const checkpoint>(std::move(*latest.found));
  // Another number of shards (or another ring, or shards that joined or left): every key
  // and row goes to its new owner.
  try {
    // Rows on a disk tier: new stores beside the checkpoint's own, read by the new shards.
    const auto rows_into = std::filesystem::path(latest.path).parent_path() / disk_rows_dir_name(got.clock) /
                           ("onto-" + std::to_string(want.shard_ids.size()) + "-shards");
    const auto start = std::chrono::steady_clock::now();
    auto moved = reshard(*latest.found, map, rows_into.string());
    moved.header.vnodes = want.vnodes;
    moved.header.bucket_bits = want.bucket_bits;
    std::uint64_t disk_rows = 0;
    for (const auto& s : moved.shards) disk_rows += s.disk_row_count;
    std::fprintf(stderr, "restore: the state of %zu shards laid out for %zu", got.shard_ids.size(), want.shard_ids.size());
    if (disk_rows > 0)
      std::fprintf(stderr, " (%llu rows on disk, into %s, in %.1f s)", static_cast<unsigned long long>(disk_rows),
                   rows_into.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fprintf(stderr, "\n");
    return std::make_shared<const checkpoint>(std::move(moved));
  } catch (const bad_request& e) {
    throw bad_request(latest.path + ": cannot restore onto " + std::to_string(want.shard_ids.size()) + " shards: " +
                      e.what());
  }
}

// A job starts a fresh trace: the shards only ever append.
bool start_trace(const node_config& cfg, std::string* error) {
  if (cfg.trace.empty()) return true;
  std::FILE* f = std::fopen(cfg.trace.c_str(), "w");
  if (!f) {
    *error = "cannot create trace file " + cfg.trace + ": " + std::strerror(errno);
    return false;
  }
  std::fclose(f);
  return true;
}


bool job_result::stopped() const {
  return code == errc::stopped || code == errc::interrupted || code == errc::terminated;
}

namespace {

// A periodic metrics line with the coordinator's status (shards, workers' clocks); without
// it when the coordinator does not answer within a second (the line still goes out).
void write_metrics(caf::scoped_actor& observer, const coordinator_actor& coord, job_progress& view) {
  std::string status;
  observer->request(coord, std::chrono::seconds(1), status_atom::value)
    .receive([&](std::string& s) { status = std::move(s); }, [&](caf::error&) {});
  view.write_metrics(status);
}

// A worker's end: its result, or its failure.
void take_worker_result(job_progress& view, job_result& res, worker_result& r) {
  view.worker_left(r.worker);
  if (!r.ok) res.failures.push_back("worker " + std::to_string(r.worker) + ": " + r.json);
  res.results[r.worker] = std::move(r.json);
}

// The job's newest map, for what the launcher reports after the job.
void take_map(job_result& res, const cluster_view& v) {
  try {
    res.map = std::make_shared<const partitioner>(map_of(v));
  } catch (const bad_request&) {  // a map the clients would refuse too: the last good one stands
  }
}

// SIGTERM with --on-sigterm=step-down: the coordinator's process ends at once, as a crash
// would, so nothing tells the members the job ended; they wait for a coordinator resumed
// from --state-dir (saved on every change) and rejoin it.
[[noreturn]] void step_down(const node_config& cfg) {
  json_line line{{"role", "coordinator"}, {"app", cfg.app}, {"status", "stepped_down"},
                 {"reason", "SIGTERM with --on-sigterm=step-down: the job's state is in " + cfg.state_dir +
                                "; start the coordinator again with --resume, its members wait for it"}};
  std::fflush(stderr);
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  std::_Exit(143);
}

}  // namespace

bool watch_coordinator(caf::scoped_actor& observer, const coordinator_actor& coord, job_result& res,
                       const job_listener& listener, const node_config& cfg, const std::function<void()>& tick) {
  job_progress view(static_cast<std::uint32_t>(cfg.workers), cfg.metrics, milliseconds(cfg.metrics_ms),
                    listener.metrics_line);
  auto progress = listener.progress ? listener.progress
                                    : [&](std::uint32_t w, const std::string& text) { view.report(w, text); };
  auto news = listener.news ? listener.news : [&](const std::string& text) { view.news(text); };
  using clock = std::chrono::steady_clock;
  // Once the job was asked to end (or ended itself), it has this long to tell its members.
  constexpr auto grace = std::chrono::seconds(10);
  bool ended = false;
  std::optional<clock::time_point> ending;
  auto ask_stop = [&](errc code, const std::string& why) {
    if (ending) return;
    ending = clock::now();
    caf::anon_send(coord, stop_atom::value, static_cast<std::uint8_t>(code), why);
  };
  observer->monitor(coord);
  if (!res.failures.empty()) ask_stop(errc::job_failed, res.failures.front());
  while (!ended && !(ending && clock::now() - *ending > grace)) {
    observer->receive(
      [&](report_atom, std::uint32_t w, const std::string& text) { progress(w, text); },
      [&](news_atom, const std::string& text) { news(text); },
      [&](loss_atom, const update_loss& loss) {
        news(describe(loss, "shard " + std::to_string(loss.shard)));
        res.losses.push_back(loss);
      },
      [&](done_atom, worker_result& r) { take_worker_result(view, res, r); },
      [&](view_atom, const cluster_view& v) { take_map(res, v); },
      [&](job_failed_atom, std::string& text) {  // the coordinator ends the job, or the checkpointer asks to
        if (std::find(res.failures.begin(), res.failures.end(), text) == res.failures.end()) res.failures.push_back(text);
        ask_stop(errc::job_failed, text);  // a no-op for a coordinator that is ending already
      },
      [&](caf::down_msg& dm) {
        ended = true;
        if (dm.reason && dm.reason != caf::exit_reason::user_shutdown) {
          res.code = code_of(dm.reason);
          res.reason = describe(dm.reason);
        }
      },
      caf::after(milliseconds(100)) >> [&] {
        if (int sig = stop_signal(); sig != 0) {
          if (sig == SIGTERM && cfg.on_sigterm == "step-down") step_down(cfg);  // does not return
          ask_stop(sig == SIGINT ? errc::interrupted : errc::terminated,
                   std::string("stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + " on the coordinator");
        }
        if (view.metrics_due()) write_metrics(observer, coord, view);
        auto seen = res.failures.size();
        if (tick) tick();
        if (res.failures.size() > seen) ask_stop(errc::job_failed, res.failures[seen]);  // e.g. a member died
      });
  }
  if (res.reason.empty() && !res.failures.empty()) res.reason = res.failures.front();
  return ended;
}

namespace {

// The members a launcher starts: shards and worker threads in this process (embedded), or
// psnode processes, which it watches and reaps.
struct local_cluster {
  const node_config& cfg;
  std::vector<child> children;
  std::vector<std::thread> threads;
  std::vector<std::string> thread_errors;
  std::size_t server_kills = 0, worker_kills = 0;  // the fault plan's, expected to vanish

  explicit local_cluster(const node_config& c) : cfg(c), thread_errors(c.workers) {
    for (const auto& k : cfg.fault_spec().kills) ++(k.who == fault_plan::role::server ? server_kills : worker_kills);
  }

  void start_embedded(caf::actor_system& sys, const coordinator_actor& coord, const app_fn& app) {
    auto sopts = shard_options_from(cfg, "");
    for (std::size_t i = 0; i < cfg.servers; ++i) {
      auto s = sys.spawn(server_shard, coord, sopts);
      caf::anon_send(s, start_atom::value, std::uint16_t{0});
    }
    for (std::size_t i = 0; i < cfg.workers; ++i)
      threads.emplace_back([&, i, coord] { run_worker(sys, cfg, coord, app, &thread_errors[i]); });
  }

  // Throws bad_request when a process cannot be started.
  void start_processes(std::uint16_t port, const std::string& app_name) {
    auto addr = "--coordinator=127.0.0.1:" + std::to_string(port);
    if (logs(log_level::info))
      std::fprintf(stderr,
                   "coordinator listening on 127.0.0.1:%u (more workers can join: %s --role=worker %s --app=%s; "
                   "more servers: %s --role=server %s)\n",
                   port, child_program().c_str(), addr.c_str(), app_name.c_str(), child_program().c_str(), addr.c_str());
    const auto& exe = child_program();
    // Named by pid, not by a number: the coordinator gives shard and worker ids in the
    // order members register, which is not the order they were started in.
    for (std::size_t i = 0; i < cfg.servers; ++i)
      children.push_back({spawn_process(exe, child_args(cfg, {"--role=server", addr})), "server process", true});
    for (std::size_t i = 0; i < cfg.workers; ++i)
      children.push_back({spawn_process(exe, child_args(cfg, {"--role=worker", addr, "--app=" + app_name})),
                          "worker process"});
  }

  // True for a clean exit, and for the fault plan's kills (noted in faults_seen).
  bool planned(const child& c, job_result& res) {
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) return true;
    auto& budget = c.server ? server_kills : worker_kills;
    if (!(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL && budget > 0)) return false;
    --budget;
    res.faults_seen.push_back(c.name + " (pid " + std::to_string(c.pid) + ") " + describe_status(c.status));
    return true;
  }

  // While the job runs: a child that ended unplanned is a failure.
  void check_children(job_result& res) {
    for (auto& c : children) {
      if (c.exited || waitpid(c.pid, &c.status, WNOHANG) != c.pid) continue;
      c.exited = true;
      if (!planned(c, res))
        res.failures.push_back(c.name + " (pid " + std::to_string(c.pid) + ") " + describe_status(c.status) +
                               " before the job finished");
    }
  }

  // After the job: the threads end and the children exit on their own (the coordinator
  // told them how the job ended); a child still there after 10 s is killed.
  void reap(job_result& res) {
    for (auto& t : threads) t.join();
    for (const auto& e : thread_errors)
      if (!e.empty()) res.failures.push_back(e);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (auto& c : children) {
      while (!c.exited) {
        if (waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
          c.exited = true;
          planned(c, res);  // only to note the fault plan's kills: the job is over
        } else if (std::chrono::steady_clock::now() >= deadline) {
          kill(c.pid, SIGKILL);
          waitpid(c.pid, &c.status, 0);
          c.exited = true;
        } else {
          std::this_thread::sleep_for(milliseconds(5));  // polling child exit; no event to wait on
        }
      }
    }
  }
};

// The job's verdict from what the workers reported.
}  // namespace

running_coordinator start_coordinator(caf::actor_system& sys, const node_config& cfg, const job_settings& settings,
                                      const std::string& app_name, observer_actor observer) {
  if (std::string err; !start_trace(cfg, &err)) throw bad_request(err);
  auto copts = coordinator_options_from(cfg, settings);
  copts.restore = load_restore(cfg, settings, app_name);
  if (copts.restore && find_app_definition(app_name).resumes) copts.restore_clock = copts.restore->header.clock;
  copts.state_dir = cfg.state_dir;
  copts.resume = load_resume(cfg, settings);
  copts.rejoin_patience = std::chrono::milliseconds(cfg.failure_timeout_ms);
  copts.observer = observer;
  copts.checkpointer = spawn_checkpointer(sys, cfg, settings, app_name, observer);
  return {sys.spawn(coordinator, copts), copts.checkpointer};
}

void running_coordinator::end_checkpointer() const {
  // Handles sent to other processes keep it registered with the middleman: end it here.
  if (checkpointer) caf::anon_send_exit(checkpointer, caf::exit_reason::user_shutdown);
}

void conclude(job_result& res, std::optional<std::size_t> expected_results) {
  if (res.failures.empty() && expected_results && res.results.size() < *expected_results)
    res.failures.push_back("only " + std::to_string(res.results.size()) + " of " + std::to_string(*expected_results) +
                           " workers reported a result");
  res.ok = res.failures.empty() && !res.stopped() && res.reason.empty();
  if (res.reason.empty() && !res.failures.empty()) res.reason = res.failures.front();
  if (!res.ok && !res.stopped() && res.code != errc::refused) res.code = errc::job_failed;
}

job_result run_job(caf::actor_system& sys, const node_config& cfg, const app_fn& app,
                   const std::string& app_name, const job_settings& settings, const job_listener& listener) {
  job_result res;
  auto start = std::chrono::steady_clock::now();
  caf::scoped_actor observer{sys};
  running_coordinator started;
  try {
    started = start_coordinator(sys, cfg, settings, app_name, caf::actor_cast<observer_actor>(observer));
  } catch (const bad_request& e) {
    res.failures.push_back(e.what());
    conclude(res, std::nullopt);  // the last line names why
    return res;
  }
  auto coord = started.coord;
  local_cluster cluster(cfg);
  if (cfg.cluster == "embedded") {
    cluster.start_embedded(sys, coord, app);
  } else if (auto port = guarded_publish(coord, 0, "127.0.0.1", false); !port) {
    res.failures.push_back("cannot publish the coordinator: " + describe(port.error()));
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    conclude(res, std::nullopt);
    return res;
  } else {
    try {
      cluster.start_processes(*port, app_name);
    } catch (const bad_request& e) {
      res.failures.push_back(e.what());  // watch_coordinator ends the job
    }
  }
  // Collect reports until the coordinator ends (all workers done) or the job failed.
  if (!watch_coordinator(observer, coord, res, listener, cfg, [&] { cluster.check_children(res); }))
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  started.end_checkpointer();
  cluster.reap(res);
  std::size_t workers_killed = 0;  // by the fault plan: they report nothing
  for (const auto& k : cfg.fault_spec().kills) workers_killed += k.who == fault_plan::role::worker;
  conclude(res, cfg.workers - workers_killed);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

}  // namespace ps

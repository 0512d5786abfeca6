// psctl: an operator's commands to a running job's coordinator.
//   psctl --coordinator=HOST:PORT status [--json]   members, map epoch, each shard's keys,
//                                                   rows, bytes, memory, disk reads and
//                                                   request rates, each worker's clock
//   psctl --coordinator=HOST:PORT checkpoint        a checkpoint at the next clock boundary
//   psctl --coordinator=HOST:PORT remove-shard ID   the shard's keys and rows go to the
//                                                   others; returns once they have them
//   psctl --coordinator=HOST:PORT stop [REASON]     end the job: every member ends with
//                                                   "status":"stopped", the coordinator exits 0
//   psctl stop HOST:PORT [REASON]                   the same stop, as first written
//   psctl --coordinator=HOST:PORT rolling-restart --start=COMMAND
//                                                   every shard replaced in turn: COMMAND
//                                                   (through /bin/sh) starts a server that
//                                                   joins, then the old shard leaves
// --secret-file=PATH, --tls-cert/--tls-key/--tls-ca=PATH (before the command): the job's
// shared secret and TLS files, when its members have them.
// status prints a table, or with --json one JSON object; the others one JSON line. Exit 0
// when the coordinator took the command, 1 when it could not be reached or refused, 2 for
// a bad command line.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include <caf/io/all.hpp>

#include "libps/observe/cluster_status.hpp"
#include "runtime/node_parts.hpp"
#include "runtime/guarded_net.hpp"
#include "runtime/node.hpp"

namespace {

constexpr const char* usage_text =
  "usage: psctl [--secret-file=PATH] [--tls-cert=PEM --tls-key=PEM --tls-ca=PEM] --coordinator=HOST:PORT status [--json]\n"
  "       psctl --coordinator=HOST:PORT checkpoint\n"
  "       psctl --coordinator=HOST:PORT remove-shard ID\n"
  "       psctl --coordinator=HOST:PORT stop [REASON]\n"
  "       psctl stop HOST:PORT [REASON]\n"
  "       psctl --coordinator=HOST:PORT rolling-restart --start='psnode --role=server --coordinator=HOST:PORT ...'\n";

int usage(const std::string& why) {
  std::fprintf(stderr, "psctl: %s\n%s", why.c_str(), usage_text);
  return 2;
}

struct command {
  std::string name, address, secret_file, tls_cert, tls_key, tls_ca;
  std::vector<std::string> rest;  // after the command's name
};

// The command line as a command; nullopt (after printing why) when it is not one.
std::optional<command> parse(std::vector<std::string> args) {
  command c;
  for (bool more = true; more && !args.empty();) {
    more = false;
    for (auto [flag, into] : {std::pair{"--coordinator=", &c.address}, std::pair{"--secret-file=", &c.secret_file},
                              std::pair{"--tls-cert=", &c.tls_cert}, std::pair{"--tls-key=", &c.tls_key},
                              std::pair{"--tls-ca=", &c.tls_ca}})
      if (args[0].rfind(flag, 0) == 0) {
        *into = args[0].substr(std::string(flag).size());
        args.erase(args.begin());
        more = true;
        break;
      }
  }
  if (args.empty()) {
    usage("a command is needed");
    return std::nullopt;
  }
  c.name = args[0];
  c.rest.assign(args.begin() + 1, args.end());
  if (c.address.empty() && c.name == "stop" && !c.rest.empty()) {  // psctl stop HOST:PORT [REASON]
    c.address = c.rest[0];
    c.rest.erase(c.rest.begin());
  }
  std::string wrong;
  if (c.name != "status" && c.name != "checkpoint" && c.name != "stop" && c.name != "remove-shard" &&
      c.name != "rolling-restart")
    wrong = "unknown command \"" + c.name + "\"";
  else if (c.address.empty())
    wrong = c.name + " needs --coordinator=HOST:PORT";
  else if (c.name == "status" && !(c.rest.empty() || (c.rest.size() == 1 && c.rest[0] == "--json")))
    wrong = "status takes only --json";
  else if (c.name == "checkpoint" && !c.rest.empty())
    wrong = "checkpoint takes no arguments";
  else if (c.name == "remove-shard" &&
           (c.rest.size() != 1 || c.rest[0].empty() || c.rest[0].size() > 9 ||
            c.rest[0].find_first_not_of("0123456789") != std::string::npos))
    wrong = "remove-shard takes one shard id (a number, as psctl status shows it)";
  else if (c.name == "rolling-restart" && (c.rest.size() != 1 || c.rest[0].rfind("--start=", 0) != 0 ||
                                           c.rest[0].size() == 8))
    wrong = "rolling-restart takes --start=COMMAND: how to start one new server (run through /bin/sh)";
  else if (c.name == "stop" && c.rest.size() > 1)
    wrong = "stop takes one reason (quote it)";
  if (!wrong.empty()) {
    usage(wrong);
    return std::nullopt;
  }
  return c;
}

// Sends the request and waits for its answer; the error text, or "" with the answer in *out.
template <class Answer, class... Ts>
std::string ask(caf::actor_system& sys, const ps::coordinator_actor& coord, std::chrono::seconds timeout, Answer* out,
                Ts... xs) {
  std::string err;
  caf::scoped_actor self{sys};
  self->request(coord, timeout, xs...)
    .receive([&](Answer& a) { *out = std::move(a); }, [&](caf::error& e) { err = ps::describe(e); });
  return err;
}

// The ids of the shards in the map, from the coordinator's status.
std::set<std::uint32_t> shard_ids(caf::actor_system& sys, const ps::coordinator_actor& coord, std::string& err) {
  std::string status;
  err = ask(sys, coord, std::chrono::seconds(15), &status, ps::status_atom::value);
  std::set<std::uint32_t> ids;
  if (!err.empty()) return ids;
  auto parsed = nlohmann::json::parse(status);  // held: a range-for over a temporary's member dangles
  for (const auto& s : parsed.at("shards")) ids.insert(s.at("id").get<std::uint32_t>());
  return ids;
}

// COMMAND through /bin/sh in a session of its own, outliving psctl; its stdout goes to
// psctl's stderr (psctl's stdout carries only its JSON lines).
std::string start_server(const std::string& command) {
  pid_t pid = fork();
  if (pid < 0) return std::string("cannot start a process: ") + std::strerror(errno);
  if (pid == 0) {
    setsid();
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return "";
}

// Waits until the map holds a shard that is not in `known` (the server COMMAND started has
// joined and its share was handed over); its id, or nullopt with why in err.
std::optional<std::uint32_t> await_new_shard(caf::actor_system& sys, const ps::coordinator_actor& coord,
                                             const std::set<std::uint32_t>& known, std::string& err) {
  const auto start = std::chrono::steady_clock::now();
  for (auto said = start;;) {
    for (auto id : shard_ids(sys, coord, err))
      if (!known.count(id)) return id;
    if (!err.empty()) return std::nullopt;
    auto now = std::chrono::steady_clock::now();
    if (now - start > std::chrono::seconds(120)) {
      err = "no new server joined within 120 s of --start's command (does it reach the coordinator?)";
      return std::nullopt;
    }
    if (now - said > std::chrono::seconds(5)) {
      std::fprintf(stderr, "psctl: waiting for the new server to join\n");
      said = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the coordinator offers no join notice to psctl
  }
}

// remove-shard, again while the join's map change is still under way (refused for now).
std::string remove_when_settled(caf::actor_system& sys, const ps::coordinator_actor& coord, std::uint32_t id,
                                std::string& news) {
  caf::scoped_actor self{sys};
  return ps::remove_shard_when_settled(self, coord, id, std::chrono::seconds(120), &news);
}

// Every shard of the map at the start, in turn: a new server joins (taking its share from
// all), then the old shard leaves (its server process exits once its keys are handed over).
// One JSON line per replaced shard, then the status line.
int rolling_restart(caf::actor_system& sys, const ps::coordinator_actor& coord, const std::string& command,
                    ps::json_line& line) {
  std::string err;
  auto fail = [&](const std::string& why) { return ps::print_status(line, false, ps::errc::failed, why); };
  auto old_ids = shard_ids(sys, coord, err);
  if (!err.empty()) return fail(err);
  if (old_ids.empty()) return fail("the job has no shards to replace (has it formed?)");
  auto known = old_ids;
  std::vector<std::uint32_t> replaced_by;
  for (auto old : old_ids) {
    const auto start = std::chrono::steady_clock::now();
    if (err = start_server(command); !err.empty()) return fail(err);
    auto fresh = await_new_shard(sys, coord, known, err);
    if (!fresh) return fail("replacing shard " + std::to_string(old) + ": " + err);
    known.insert(*fresh);
    std::string news;
    if (err = remove_when_settled(sys, coord, old, news); !err.empty())
      return fail("shard " + std::to_string(*fresh) + " joined, but shard " + std::to_string(old) + " did not leave: " + err);
    replaced_by.push_back(*fresh);
    std::printf("%s\n", ps::json_line{{"replaced", old}, {"by", *fresh}, {"left", news},
                                      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}}
                            .dump().c_str());
    std::fflush(stdout);
  }
  line["shards_before"] = old_ids;
  line["shards_after"] = replaced_by;
  return ps::print_status(line, true, ps::errc::stopped, "");
}

int run(caf::actor_system& sys, const command& c) {
  ps::json_line line{{"command", c.name}, {"coordinator", c.address}};
  auto [host, port] = ps::parse_host_port(c.address);
  ps::net_guard_options guard;
  if (!c.secret_file.empty()) guard.secret = ps::read_secret_file(c.secret_file);
  if (!c.tls_cert.empty()) guard.tls = std::make_shared<ps::tls_context>(c.tls_cert, c.tls_key, c.tls_ca);
  ps::configure_net_guard(sys, guard);
  auto coord = ps::guarded_remote_actor<ps::coordinator_actor>(sys, host, port);
  if (!coord)
    return ps::print_status(line, false, ps::code_of(coord.error()),
                            "cannot reach the coordinator at " + c.address + ": " + ps::describe(coord.error()));
  auto refused = [&](const std::string& err) {
    return ps::print_status(line, false, ps::errc::failed, "the coordinator at " + c.address + ": " + err);
  };
  if (c.name == "status") {
    std::string status;
    if (auto err = ask(sys, *coord, std::chrono::seconds(15), &status, ps::status_atom::value); !err.empty()) return refused(err);
    std::printf("%s\n", c.rest.empty() ? ps::status_table(status).c_str() : status.c_str());
    return 0;
  }
  if (c.name == "checkpoint") {
    std::uint64_t boundary = 0;
    if (auto err = ask(sys, *coord, std::chrono::seconds(15), &boundary, ps::checkpoint_now_atom::value); !err.empty()) return refused(err);
    line["clock"] = boundary;
    return ps::print_status(line, true, ps::errc::stopped, "");
  }
  if (c.name == "remove-shard") {
    // A drain moves the shard's whole state: far longer than a status may take.
    auto id = static_cast<std::uint32_t>(std::stoul(c.rest[0]));
    std::string news;
    line["shard"] = id;
    if (auto err = ask(sys, *coord, std::chrono::seconds(600), &news, ps::remove_shard_atom::value, id); !err.empty())
      return refused(err);
    line["done"] = news;
    return ps::print_status(line, true, ps::errc::stopped, "");
  }
  if (c.name == "rolling-restart") return rolling_restart(sys, *coord, c.rest[0].substr(8), line);
  caf::ok_atom ok;
  const std::string reason = c.rest.empty() ? "stopped by the operator (psctl stop)" : c.rest[0];
  if (auto err = ask(sys, *coord, std::chrono::seconds(15), &ok, ps::stop_atom::value, static_cast<std::uint8_t>(ps::errc::stopped), reason);
      !err.empty())
    return refused(err);
  return ps::print_status(line, true, ps::errc::stopped, "");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("%s", usage_text);
    return 0;
  }
  auto c = parse(args);
  if (!c) return 2;
  try {
    ps::parse_host_port(c->address);
    ps::node_config cfg;  // registers the message types and loads the network layer
    caf::actor_system sys{cfg};
    return run(sys, *c);
  } catch (const ps::bad_request& e) {
    return usage(e.what());
  }
}

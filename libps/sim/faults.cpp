#include "libps/sim/faults.hpp"


#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "libps/keys/keys.hpp"
#include "libps/observe/text.hpp"

namespace ps {

namespace {

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// One clause: its words and KEY=VALUE arguments, each used exactly once.
struct clause {
  std::string text;
  std::vector<std::string> words;
  std::map<std::string, std::string> args;

  [[noreturn]] void fail(const std::string& what) const {
    throw bad_request("--faults: \"" + text + "\": " + what);
  }
  std::string take(const std::string& key) {
    auto it = args.find(key);
    if (it == args.end()) fail("missing " + key + "=");
    auto v = it->second;
    args.erase(it);
    return v;
  }
  std::uint64_t take_uint(const std::string& key, std::uint64_t max) {
    auto v = take(key);
    auto n = parse_count(v);
    if (!n || *n > max) fail(key + "=" + v + " is not an integer in [0, " + std::to_string(max) + "]");
    return *n;
  }
  double take_double(const std::string& key, double lo, double hi, bool lo_open) {
    auto v = take(key);
    auto d = parse_number(v);
    bool ok = d && *d <= hi && (lo_open ? *d > lo : *d >= lo);
    if (!ok) {
      std::ostringstream range;
      range << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
      fail(key + "=" + v + " is not a number in " + range.str());
    }
    return *d;
  }
  void done() const {
    if (!args.empty()) fail("unknown argument " + args.begin()->first + "=");
  }
};

clause parse_clause(const std::string& raw) {
  clause c;
  c.text = trim(raw);
  std::istringstream in(c.text);
  std::string tok;
  while (in >> tok) {
    auto eq = tok.find('=');
    if (eq == std::string::npos) {
      if (!c.args.empty()) c.fail("\"" + tok + "\" after the arguments");
      c.words.push_back(tok);
      continue;
    }
    auto key = tok.substr(0, eq);
    if (key.empty()) c.fail("\"" + tok + "\" has no name before '='");
    if (c.args.count(key)) c.fail(key + "= given twice");
    c.args[key] = tok.substr(eq + 1);
  }
  return c;
}

}  // namespace

fault_plan parse_faults(const std::string& spec) {
  fault_plan p;
  bool drop_seen = false, dup_seen = false, delay_seen = false;
  for (const auto& raw : split(spec, ';')) {
    auto c = parse_clause(raw);
    if (c.words.empty()) {
      if (c.args.empty()) continue;  // empty clause ("a;;b" or a trailing ';')
      c.fail("no fault named (expected kill, slow, drop, delay or duplicate)");
    }
    const auto& verb = c.words[0];
    if (c.words.size() > 1) c.fail("unexpected word \"" + c.words[1] + "\"");
    if (verb == "kill") {
      bool server = c.args.count("server") > 0, worker = c.args.count("worker") > 0;
      if (server == worker) c.fail("kill needs exactly one of server=I or worker=I");
      fault_plan::kill k{server ? fault_plan::role::server : fault_plan::role::worker, 0, 0};
      k.id = static_cast<std::uint32_t>(c.take_uint(server ? "server" : "worker", 1023));
      if (server && c.args.count("at") && c.args["at"] == "handoff") {
        c.args.erase("at");
        k.at = fault_plan::at_handoff;
      } else {
        k.at = c.take_uint("at", UINT64_MAX - 1);
      }
      if (k.at == 0) c.fail("at=0: a kill needs a clock >= 1 (the member must have started)");
      for (const auto& other : p.kills)
        if (other.who == k.who && other.id == k.id) c.fail("that member is already killed by an earlier clause");
      c.done();
      p.kills.push_back(k);
    } else if (verb == "slow") {
      fault_plan::slow s{};
      s.worker = static_cast<std::uint32_t>(c.take_uint("worker", 1023));
      s.factor = c.take_double("factor", 1, 1000, false);
      c.done();
      p.slows.push_back(s);
    } else if (verb == "drop" || verb == "duplicate") {
      auto& seen = verb == "drop" ? drop_seen : dup_seen;
      if (seen) c.fail(verb + " given twice");
      seen = true;
      // At most one in two: every request has to get through eventually.
      auto prob = c.take_double("p", 0, 0.5, true);
      auto seed = c.take_uint("seed", UINT64_MAX);
      c.done();
      (verb == "drop" ? p.drop_p : p.duplicate_p) = prob;
      (verb == "drop" ? p.drop_seed : p.duplicate_seed) = seed;
    } else if (verb == "delay") {
      if (delay_seen) c.fail("delay given twice");
      delay_seen = true;
      p.delay_ms = c.take_uint("ms", 60000);
      c.done();
    } else {
      c.fail("unknown fault \"" + verb + "\" (expected kill, slow, drop, delay or duplicate)");
    }
  }
  return p;
}

std::string to_string(const fault_plan& p) {
  std::ostringstream out;
  auto sep = [&] {
    if (out.tellp() > 0) out << ";";
  };
  for (const auto& k : p.kills) {
    sep();
    out << "kill " << (k.who == fault_plan::role::server ? "server=" : "worker=") << k.id << " at=";
    if (k.at == fault_plan::at_handoff) out << "handoff";
    else out << k.at;
  }
  for (const auto& s : p.slows) {
    sep();
    out << "slow worker=" << s.worker << " factor=" << s.factor;
  }
  if (p.drop_p > 0) {
    sep();
    out << "drop p=" << p.drop_p << " seed=" << p.drop_seed;
  }
  if (p.delay_ms > 0) {
    sep();
    out << "delay ms=" << p.delay_ms;
  }
  if (p.duplicate_p > 0) {
    sep();
    out << "duplicate p=" << p.duplicate_p << " seed=" << p.duplicate_seed;
  }
  return out.str();
}

bool fault_plan::empty() const {
  return kills.empty() && slows.empty() && !touches_messages();
}

std::optional<std::uint64_t> fault_plan::kill_clock(role who, std::uint32_t id) const {
  for (const auto& k : kills)
    if (k.who == who && k.id == id && k.at != at_handoff) return k.at;
  return std::nullopt;
}

bool fault_plan::kills_at_handoff(std::uint32_t server) const {
  for (const auto& k : kills)
    if (k.who == role::server && k.id == server && k.at == at_handoff) return true;
  return false;
}

double fault_plan::slow_factor(std::uint32_t w) const {
  double f = 1;
  for (const auto& s : slows)
    if (s.worker == w) f *= s.factor;
  return f;
}

void fault_plan::check_against(std::size_t servers, std::size_t workers) const {
  for (const auto& k : kills) {
    bool server = k.who == role::server;
    auto n = server ? servers : workers;
    if (k.id >= n)
      throw bad_request(std::string("--faults: kill ") + (server ? "server=" : "worker=") + std::to_string(k.id) +
                        ": the job has only " + std::to_string(n) + (server ? " servers" : " workers"));
  }
  std::size_t killed_workers = 0;
  for (const auto& k : kills) killed_workers += k.who == role::worker;
  if (killed_workers >= workers)
    throw bad_request("--faults: every worker is killed, nobody would finish the job");
  for (const auto& s : slows)
    if (s.worker >= workers)
      throw bad_request("--faults: slow worker=" + std::to_string(s.worker) + ": the job has only " +
                        std::to_string(workers) + " workers");
}

message_faults::message_faults(const fault_plan& plan, std::uint64_t sender)
    : drop_p_(plan.drop_p),
      duplicate_p_(plan.duplicate_p),
      delay_ms_(plan.delay_ms),
      drop_rng_(plan.drop_seed * 0x9E3779B97F4A7C15ull + sender),
      duplicate_rng_(plan.duplicate_seed * 0x9E3779B97F4A7C15ull + sender + 1) {}

message_faults::verdict message_faults::next() {
  verdict v;
  std::uniform_real_distribution<double> u(0, 1);
  if (drop_p_ > 0) v.drop = u(drop_rng_) < drop_p_;
  if (duplicate_p_ > 0) v.duplicate = u(duplicate_rng_) < duplicate_p_;
  v.delay_ms = delay_ms_;
  return v;
}


}  // namespace ps

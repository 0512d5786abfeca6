#include "libps/trace.hpp"

#include <algorithm>
#include <fstream>
#include <map>

#include "libps/consistency.hpp"
#include "libps/keys.hpp"

namespace ps {

namespace {

std::string clock_text(std::uint64_t c) { return c == left_clock ? "\"inf\"" : std::to_string(c); }

const char* kind_name(trace_event::kind_type k) {
  switch (k) {
    case trace_event::push: return "push";
    case trace_event::pull: return "pull";
    case trace_event::leave: return "leave";
  }
  return "?";
}

// The value of "name": in a flat JSON object of numbers and plain strings.
bool field(const std::string& line, const std::string& name, std::string& out) {
  auto key = "\"" + name + "\":";
  auto at = line.find(key);
  if (at == std::string::npos) return false;
  auto b = at + key.size();
  if (b < line.size() && line[b] == '"') {
    auto e = line.find('"', b + 1);
    if (e == std::string::npos) return false;
    out = line.substr(b + 1, e - b - 1);
    return true;
  }
  auto e = line.find_first_of(",}", b);
  if (e == std::string::npos) return false;
  out = line.substr(b, e - b);
  return true;
}

std::uint64_t number(const std::string& line, const std::string& name, bool inf_ok) {
  std::string v;
  if (!field(line, name, v)) throw bad_request("trace line has no \"" + name + "\": " + line);
  if (inf_ok && v == "inf") return UINT64_MAX;
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
    throw bad_request("trace line: \"" + name + "\" is not a number: " + line);
  return std::stoull(v);
}

}  // namespace

std::string to_json(const trace_event& e) {
  std::string s = "{\"ev\":\"" + std::string(kind_name(e.kind)) + "\",\"worker\":" + std::to_string(e.worker);
  if (e.kind != trace_event::leave) s += ",\"clock\":" + std::to_string(e.clock);
  s += ",\"shard\":" + std::to_string(e.shard);
  if (e.kind == trace_event::pull)
    s += ",\"min_clock\":" + clock_text(e.min_clock) + ",\"staleness\":" +
         (e.staleness == infinite_staleness ? std::string("\"inf\"") : std::to_string(e.staleness));
  return s + "}";
}

trace_event parse_trace_line(const std::string& line) {
  std::string ev;
  if (line.empty() || line.front() != '{' || line.back() != '}' || !field(line, "ev", ev))
    throw bad_request("not a trace line: " + line);
  trace_event e;
  if (ev == "push") e.kind = trace_event::push;
  else if (ev == "pull") e.kind = trace_event::pull;
  else if (ev == "leave") e.kind = trace_event::leave;
  else throw bad_request("trace line: unknown event \"" + ev + "\": " + line);
  e.worker = static_cast<std::uint32_t>(number(line, "worker", false));
  e.shard = static_cast<std::uint32_t>(number(line, "shard", false));
  if (e.kind != trace_event::leave) e.clock = number(line, "clock", false);
  if (e.kind == trace_event::pull) {
    e.min_clock = number(line, "min_clock", true);
    e.staleness = number(line, "staleness", true);
  }
  return e;
}

std::vector<trace_event> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw bad_request("cannot open trace file " + path);
  std::vector<trace_event> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      out.push_back(parse_trace_line(line));
    } catch (const bad_request& e) {
      throw bad_request(path + ":" + std::to_string(n) + ": " + e.what());
    }
  }
  return out;
}

trace_report check_trace(const std::vector<trace_event>& events) {
  trace_report rep;
  std::map<std::uint32_t, std::vector<const trace_event*>> by_shard;
  for (const auto& e : events) {
    by_shard[e.shard].push_back(&e);
    if (e.kind == trace_event::push) ++rep.pushes;
    if (e.kind == trace_event::pull) ++rep.pulls;
  }
  for (auto& [shard, evs] : by_shard) {
    // BSP reads are exact: walking forwards, no push of clock >= c may precede a read at c.
    std::uint64_t highest_push = 0;
    bool any_push = false;
    for (const auto* e : evs) {
      if (e->kind == trace_event::push) {
        highest_push = any_push ? std::max(highest_push, e->clock) : e->clock;
        any_push = true;
      } else if (e->kind == trace_event::pull && e->staleness == 0 && any_push && highest_push >= e->clock) {
        rep.violations.push_back("shard " + std::to_string(shard) + ": BSP pull by worker " +
                                 std::to_string(e->worker) + " at clock " + std::to_string(e->clock) +
                                 " saw a push of clock " + std::to_string(highest_push));
      }
    }
    // Walking backwards: later[w] is the lowest clock of a push by w after this point.
    std::map<std::uint32_t, std::uint64_t> later;
    for (auto it = evs.rbegin(); it != evs.rend(); ++it) {
      const auto& e = **it;
      if (e.kind == trace_event::push) {
        auto [pos, fresh] = later.emplace(e.worker, e.clock);
        if (!fresh) pos->second = std::min(pos->second, e.clock);
        continue;
      }
      if (e.kind != trace_event::pull) continue;
      auto where = "shard " + std::to_string(shard) + ": pull by worker " + std::to_string(e.worker) +
                   " at clock " + std::to_string(e.clock) + " (staleness " +
                   staleness_to_string(e.staleness) + ")";
      staleness_controller bound(0, e.staleness);
      auto need = bound.needed_min(e.clock);
      if (e.min_clock != left_clock) rep.max_lag = std::max(rep.max_lag, e.clock > e.min_clock ? e.clock - e.min_clock : 0);
      if (e.min_clock < need)
        rep.violations.push_back(where + " answered while the min clock was " + std::to_string(e.min_clock));
      for (auto [w, c] : later) {
        // need = c - s: pushes with clock < need must be in; own pushes with clock < c too.
        if (c < need)
          rep.violations.push_back(where + " missed worker " + std::to_string(w) + "'s push of clock " +
                                   std::to_string(c) + " (applied after it)");
        else if (w == e.worker && c < e.clock)
          rep.violations.push_back(where + " missed its own push of clock " + std::to_string(c));
      }
    }
  }
  return rep;
}

}  // namespace ps

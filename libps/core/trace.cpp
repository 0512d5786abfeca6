#include "libps/core/trace.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "libps/core/consistency.hpp"
#include "libps/keys/keys.hpp"

#include <nlohmann/json.hpp>

namespace ps {

namespace {

using json = nlohmann::ordered_json;

json clock_json(std::uint64_t c, std::uint64_t inf) { return c == inf ? json("inf") : json(c); }

const char* kind_name(trace_event::kind_type k) {
  switch (k) {
    case trace_event::push: return "push";
    case trace_event::pull: return "pull";
    case trace_event::leave: return "leave";
  }
  return "?";
}

// Field `name` of a trace line: a non-negative integer, or "inf" where inf_ok.
std::uint64_t number(const json& j, const std::string& line, const std::string& name, bool inf_ok) {
  auto it = j.find(name);
  if (it == j.end()) throw bad_request("trace line has no \"" + name + "\": " + line);
  if (inf_ok && *it == "inf") return UINT64_MAX;
  if (!it->is_number_unsigned()) throw bad_request("trace line: \"" + name + "\" is not a number: " + line);
  return it->get<std::uint64_t>();
}

}  // namespace

std::string to_json(const trace_event& e) {
  json j{{"ev", kind_name(e.kind)}, {"worker", e.worker}};
  if (e.kind != trace_event::leave) j["clock"] = e.clock;
  j["shard"] = e.shard;
  if (e.kind == trace_event::pull) {
    j["min_clock"] = clock_json(e.min_clock, left_clock);
    j["staleness"] = clock_json(e.staleness, infinite_staleness);
  }
  if (e.copy != 0) j["copy"] = e.copy;
  if (e.moved) j["moved"] = true;
  return j.dump();
}

trace_event parse_trace_line(const std::string& line) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    throw bad_request("not a trace line (" + std::string(e.what()) + "): " + line);
  }
  if (!j.is_object() || !j.contains("ev") || !j["ev"].is_string()) throw bad_request("not a trace line: " + line);
  auto ev = j["ev"].get<std::string>();
  trace_event e;
  if (ev == "push") e.kind = trace_event::push;
  else if (ev == "pull") e.kind = trace_event::pull;
  else if (ev == "leave") e.kind = trace_event::leave;
  else throw bad_request("trace line: unknown event \"" + ev + "\": " + line);
  e.worker = static_cast<std::uint32_t>(number(j, line, "worker", false));
  e.shard = static_cast<std::uint32_t>(number(j, line, "shard", false));
  if (e.kind != trace_event::leave) e.clock = number(j, line, "clock", false);
  if (e.kind == trace_event::pull) {
    e.min_clock = number(j, line, "min_clock", true);
    e.staleness = number(j, line, "staleness", true);
  }
  if (j.contains("copy")) e.copy = number(j, line, "copy", false);
  if (j.contains("moved")) {
    if (!j["moved"].is_boolean()) throw bad_request("trace line: \"moved\" is not true or false: " + line);
    e.moved = j["moved"].get<bool>();
  }
  return e;
}


namespace {

using copy_events = std::vector<const trace_event*>;

// BSP reads are exact: walking forwards, no push of clock >= c may precede a read at c.
void check_bsp_reads(std::uint32_t shard, const copy_events& evs, trace_report& rep) {
  std::uint64_t highest_push = 0;
  bool any_push = false;
  for (const auto* e : evs) {
    if (e->kind == trace_event::push) {
      highest_push = any_push ? std::max(highest_push, e->clock) : e->clock;
      any_push = true;
    } else if (e->kind == trace_event::pull && e->staleness == 0 && any_push && highest_push >= e->clock) {
      rep.violations.push_back("shard " + std::to_string(shard) + ": BSP pull by worker " + std::to_string(e->worker) +
                               " at clock " + std::to_string(e->clock) + " saw a push of clock " +
                               std::to_string(highest_push));
    }
  }
}

// Every read within its staleness bound: walking backwards, later[w] is the lowest clock
// of a push by w after this point, and none below the bound may come after the read.
void check_bounded_reads(std::uint32_t shard, const copy_events& evs, trace_report& rep) {
  std::map<std::uint32_t, std::uint64_t> later;
  for (auto it = evs.rbegin(); it != evs.rend(); ++it) {
    const auto& e = **it;
    if (e.kind == trace_event::push) {
      auto [pos, fresh] = later.emplace(e.worker, e.clock);
      if (!fresh) pos->second = std::min(pos->second, e.clock);
      continue;
    }
    if (e.kind != trace_event::pull) continue;
    auto where = "shard " + std::to_string(shard) + ": pull by worker " + std::to_string(e.worker) + " at clock " +
                 std::to_string(e.clock) + " (staleness " + staleness_to_string(e.staleness) + ")";
    staleness_controller bound(0, e.staleness);
    auto need = bound.needed_min(e.clock);
    if (e.min_clock != left_clock) rep.max_lag = std::max(rep.max_lag, e.clock > e.min_clock ? e.clock - e.min_clock : 0);
    if (e.min_clock < need) rep.violations.push_back(where + " answered while the min clock was " + std::to_string(e.min_clock));
    for (auto [w, c] : later) {
      // need = c - s: pushes with clock < need must be in; own pushes with clock < c too.
      if (c < need)
        rep.violations.push_back(where + " missed worker " + std::to_string(w) + "'s push of clock " + std::to_string(c) +
                                 " (applied after it)");
      else if (w == e.worker && c < e.clock)
        rep.violations.push_back(where + " missed its own push of clock " + std::to_string(c));
    }
  }
}

}  // namespace

trace_report check_trace(const std::vector<trace_event>& events) {
  trace_report rep;
  std::map<std::pair<std::uint32_t, std::uint64_t>, copy_events> by_copy;
  std::set<std::tuple<std::uint32_t, std::uint64_t, std::uint32_t>> left;  // (shard, copy, worker)
  for (const auto& e : events) {
    if (e.kind == trace_event::push) ++rep.pushes;
    if (e.kind == trace_event::push && e.moved) continue;  // not bound by this copy's order (trace_event::moved)
    if (e.kind == trace_event::leave) left.emplace(e.shard, e.copy, e.worker);
    // A reader that left this copy's clock vector before its read was answered (it died,
    // or finished and no longer waits) counts as +infinity there: no bound holds for it.
    if (e.kind == trace_event::pull && left.count({e.shard, e.copy, e.worker})) {
      ++rep.reads_after_leave;
      continue;
    }
    by_copy[{e.shard, e.copy}].push_back(&e);
    if (e.kind == trace_event::pull) ++rep.pulls;
  }
  for (auto& [copy, evs] : by_copy) {
    check_bsp_reads(copy.first, evs, rep);
    check_bounded_reads(copy.first, evs, rep);
  }
  return rep;
}

}  // namespace ps

#include "actors/reduction_plan.hpp"

#include <numeric>

#include "libps/keys/keys.hpp"

namespace ps {

strategy parse_strategy(const std::string& name) {
  if (name == "central") return strategy::central;
  if (name == "block") return strategy::block;
  if (name == "ring") return strategy::ring;
  throw bad_request("unknown aggregation strategy \"" + name + "\" (expected central, block or ring)");
}

const char* name(strategy s) {
  switch (s) {
    case strategy::central: return "central";
    case strategy::block: return "block";
    case strategy::ring: return "ring";
  }
  return "?";
}

elem_range block_range(std::size_t n, std::size_t parts, std::size_t b) {
  const std::size_t base = n / parts, extra = n % parts;
  const std::size_t begin = b * base + (b < extra ? b : extra);
  return {begin, begin + base + (b < extra ? 1 : 0)};
}

namespace {

std::vector<std::size_t> all_devices(std::size_t n) {
  std::vector<std::size_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Device d's buffer first (the sum is then in place), then the others in rank order.
std::vector<std::size_t> own_first(std::size_t d, std::size_t n) {
  std::vector<std::size_t> v{d};
  for (std::size_t j = 0; j < n; ++j)
    if (j != d) v.push_back(j);
  return v;
}

// Device d gets every block j != d from device j, which holds block j complete.
std::vector<plan_op> block_all_gather(std::size_t n) {
  std::vector<plan_op> phase;
  for (std::size_t d = 0; d < n; ++d)
    for (std::size_t j = 0; j < n; ++j)
      if (j != d) phase.push_back({d, j, d, {j}});
  return phase;
}

// Ring all-gather, starting when device d holds block (d + 1) % n complete: at step s device d
// copies block (d - s) from its left neighbour.
void ring_all_gather(reduction_plan& p) {
  const std::size_t n = p.devices;
  for (std::size_t s = 0; s + 1 < n; ++s) {
    std::vector<plan_op> phase;
    for (std::size_t d = 0; d < n; ++d) {
      const std::size_t c = (d + n - s % n) % n;
      phase.push_back({d, c, d, {ring_left(d, n)}});
    }
    p.phases.push_back(std::move(phase));
  }
}

}  // namespace

namespace {

// One device holds every result: it sums (or gets the host's values), then copies to the rest.
void central_plan(reduction_plan& p, plan_goal goal, std::size_t n, std::size_t host) {
  p.parts = 1;
  p.result_owner = {0};
  if (goal == plan_goal::broadcast) {
    p.phases.push_back({{0, 0, 0, {host}}});
  } else {
    p.phases.push_back({{0, 0, goal == plan_goal::reduce ? host : 0, all_devices(n)}});
    if (goal == plan_goal::reduce || goal == plan_goal::reduce_in_place) return;
  }
  if (n > 1) {
    std::vector<plan_op> copy;
    for (std::size_t d = 1; d < n; ++d) copy.push_back({d, 0, d, {0}});
    p.phases.push_back(std::move(copy));
  }
}

// Device d owns block d: it sums every device's block d, then (allreduce, broadcast) the
// blocks are gathered everywhere.
void block_plan(reduction_plan& p, plan_goal goal, std::size_t n, std::size_t host) {
  p.parts = n;
  p.result_owner = all_devices(n);
  std::vector<plan_op> first;
  for (std::size_t d = 0; d < n; ++d) {
    if (goal == plan_goal::reduce)
      first.push_back({d, d, host, all_devices(n)});  // the gather is the write to the host
    else if (goal == plan_goal::broadcast)
      first.push_back({d, d, d, {host}});
    else
      first.push_back({d, d, d, own_first(d, n)});
  }
  p.phases.push_back(std::move(first));
  if ((goal == plan_goal::allreduce || goal == plan_goal::broadcast) && n > 1) p.phases.push_back(block_all_gather(n));
}

// The ring: scatter-reduce around it, then (allreduce) an all-gather.
void ring_plan(reduction_plan& p, plan_goal goal, std::size_t n, std::size_t host) {
  p.parts = n;
  for (std::size_t b = 0; b < n; ++b) p.result_owner.push_back(ring_left(b, n));  // d holds d + 1
  if (goal == plan_goal::broadcast) {
    std::vector<plan_op> first;
    for (std::size_t d = 0; d < n; ++d) first.push_back({d, ring_right(d, n), d, {host}});
    p.phases.push_back(std::move(first));
    ring_all_gather(p);
    return;
  }
  if (n == 1) {
    if (goal == plan_goal::reduce) p.phases.push_back({{0, 0, host, {0}}});
    return;
  }
  // Scatter-reduce: at step s device d adds its left neighbour's partial sum of block
  // (d - s - 1) into its own, in place; after n - 1 steps it holds block (d + 1) complete.
  // For a reduce, the last step writes the complete block to the host buffer instead.
  for (std::size_t s = 0; s + 1 < n; ++s) {
    std::vector<plan_op> phase;
    const bool last = s + 2 == n;
    for (std::size_t d = 0; d < n; ++d) {
      const std::size_t c = (d + 2 * n - s - 1) % n;
      const std::size_t dst = last && goal == plan_goal::reduce ? host : d;
      phase.push_back({d, c, dst, {d, ring_left(d, n)}});  // own first: in place
    }
    p.phases.push_back(std::move(phase));
  }
  if (goal == plan_goal::allreduce) ring_all_gather(p);
}

}  // namespace

reduction_plan make_plan(strategy how, plan_goal goal, std::size_t devices) {
  if (devices == 0) throw bad_request("reduction plan: no devices");
  reduction_plan p;
  p.how = how;
  p.goal = goal;
  p.devices = devices;
  const std::size_t host = devices;  // the host buffer's index, after the devices'
  switch (how) {
    case strategy::central: central_plan(p, goal, devices, host); break;
    case strategy::block: block_plan(p, goal, devices, host); break;
    case strategy::ring: ring_plan(p, goal, devices, host); break;
  }
  return p;
}

std::size_t plan_traffic(const reduction_plan& p, std::size_t n) {
  std::size_t floats = 0;
  for (const auto& phase : p.phases)
    for (const auto& op : phase) {
      if (is_noop(op)) continue;
      floats += (op.srcs.size() + 1) * block_range(n, p.parts, op.block).size();
    }
  return floats;
}

}  // namespace ps

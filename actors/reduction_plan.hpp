#pragma once
// Schedules for reducing N local devices' gradients and spreading parameters back, as pure
// data: which device does what to which block in which phase. The aggregator
// (actors/gpu_aggregator) executes a plan with one thread per device and a barrier between
// phases; tests check plans without threads.
//
// Buffers: 0..N-1 are the devices' buffers (gradients for reduce/allreduce, parameters for
// broadcast); buffer N is the host buffer (the single push's input, or the pulled parameters).
// A device writes only its own buffer or the host buffer.
#include <cstddef>
#include <string>
#include <vector>

namespace ps {

enum class strategy {
  central,  // everything to device 0, which sums alone (and copies out)
  block,    // device d reduces block d of N (reduce-scatter), then all-gather
  ring,     // N-1 scatter-reduce steps and N-1 all-gather steps between ring neighbours
};

// "central" | "block" | "ring"; throws bad_request naming the bad value.
strategy parse_strategy(const std::string& name);
const char* name(strategy s);

struct elem_range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
  friend bool operator==(const elem_range&, const elem_range&) = default;
};

// Block b of [0, n) cut into `parts` contiguous blocks whose sizes differ by at most one
// (the first n % parts blocks have one more element). parts >= 1, b < parts.
elem_range block_range(std::size_t n, std::size_t parts, std::size_t b);

// dst[block] = srcs[0][block] + srcs[1][block] + ... (in that order), done by `device`;
// one source is a copy. When dst is one of the sources it is the first (an in-place add).
struct plan_op {
  std::size_t device = 0;
  std::size_t block = 0;
  std::size_t dst = 0;
  std::vector<std::size_t> srcs;
};

enum class plan_goal {
  reduce_in_place,  // the sum stays in the device buffers: block b complete in device
                    // result_owner[b]'s buffer (a reduce-scatter; no extra buffer written)
  reduce,     // host = sum of the device buffers (device buffers may be overwritten)
  allreduce,  // every device buffer = the sum
  broadcast,  // every device buffer = host
};

struct reduction_plan {
  strategy how = strategy::central;
  plan_goal goal = plan_goal::reduce;
  std::size_t devices = 1;
  std::size_t parts = 1;  // blocks the range is cut into (block_range(n, parts, op.block))
  std::vector<std::vector<plan_op>> phases;  // ops of one phase run concurrently
  std::vector<std::size_t> result_owner;      // reduce_in_place: device holding block b
  std::size_t host() const { return devices; }
};

// Ring neighbours of `rank` among `devices` (ranks 0..devices-1 in ring order).
inline std::size_t ring_left(std::size_t rank, std::size_t devices) { return (rank + devices - 1) % devices; }
inline std::size_t ring_right(std::size_t rank, std::size_t devices) { return (rank + 1) % devices; }

// Throws bad_request when devices == 0.
reduction_plan make_plan(strategy how, plan_goal goal, std::size_t devices);

// A copy of a block onto itself: nothing to do.
inline bool is_noop(const plan_op& op) { return op.srcs.size() == 1 && op.srcs[0] == op.dst; }

// Does op (of plan p, on n values per device) by calling apply(dst, srcs, count), which is
// to set dst = the sum of srcs (one source: a copy; dst may be srcs[0]). buffer(id) is the
// start of buffer id (devices 0..N-1, the host buffer N); dst and srcs point at the op's
// block. Nothing is called for a no-op or an empty block. The executors of plans (the CPU
// aggregator, bench_aggregate's CUDA cells) share this.
template <class Buffer, class Apply>
void apply_op(const reduction_plan& p, const plan_op& op, std::size_t n, Buffer&& buffer, Apply&& apply) {
  const elem_range r = block_range(n, p.parts, op.block);
  if (is_noop(op) || r.size() == 0) return;
  std::vector<const float*> srcs;
  srcs.reserve(op.srcs.size());
  for (auto s : op.srcs) srcs.push_back(buffer(s) + r.begin);
  apply(buffer(op.dst) + r.begin, srcs, r.size());
}

// Floats the plan reads plus writes over n values per device: an op reads each source's block
// once and writes its destination's (a copy of a block onto itself is nothing). The least a
// reduce can move is (devices + 1) * n; a ring moves 3 * (devices - 1) * n on one memory.
std::size_t plan_traffic(const reduction_plan& p, std::size_t n);

}  // namespace ps

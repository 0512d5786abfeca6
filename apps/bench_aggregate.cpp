// bench_aggregate: the local aggregator's sum of N device buffers, per strategy and N, and the
// codecs' bytes on the wire and encode/decode speed, with the memory-bandwidth limit measured
// in the same run. One JSON object per line; gbps = 1e9 bytes per second.
//
// Bytes counted (the memory traffic of the minimal algorithm, so both sides compare alike):
//   stream_add (the limit): a plain loop y[i] += x[i] on every core over two buffers of --bytes:
//                           x and y read, y written: 3 * bytes per pass.
//   sum of N (a strategy):  N buffers of --bytes read, one written (the push buffer):
//                           (N + 1) * bytes per reduce, whatever the strategy moves itself.
//                           plan_bytes is what the strategy's plan does move (a ring moves
//                           3 (N-1) * bytes), and plan_gbps its rate: how close the strategy's
//                           own kernels run to the limit, apart from the bytes it adds.
//   codecs:                 bytes_in = 4 * values (the float tensor), per encode or decode.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "actors/gpu_aggregator.hpp"
#include "apps/aggregate_cuda.hpp"
#include "apps/bench_timing.hpp"
#include "libps/core/codec.hpp"
#include "libps/keys/keys.hpp"
#include "libps/observe/text.hpp"

namespace {

using ps::bench::interleaved;
using ps::bench::median;
using ps::bench::median_seconds;

struct options {
  std::size_t bytes = 64u << 20;  // per device
  std::vector<std::size_t> devices = {2, 4, 8};
  std::vector<std::string> strategies = {"central", "block", "ring"};
  std::vector<std::string> codecs = {"none", "fp16", "int8", "topk:0.01"};
  std::size_t codec_bytes = 0;  // 0: same as bytes
  int reps = 10;
  bool cuda = false;  // --backend=cuda
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    auto comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

std::size_t to_size(const std::string& flag, const std::string& v) {
  auto x = ps::parse_count(v);
  if (!x) throw ps::bad_request(flag + ": \"" + v + "\" is not a count");
  return static_cast<std::size_t>(*x);
}

options parse(int argc, char** argv) {
  options o;
  for (const auto& arg : ps::split_flags(argc, argv)) {
    const auto& flag = arg.name;
    if (flag == "--help") {
      std::printf(
          "bench_aggregate [--bytes=B] [--devices=2,4,8] [--strategies=central,block,ring]\n"
          "                [--codecs=none,fp16,int8,topk:0.01] [--codec-bytes=B] [--reps=R] [--backend=host|cuda]\n"
          "B: bytes per device (default 67108864 = 64 MiB); --codec-bytes: tensor size for the codecs\n"
          "(default: --bytes); --codecs= or --strategies= (empty) skips that part.\n"
          "--backend=cuda: the strategies' cells on the first CUDA device (N buffers in its memory),\n"
          "against its device-to-device copy bandwidth; the codecs are host code either way.\n");
      std::exit(0);
    }
    const auto& v = arg.needed();
    if (flag == "--bytes") {
      o.bytes = to_size(flag, v);
    } else if (flag == "--codec-bytes") {
      o.codec_bytes = to_size(flag, v);
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(to_size(flag, v));
      if (o.reps < 1) throw ps::bad_request("--reps must be >= 1");
    } else if (flag == "--devices") {
      o.devices.clear();
      for (auto& d : split(v)) {
        o.devices.push_back(to_size(flag, d));
        if (o.devices.back() == 0) throw ps::bad_request("--devices: 0 devices");
      }
    } else if (flag == "--backend") {
      if (v != "host" && v != "cuda") throw ps::bad_request("--backend: \"" + v + "\" (expected host or cuda)");
      o.cuda = v == "cuda";
    } else if (flag == "--strategies") {
      o.strategies = split(v);
      for (auto& s : o.strategies) ps::parse_strategy(s);
    } else if (flag == "--codecs") {
      o.codecs = split(v);
      for (auto& c : o.codecs) ps::parse_codec(c);
    } else {
      throw ps::bad_request("unknown flag " + flag + " (see --help)");
    }
  }
  if (o.codec_bytes == 0) o.codec_bytes = o.bytes;
  if (o.bytes < sizeof(float)) throw ps::bad_request("--bytes must hold at least one float");
  return o;
}

// The plain loop, split into contiguous halves (thirds, ...) over one std::thread per core.
// Not OpenMP: libgomp's idle threads spin for a while after a parallel region and would slow
// whatever runs next (here: the aggregator's device threads).
void add_loop(float* __restrict y, const float* __restrict x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

void stream_add(float* y, const float* x, std::size_t n, unsigned threads) {
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) {
    const std::size_t b = n * t / threads, e = n * (t + 1) / threads;
    pool.emplace_back([=] { add_loop(y + b, x + b, e - b); });
  }
  add_loop(y, x, n / threads);
  for (auto& th : pool) th.join();
}

// The strategies' cells on CPU devices (the aggregator), then the limit line.
void host_cells(const options& o, std::size_t n) {
  const std::size_t bytes = n * sizeof(float);
  // The limit: a plain y[i] += x[i] loop on every core, over the same size. This VM is
  // shared and drifts by 2x within a minute, so each cell interleaves its repetitions with
  // repetitions of the limit loop and is compared with the limit measured beside it. The
  // limit line (last) is the median of all those limit repetitions.
  std::vector<float> lx(n, 1.0f), ly(n, 0.0f);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  auto limit_rep = [&] { stream_add(ly.data(), lx.data(), n, threads); };
  std::vector<double> all_limit;
  auto limit_of = [&](double seconds) { return 3.0 * static_cast<double>(bytes) / seconds / 1e9; };

  for (const auto& sname : o.strategies) {
    for (std::size_t devices : o.devices) {
      ps::gpu_aggregator agg(devices, n, ps::parse_strategy(sname));
      for (std::size_t r = 0; r < devices; ++r) {
        float* g = agg.gradient(r);
        for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i + r) % 7);
      }
      std::vector<float> out(n, 0.0f);
      // in_place: the sum stays in the device buffers (reduce_in_place); host_buffer: it is
      // written to one separate buffer (reduce(out)).
      for (bool in_place : {true, false}) {
        auto [t, tl] = interleaved(o.reps, [&] {
          if (in_place)
            agg.reduce_in_place();
          else
            agg.reduce(out.data());
        }, limit_rep, all_limit);
        const double gbps = static_cast<double>((devices + 1) * bytes) / t / 1e9;
        const auto plan = ps::make_plan(agg.how(), in_place ? ps::plan_goal::reduce_in_place : ps::plan_goal::reduce,
                                        devices);
        const std::size_t plan_bytes = ps::plan_traffic(plan, n) * sizeof(float);
        const double plan_gbps = static_cast<double>(plan_bytes) / t / 1e9;
        ps::bench::print_line({{"strategy", sname}, {"devices", devices}, {"bytes", bytes},
                               {"result", in_place ? "in_place" : "host_buffer"}, {"gbps", gbps},
                               {"limit_gbps", limit_of(tl)}, {"pct_of_limit", 100.0 * gbps / limit_of(tl)},
                               {"ms", t * 1e3}, {"counted", "N*bytes read + bytes written"},
                               {"plan_bytes", plan_bytes}, {"plan_gbps", plan_gbps},
                               {"plan_pct_of_limit", 100.0 * plan_gbps / limit_of(tl)}});
      }
    }
  }
  if (all_limit.empty()) interleaved(o.reps, limit_rep, limit_rep, all_limit);
  ps::bench::print_line({{"limit", "stream_add"}, {"bytes", bytes}, {"threads", threads},
                         {"gbps", limit_of(median(all_limit))}, {"samples", all_limit.size()},
                         {"counted", "x and y read, y written: 3*bytes"}});
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    const std::size_t n = o.bytes / sizeof(float);

    if (o.cuda)
      ps::bench_aggregate_cuda({o.strategies, o.devices, n, o.reps});
    else
      host_cells(o, n);

    const std::size_t cn = o.codec_bytes / sizeof(float), cbytes = cn * sizeof(float);
    if (!o.codecs.empty()) {
      std::vector<float> g(cn), back(cn);
      std::uint64_t s = 88172645463325252ull;  // xorshift: values in [-1, 1)
      for (auto& v : g) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        v = static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0 * 2 - 1);
      }
      for (const auto& spec : o.codecs) {
        const ps::codec c = ps::parse_codec(spec);
        ps::topk_residual residual;
        std::vector<std::byte> wire;
        double te = median_seconds(o.reps, [&] { ps::encode(c, g.data(), cn, &residual, wire); });
        double td = median_seconds(o.reps, [&] { ps::decode(wire, back.data(), cn); });
        ps::bench::print_line({{"codec", ps::to_string(c)}, {"bytes_in", cbytes}, {"bytes_on_wire", wire.size()},
                               {"ratio", static_cast<double>(wire.size()) / static_cast<double>(cbytes)},
                               {"encode_gbps", static_cast<double>(cbytes) / te / 1e9},
                               {"decode_gbps", static_cast<double>(cbytes) / td / 1e9}});
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_aggregate: %s\n", e.what());
    return 2;
  }
}

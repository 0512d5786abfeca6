// ps-lite measured as bench_kv measures ActorPS: per size, one key per server holding
// size/servers bytes of floats; the server sums pushes into its store and answers pulls
// from it; per cell (op, window) two windows untimed, then 0.5 s timed (at least 4 ops),
// pulls into 8 rotating arrays (pushes first, so the store holds the size pulled). Each worker prints its rate; the driver sums them.
#include <chrono>
#include <cstdio>
#include <deque>
#include <unordered_map>
#include "ps/ps.h"
using namespace ps;

std::unordered_map<Key, SArray<float>> store;

void Handle(const KVMeta& meta, const KVPairs<float>& req, KVServer<float>* server) {
  KVPairs<float> res;
  if (meta.push) {
    size_t off = 0;
    for (size_t i = 0; i < req.keys.size(); ++i) {
      int len = req.lens[i];
      auto& v = store[req.keys[i]];
      if (v.size() != (size_t)len) { v = SArray<float>(len, 0.0f); }
      for (int j = 0; j < len; ++j) v[j] += req.vals[off + j];
      off += len;
    }
    server->Response(meta, res);
    return;
  }
  res.keys = req.keys;
  for (size_t i = 0; i < req.keys.size(); ++i) {
    auto& v = store[req.keys[i]];
    res.vals = v;  // one key per server: no copy (SArray shares)
    res.lens.push_back(v.size());
  }
  server->Response(meta, res);
}

double cell(KVWorker<float>& kv, bool push, int window, size_t bytes, const SArray<Key>& keys,
            const SArray<int>& lens, const SArray<float>& vals, std::vector<SArray<float>>& outs) {
  size_t next_out = 0;
  auto issue = [&]() -> int {
    if (push) return kv.ZPush(keys, vals, lens);
    auto& o = outs[next_out++ % outs.size()];
    return kv.ZPull(keys, &o, nullptr);
  };
  std::deque<int> inflight;
  for (int i = 0; i < 2 * window; ++i) inflight.push_back(issue());
  while (!inflight.empty()) { kv.Wait(inflight.front()); inflight.pop_front(); }
  auto start = std::chrono::steady_clock::now();
  long ops = 0;
  double secs = 0;
  for (int i = 0; i < window; ++i) inflight.push_back(issue());
  while (true) {
    kv.Wait(inflight.front());
    inflight.pop_front();
    ++ops;
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (secs >= 0.5 && ops >= 4) break;
    inflight.push_back(issue());
  }
  while (!inflight.empty()) { kv.Wait(inflight.front()); inflight.pop_front(); }
  return ops * (double)bytes / secs / 1e9;
}

int main() {
  Start(0);
  if (IsServer()) {
    auto server = new KVServer<float>(0);
    server->set_request_handle(Handle);
    RegisterExitCallback([server]() { delete server; });
  }
  if (IsWorker()) {
    KVWorker<float> kv(0, 0);
    const auto& ranges = Postoffice::Get()->GetServerKeyRanges();
    int servers = ranges.size();
    for (size_t bytes : {4096ul, 65536ul, 1048576ul, 16777216ul, 67108864ul}) {
      SArray<Key> keys;
      SArray<int> lens;
      for (int s = 0; s < servers; ++s) { keys.push_back(ranges[s].begin()); lens.push_back(bytes / 4 / servers); }
      SArray<float> vals(bytes / 4, 1.0f);
      std::vector<SArray<float>> outs(8);
      for (bool push : {true, false})  // pushes first: the store then holds the size pulled
        for (int window : {1, 8}) {
          Postoffice::Get()->Barrier(0, kWorkerGroup);
          double gbps = cell(kv, push, window, bytes, keys, lens, vals, outs);
          if (!push && outs[0].size() != bytes / 4) std::fprintf(stderr, "pulled %zu floats, not %zu\n", outs[0].size(), bytes / 4);
          std::printf("{\"rank\":%d,\"op\":\"%s\",\"bytes\":%zu,\"window\":%d,\"gbps\":%.4f}\n", MyRank(),
                      push ? "push" : "pull", bytes, window, gbps);
          std::fflush(stdout);
        }
    }
  }
  Finalize(0, true);
  return 0;
}

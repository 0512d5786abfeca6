// hello_kv: every worker w pushes w + 1 to 10 keys, then all pull the sums and check them
// (1 + 2 + ... + workers). The binary is the app with every role (runtime/app_main.hpp):
//   hello_kv                                  2 servers and 2 workers as processes (copies of itself)
//   hello_kv --cluster=embedded --workers=3   every role in this process
//   hello_kv --role=coordinator --port=4000 --servers=1 --workers=1   then, on any host:
//   hello_kv --role=server --coordinator=HOST:4000 and hello_kv --role=worker --coordinator=HOST:4000
// Exits 0 only when every worker saw the right sums.
#include <actorps/actorps.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr ps::key_type num_keys = 10;

std::string hello(ps::worker_context& ctx) {
  auto keys = ps::key_set::single({0, num_keys});
  ctx.kv.push(keys, std::vector<float>(num_keys, static_cast<float>(ctx.id + 1))).get();
  ctx.barrier();  // every worker's push is in
  auto sums = ctx.kv.pull(keys).get();
  ctx.barrier();  // nobody leaves while another still pulls
  const float expected = ctx.num_workers * (ctx.num_workers + 1) / 2.0f;
  if (!std::all_of(sums.begin(), sums.end(), [&](float v) { return v == expected; }))
    throw std::runtime_error("sums are not " + std::to_string(expected) + ": " + nlohmann::json(sums).dump());
  return nlohmann::json{{"worker", ctx.id}, {"sums", sums}, {"right", true}}.dump();
}

}  // namespace

int main(int argc, char** argv) {
  return ps::run_app({"hello_kv", "push and pull sums", hello, "sum", "asp",
                      [](const ps::node_config&) { return std::vector<ps::tensor_spec>{{"hello", {0, num_keys}, {num_keys}}}; },
                      {}},
                     argc, argv);
}

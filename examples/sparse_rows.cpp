// sparse_rows: an embedding table addressed by 64-bit row ids, the way recommendation
// models use one (the rows exist only once touched, spread over the shards by id). Every
// worker w pushes w + 1 to each element of the same 1,000 rows, whose ids are scattered
// over the whole 64-bit space, and a row of its own; then all pull every row and check
// the exact sums. Exits 0 only when every worker saw them.
//   sparse_rows                                  2 servers and 2 workers as processes
//   sparse_rows --cluster=embedded --workers=4   every role in this process
#include <actorps/actorps.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::uint32_t dim = 8;
constexpr std::uint32_t shared_rows = 1000;

// Ids far apart, as hashed feature ids are.
std::uint64_t row_id(std::uint64_t i) { return (i + 1) * 0x9E3779B97F4A7C15ull; }
std::uint64_t own_row(std::uint32_t worker) { return 42 + worker; }  // small ids: rows of one worker each

std::string embed(ps::worker_context& ctx) {
  const std::uint32_t table = 0;  // the job's first table (declared in main)
  if (ctx.kv.table_dim(table) != dim) throw std::runtime_error("the table's dim is not " + std::to_string(dim));
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < shared_rows; ++i) ids.push_back(row_id(i));
  ids.push_back(own_row(ctx.id));
  ctx.kv.push_rows(table, ids, std::vector<float>(ids.size() * dim, static_cast<float>(ctx.id + 1))).get();
  ctx.barrier();  // every worker's push is in
  ids.pop_back();
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) ids.push_back(own_row(w));
  auto rows = ctx.kv.pull_rows(table, ids).get();
  ctx.barrier();  // nobody leaves while another still pulls
  const float all = ctx.num_workers * (ctx.num_workers + 1) / 2.0f;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    // The shared rows hold every worker's pushes; own_row(w), only worker w's (w + 1).
    float expected = r < shared_rows ? all : static_cast<float>(r - shared_rows + 1);
    for (std::uint32_t j = 0; j < dim; ++j)
      if (rows[r * dim + j] != expected)
        throw std::runtime_error("row " + std::to_string(ids[r]) + " holds " + std::to_string(rows[r * dim + j]) +
                                 ", not " + std::to_string(expected));
  }
  return nlohmann::json{{"worker", ctx.id}, {"rows", ids.size()}, {"right", true}}.dump();
}

}  // namespace

int main(int argc, char** argv) {
  ps::app_definition app{"sparse_rows", "an embedding table by row ids, exact sums", embed, "sum", "asp", {}, {}};
  app.tables = [](const ps::node_config&) {
    ps::sparse_table_spec emb;
    emb.name = "emb";
    emb.dim = dim;
    emb.init_scale = 0;  // rows start at 0, so the sums are exact
    return std::vector<ps::sparse_table_spec>{emb};
  };
  return ps::run_app(app, argc, argv);
}

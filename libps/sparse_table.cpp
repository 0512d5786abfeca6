#include "libps/sparse_table.hpp"

#include <cmath>

#include "libps/hash.hpp"
#include "libps/keys.hpp"

namespace ps {

void sparse_table_spec::validate() const {
  if (name.empty()) throw bad_request("a sparse table needs a name");
  if (dim == 0 || dim > 4096) throw bad_request("sparse table " + name + ": dim " + std::to_string(dim) + " is not in [1, 4096]");
  if (!(init_scale >= 0) || !std::isfinite(init_scale))
    throw bad_request("sparse table " + name + ": init scale must be finite and >= 0");
  rule.validate();
}

void initial_row(std::uint64_t seed, const std::string& table, std::uint64_t id, float scale, float* out,
                 std::uint32_t dim) {
  auto base = mix64(seed ^ mix64(fnv1a(table) ^ mix64(id)));
  for (std::uint32_t i = 0; i < dim; ++i) {
    // 24 random bits: uniform in [0, 1) exactly representable as a float.
    auto bits = mix64(base + i) >> 40;
    out[i] = (static_cast<float>(bits) * 0x1.0p-24f * 2.0f - 1.0f) * scale;
  }
}

sparse_table::sparse_table(sparse_table_spec spec) : spec_(std::move(spec)) {
  spec_.validate();
  stride_ = spec_.dim * (1 + spec_.rule.state_slots());
}

float* sparse_table::row(std::uint64_t id) {
  auto [it, fresh] = index_.emplace(id, arena_.size());
  if (fresh) {
    arena_.resize(arena_.size() + stride_, 0.0f);  // optimizer state starts at zero
    initial_row(spec_.seed, spec_.name, id, spec_.init_scale, arena_.data() + it->second, spec_.dim);
  }
  return arena_.data() + it->second;
}

void sparse_table::pull(std::span<const std::uint64_t> ids, float* out) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const float* r = row(ids[i]);
    std::copy(r, r + spec_.dim, out + i * spec_.dim);
  }
}

void sparse_table::push(std::span<const std::uint64_t> ids, const float* grads) {
  const auto slots = spec_.rule.state_slots();
  std::vector<float*> state(slots);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    float* r = row(ids[i]);
    for (std::size_t k = 0; k < slots; ++k) state[k] = r + (k + 1) * spec_.dim;
    spec_.rule.apply(r, state.data(), grads + i * spec_.dim, spec_.dim);
  }
}

std::uint64_t sparse_table::bytes() const { return arena_.size() * sizeof(float) + index_.size() * 32; }

merged_rows merge_rows(std::span<const std::uint64_t> ids, const float* grads, std::uint32_t dim) {
  merged_rows m;
  std::unordered_map<std::uint64_t, std::uint32_t> seen;
  seen.reserve(ids.size());
  m.slot.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = seen.emplace(ids[i], static_cast<std::uint32_t>(m.ids.size()));
    if (fresh) {
      m.ids.push_back(ids[i]);
      if (grads) m.grads.insert(m.grads.end(), grads + i * dim, grads + (i + 1) * dim);
    } else if (grads) {
      float* sum = m.grads.data() + static_cast<std::size_t>(it->second) * dim;
      for (std::uint32_t k = 0; k < dim; ++k) sum[k] += grads[i * dim + k];
    }
    m.slot.push_back(it->second);
  }
  return m;
}

}  // namespace ps

#include "libps/rows/sparse_table.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "libps/keys/hash.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

void sparse_table_spec::validate() const {
  if (name.empty()) throw bad_request("a sparse table needs a name");
  if (dim == 0 || dim > 4096) throw bad_request("sparse table " + name + ": dim " + std::to_string(dim) + " is not in [1, 4096]");
  if (!(init_scale >= 0) || !std::isfinite(init_scale))
    throw bad_request("sparse table " + name + ": init scale must be finite and >= 0");
  rule.validate();
  if (admit_after < 1 || admit_after > 65535)
    throw bad_request("sparse table " + name + ": admit_after " + std::to_string(admit_after) + " is not in [1, 65535]");
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

eviction_policy eviction_policy_of(const std::string& name) {
  if (name == "lru") return eviction_policy::lru;
  if (name == "slru") return eviction_policy::slru;
  throw bad_request("eviction policy '" + name + "' is not lru or slru");
}

sparse_table::sparse_table(sparse_table_spec spec, eviction_policy policy, std::shared_ptr<std::uint64_t> clock)
    : spec_(std::move(spec)), policy_(policy), clock_(clock ? std::move(clock) : std::make_shared<std::uint64_t>(0)) {
  spec_.validate();
  stride_ = spec_.dim * (1 + spec_.rule.state_slots());
  arena_ = chunked_rows<float>(stride_);
}

std::uint32_t sparse_table::add(std::uint64_t id) {
  auto slot = take_slot(free_, meta_, [&] { arena_.emplace_back(); });
  index_.insert(id, slot);
  meta_[slot] = slot_meta{id, ++*clock_};
  link(probation_, segment::probation, slot);
  return slot;
}

std::uint32_t sparse_table::slot_of(std::uint64_t id, std::uint64_t clock, std::uint64_t used_from) {
  if (auto slot = index_.find(id); slot != id_index::none) {
    if (meta_[slot].stamp < used_from) used(slot);
    return slot;
  }
  install(id, nullptr, clock);
  return index_.find(id);
}

void sparse_table::install(std::uint64_t id, const float* stored, std::uint64_t clock, bool changed) {
  if (holds(id)) return;
  auto slot = add(id);
  float* r = arena_.row(slot);
  meta_[slot].dirty = !stored || changed;
  meta_[slot].pushed = clock;
  if (stored) {
    std::copy(stored, stored + stride_, r);
    return;
  }
  std::fill(r, r + stride_, 0.0f);  // optimizer state starts at zero
  initial_row(spec_.seed, spec_.name, id, spec_.init_scale, r, spec_.dim);
}

bool sparse_table::touch(std::uint64_t id) {
  auto slot = index_.find(id);
  if (slot == id_index::none) return false;
  used(slot);
  return true;
}

void sparse_table::used(std::uint32_t slot) {
  auto& m = meta_[slot];
  m.stamp = ++*clock_;
  auto to = policy_ == eviction_policy::slru ? segment::protected_ : segment::probation;
  unlink(slot);
  link(list_of(to), to, slot);
  if (to == segment::protected_ && protected_.size > protected_limit_) {  // its oldest back on probation
    auto oldest = protected_.tail;
    unlink(oldest);
    link(probation_, segment::probation, oldest);
  }
}

void sparse_table::link(order& o, segment s, std::uint32_t slot) {
  auto& m = meta_[slot];
  m.seg = s;
  m.prev = none;
  m.next = o.head;
  if (o.head != none) meta_[o.head].prev = slot;
  o.head = slot;
  if (o.tail == none) o.tail = slot;
  ++o.size;
}

void sparse_table::unlink(std::uint32_t slot) {
  auto& m = meta_[slot];
  auto& o = list_of(m.seg);
  (m.prev != none ? meta_[m.prev].next : o.head) = m.next;
  (m.next != none ? meta_[m.next].prev : o.tail) = m.prev;
  m.prev = m.next = none;
  --o.size;
}

std::optional<std::uint64_t> sparse_table::next_victim_stamp() const {
  auto tail = probation_.tail != none ? probation_.tail : protected_.tail;
  if (tail == none) return std::nullopt;
  return meta_[tail].stamp;
}

sparse_table::evicted sparse_table::evict(std::vector<float>& row_out) {
  auto slot = probation_.tail != none ? probation_.tail : protected_.tail;
  if (slot == none) throw bad_request("sparse table " + spec_.name + ": nothing to evict");
  auto& m = meta_[slot];
  evicted out{m.id, m.dirty, m.pushed};
  const float* r = arena_.row(slot);
  row_out.insert(row_out.end(), r, r + stride_);
  remove(slot);
  return out;
}

bool sparse_table::erase(std::uint64_t id) {
  auto slot = index_.find(id);
  if (slot == id_index::none) return false;
  remove(slot);
  return true;
}

void sparse_table::remove(std::uint32_t slot) {
  auto& m = meta_[slot];
  unlink(slot);
  m.seg = segment::free;
  index_.erase(m.id);
  free_.push_back(slot);
}

void sparse_table::restamp(std::uint64_t clock) {
  for (std::size_t slot = 0; slot < meta_.size(); ++slot)
    if (auto& m = meta_[slot]; m.seg != segment::free) m.pushed = std::max(m.pushed, clock);
}

std::vector<std::uint64_t> sparse_table::expire_before(std::uint64_t clock) {
  std::vector<std::uint64_t> dropped;
  for (std::uint32_t slot = 0; slot < meta_.size(); ++slot)
    if (meta_[slot].seg != segment::free && meta_[slot].pushed < clock) {
      dropped.push_back(meta_[slot].id);
      remove(slot);
    }
  return dropped;
}

void sparse_table::replace(std::uint64_t id, const float* stored, std::uint64_t clock) {
  auto slot = index_.find(id);
  if (slot == id_index::none) return install(id, stored, clock, true);
  meta_[slot].dirty = true;
  std::copy(stored, stored + stride_, arena_.row(slot));
}

void sparse_table::pull(std::span<const std::uint64_t> ids, float* out, std::uint64_t clock,
                        std::uint64_t used_from) {
  for_each_id(ids, [&](std::size_t i) {
    const float* r = arena_.row(slot_of(ids[i], clock, used_from));
    std::copy(r, r + spec_.dim, out + i * spec_.dim);
  });
}

void sparse_table::push(std::span<const std::uint64_t> ids, const float* grads, std::uint64_t clock,
                        std::uint64_t used_from) {
  const auto slots = spec_.rule.state_slots();
  std::vector<float*> state(slots);
  for_each_id(ids, [&](std::size_t i) {
    const auto slot = slot_of(ids[i], clock, used_from);
    float* r = arena_.row(slot);
    auto& m = meta_[slot];
    m.dirty = true;
    m.pushed = std::max(m.pushed, clock);
    for (std::size_t k = 0; k < slots; ++k) state[k] = r + (k + 1) * spec_.dim;
    spec_.rule.apply(r, state.data(), grads + i * spec_.dim, spec_.dim);
  });
}

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

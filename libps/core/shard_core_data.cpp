// shard_core's data path: pushes, inits and pulls of keys, pushes and pulls of rows (with
// admission and the disk tier's reads), and the pulls the consistency gate holds.
#include "libps/core/shard_core.hpp"

#include <algorithm>

#include "libps/core/shard_store.hpp"

namespace ps {

shard_effects shard_core::push(const shard_request& r, const std::vector<key_range>& ranges, const float* values,
                               std::uint64_t n) {
  return checked(r, ranges, [&](shard_effects& fx) {
    if (fx.error = departed(r); !fx.ok()) return;
    highest_clock_ = std::max(highest_clock_, r.clock + 1);  // an update of clock c: the final file holds c
    take_push(r, ranges, values, n, fx);
    if (r.tick != 0) advance({r.epoch, r.worker, r.tick, 0, 0}, fx);  // a resent push ticks again: ticks are idempotent
  });
}

void shard_core::take_push(const shard_request& r, const std::vector<key_range>& ranges, const float* values,
                           std::uint64_t n, shard_effects& fx) {
  if (!applied_.first_time(r.worker, r.seq)) return;  // a resend: acknowledged, not applied again
  report_loss(r, fx);
  if (consistency_.defers_push(r.clock)) {
    // Acknowledged now, applied when the clock completes; a copy, since the sender may
    // reuse its buffer once acknowledged.
    shard_store::check_push(ranges, n);
    deferred_.push_back({r, ranges, std::vector<float>(values, values + n)});
    return;
  }
  store_->push(ranges, values, n);
  if (head_) fx.traces.push_back({trace_event::push, r.worker, r.clock, id_, 0, 0, 0, r.epoch < map_.epoch()});
}

shard_effects shard_core::init(const shard_request& r, const std::vector<key_range>& ranges, const float* values,
                               std::uint64_t n) {
  return checked(r, ranges, [&](shard_effects&) { store_->init(ranges, values, n); });
}

shard_effects shard_core::pull(const shard_request& r, std::vector<key_range> ranges, std::uint64_t token,
                               time_point now) {
  shard_effects fx;
  fx.error = check(r, ranges);
  if (!fx.ok()) return fx;
  pulls_[token] = {r, std::move(ranges)};  // kept until answered: the actor reads the store through them
  gate_pull(token, now, fx);
  return fx;
}

void shard_core::gate_pull(std::uint64_t token, time_point now, shard_effects& fx) {
  const auto clock = pulls_.at(token).req.clock;
  if (!consistency_.may_read(clock))
    parked_.park(clock, parked{token, now});
  else
    answer_pull(token, fx);
}

std::string shard_core::check_rows(const shard_request& r, std::uint32_t table,
                                   const std::vector<std::uint64_t>& ids) const {
  if (auto why = check(r, {}); !why.empty()) return why;
  if (table >= rows_.num_tables())
    return name_ + ": no sparse table " + std::to_string(table) + " (the job has " +
           std::to_string(rows_.num_tables()) + ")";
  for (auto id : ids)
    if (auto owner = map_.row_owner(table, id); owner != id_)
      return name_ + ": row " + std::to_string(id) + " of table '" + rows_.table(table).spec().name + "' belongs to shard " +
             std::to_string(owner) + " (epoch " + std::to_string(map_.epoch()) + ")";
  return {};
}

shard_effects shard_core::push_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                                    const float* grads, std::uint64_t n) {
  shard_effects fx;
  fx.error = check_rows(r, table, ids);
  if (fx.ok()) fx.error = departed(r);
  if (!fx.ok()) return fx;
  highest_clock_ = std::max(highest_clock_, r.clock + 1);
  const auto& spec = rows_.table(table).spec();
  if (n != ids.size() * spec.dim) {
    fx.error = name_ + ": push of " + std::to_string(ids.size()) + " rows of table '" + spec.name + "' (dim " +
               std::to_string(spec.dim) + ") carries " + std::to_string(n) + " values, not " +
               std::to_string(ids.size() * spec.dim);
    return fx;
  }
  take_row_push(r, table, ids, grads, n, fx);
  if (r.tick != 0) advance({r.epoch, r.worker, r.tick, 0, 0}, fx);  // ticks are idempotent
  return fx;
}

void shard_core::take_row_push(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const float* grads, std::uint64_t n, shard_effects& fx) {
  if (!applied_.first_time(r.worker, r.seq)) return;  // a resend: acknowledged, not applied again
  report_loss(r, fx);
  if (consistency_.defers_push(r.clock)) {  // kept (copied) until the clock completes
    deferred_.push_back({r, {}, std::vector<float>(grads, grads + n), table, ids});
    return;
  }
  push_rows_now(r, table, ids, grads, false, fx);
}

void shard_core::push_rows_now(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const float* grads, bool acked, shard_effects& fx) {
  // Counted in arrival order on every copy: they agree on what is admitted.
  const auto refused = rows_.refuse(table, ids);
  if (refused.empty()) return push_admitted_rows(r, table, ids, grads, acked, fx);
  const auto dim = rows_.table(table).spec().dim;
  std::vector<std::uint64_t> kept;
  std::vector<float> kept_grads;
  for (std::size_t i = 0, next = 0; i < ids.size(); ++i) {
    if (next < refused.size() && refused[next] == i) {
      ++next;
      continue;
    }
    kept.push_back(ids[i]);
    kept_grads.insert(kept_grads.end(), grads + i * dim, grads + (i + 1) * dim);
  }
  push_admitted_rows(r, table, kept, kept_grads.data(), acked, fx);
}

void shard_core::push_admitted_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                                    const float* grads, bool acked, shard_effects& fx) {
  bool held = rows_.want(table, ids, true, fx.reads);
  if (held && row_queue_.empty() && !writes_backed_up()) {
    rows_.table(table).push(ids, grads, r.clock);
    note_precopied_change(table, ids, false);
    if (head_) fx.traces.push_back({trace_event::push, r.worker, r.clock, id_, 0, 0, 0, r.epoch < map_.epoch()});
  } else {  // kept (copied): the sender may reuse its buffer once acknowledged
    row_op op{row_op::kind::push, r, table, ids, {}, 0};
    op.grads.assign(grads, grads + ids.size() * rows_.table(table).spec().dim);
    if (!acked) fx.queued_push = op.ack = ++next_ack_;
    row_queue_.push_back(std::move(op));
  }
  drain_rows(fx);
}

void shard_core::sort_admitted(pending_pull& p) const {
  p.fresh.assign(p.ids.size(), 0);
  p.admitted.clear();
  for (std::size_t i = 0; i < p.ids.size(); ++i) {
    if (rows_.admitted(*p.table, p.ids[i])) p.admitted.push_back(p.ids[i]);
    else p.fresh[i] = 1;
  }
  if (p.admitted.size() == p.ids.size()) p.fresh.clear();
}

void shard_core::read_rows(pending_pull& p) {
  auto& t = rows_.table(*p.table);
  const auto& spec = t.spec();
  p.values.resize(p.ids.size() * spec.dim);
  if (p.fresh.empty()) return t.pull(p.ids, p.values.data(), p.req.clock, front_.keep_from);
  std::vector<float> held(p.admitted.size() * spec.dim);
  t.pull(p.admitted, held.data(), p.req.clock, front_.keep_from);
  const float* next = held.data();
  for (std::size_t i = 0; i < p.ids.size(); ++i) {
    float* out = p.values.data() + i * spec.dim;
    if (p.fresh[i]) {
      initial_row(spec.seed, spec.name, p.ids[i], spec.init_scale, out, spec.dim);
    } else {
      std::copy_n(next, spec.dim, out);
      next += spec.dim;
    }
  }
}

void shard_core::pull_rows_now(std::uint64_t token, shard_effects& fx) {
  auto& p = pulls_.at(token);
  if (!rows_.admits_all(*p.table)) sort_admitted(p);  // as the pushes queued before it left the counts
  bool held = rows_.want(*p.table, p.stored_ids(), true, fx.reads);
  row_op op{row_op::kind::pull, p.req, *p.table, {}, {}, token};
  if (held && row_queue_.empty() && !writes_backed_up())
    run(op, fx);
  else
    row_queue_.push_back(std::move(op));
  drain_rows(fx);
}

void shard_core::run(const row_op& op, shard_effects& fx) {
  switch (op.what) {
    case row_op::kind::push:
      rows_.table(op.table).push(op.ids, op.grads.data(), op.req.clock, front_.keep_from);
      note_precopied_change(op.table, op.ids, false);
      if (head_) fx.traces.push_back({trace_event::push, op.req.worker, op.req.clock, id_, 0, 0, 0, op.req.epoch < map_.epoch()});
      if (op.ack != 0) fx.applied.push_back(op.ack);
      return;
    case row_op::kind::pull: {
      auto& p = pulls_.at(op.token);
      read_rows(p);
      trace_pull(p, fx);
      fx.answer.push_back(op.token);
      return;
    }
    case row_op::kind::key_pull:
      trace_pull(pulls_.at(op.token), fx);
      fx.answer.push_back(op.token);
      return;
    case row_op::kind::checkpoint:
      fx.checkpoint_at = op.req.clock;
      return;
  }
}

void shard_core::drain_rows(shard_effects& fx) {
  while (!row_queue_.empty()) {
    const auto& op = row_queue_.front();
    if ((op.what == row_op::kind::push || op.what == row_op::kind::pull) && (writes_backed_up() || !front_ready(fx)))
      break;
    run(op, fx);
    row_queue_.pop_front();
    front_ = {};
  }
  if (auto w = rows_.trim(front_.keep_from)) fx.writes.push_back(std::move(w));
}

shard_effects shard_core::rows_written(std::uint64_t seq) {
  rows_.written(seq);
  shard_effects fx;
  drain_rows(fx);
  return fx;
}

bool shard_core::front_ready(shard_effects& fx) {
  const auto& op = row_queue_.front();
  if (front_.blocked) {
    if (rows_.want(op.table, front_.awaited, false, fx.reads)) return true;
    std::erase_if(front_.awaited, [&](std::uint64_t id) { return rows_.table(op.table).holds(id); });
    return false;
  }
  const auto& ids = op.what == row_op::kind::push ? op.ids : pulls_.at(op.token).stored_ids();
  if (rows_.want(op.table, ids, false, fx.reads)) return true;
  // Read from disk first, keeping the rest in RAM meanwhile.
  front_.blocked = true;
  front_.keep_from = rows_.keep(op.table, ids, front_.awaited);
  return false;
}

shard_effects shard_core::prefetch_rows(const shard_request& r, std::uint32_t table,
                                        const std::vector<std::uint64_t>& ids) {
  shard_effects fx;
  fx.error = check_rows(r, table, ids);
  if (fx.ok() && rows_.tiered()) rows_.want(table, ids, false, fx.reads);
  return fx;
}

std::uint64_t shard_core::fill_rows_in_ram(std::uint32_t table, std::uint64_t count) {
  std::uint64_t made = 0;
  for (std::uint64_t id = 0; id < count; ++id)
    if (owns_row(table, id)) rows_.create(table, id), ++made;
  return made;
}

shard_effects shard_core::rows_swept(const disk_sweep& sweep, const swept_page& page) {
  shard_effects fx;
  if (auto next = rows_.swept(sweep, page)) fx.sweeps.push_back(*next);
  if (auto w = rows_.trim(front_.keep_from)) fx.writes.push_back(std::move(w));
  return fx;
}

shard_effects shard_core::rows_loaded(const std::vector<row_key>& keys, const std::vector<std::uint8_t>& found,
                                      const std::vector<float>& rows, const std::vector<std::uint64_t>& pushed) {
  shard_effects fx;
  rows_.loaded(keys, found, rows, pushed);
  if (precopy_)
    for (std::size_t i = 0; i < keys.size() && i < found.size(); ++i)
      if (!found[i]) note_precopied_change(keys[i].table, std::span(&keys[i].id, 1), true);
  drain_rows(fx);
  return fx;
}

shard_effects shard_core::pull_rows(const shard_request& r, std::uint32_t table, std::vector<std::uint64_t> ids,
                                    std::uint64_t token, time_point now) {
  shard_effects fx;
  fx.error = check_rows(r, table, ids);
  if (!fx.ok()) return fx;
  pulls_[token] = {r, {}, table, std::move(ids)};
  gate_pull(token, now, fx);
  return fx;
}

void shard_core::answer_pull(std::uint64_t token, shard_effects& fx) {
  auto& p = pulls_.at(token);
  p.gate_min = consistency_.clocks().min_clock();
  if (p.table) {
    pull_rows_now(token, fx);
  } else if (!row_queue_.empty()) {
    row_queue_.push_back({row_op::kind::key_pull, p.req, 0, {}, {}, token});
  } else {
    trace_pull(p, fx);
    fx.answer.push_back(token);
  }
}

void shard_core::trace_pull(const pending_pull& p, shard_effects& fx) {
  fx.traces.push_back({trace_event::pull, p.req.worker, p.req.clock, id_, p.gate_min, consistency_.staleness()});
}

}  // namespace ps

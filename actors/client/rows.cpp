// Pushes and pulls of a sparse table's rows, grouped by the shard that owns them.
#include "actors/client/client_state.hpp"

namespace ps::client_internal {

// A pull of rows answered by one shard: each row goes to every position its id had.
void rows_landed(const std::shared_ptr<rows_request>& req, std::size_t g, const std::string& from,
                 const float_block& values) {
  const auto& grp = req->groups[g];
  auto expected = grp.rows.ids.size() * req->dim;
  if (values.size != expected || !values.data()) {
    req->op->finish(req->op->what + " failed: " + from + " sent " + std::to_string(values.size) + " values for " +
                    std::to_string(grp.rows.ids.size()) + " rows of dimension " + std::to_string(req->dim));
    return;
  }
  for (std::size_t k = 0; k < grp.positions.size(); ++k)
    for (auto p : grp.positions[k])
      std::copy_n(values.data() + k * req->dim, req->dim, req->op->values.data() + std::size_t{p} * req->dim);
  chunk_answered(req->op.get());
}

void send_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g, std::size_t idx,
               request_header h, std::uint64_t tag) {
  auto& st = self->state;
  auto on_error = [=](caf::error& err) { request_failed(self, idx, tag, err, req->op->what); };
  const auto& grp = req->groups[g];
  if (req->kind == op_kind::push) {
    ask_shard(self, idx, tag, head_of(st.routes[idx]), push_rows_atom::value, h, grp.rows, grp.grads)
      .then([=](std::uint64_t) { if (settle(self, idx, tag)) chunk_answered(req->op.get()); }, on_error);
    return;
  }
  ask_shard(self, idx, tag, tail_of(st.routes[idx]), pull_rows_atom::value, h, grp.rows)
    .then([=](float_block& values) {
            if (settle(self, idx, tag)) rows_landed(req, g, self->state.routes[idx].link.name, values);
          },
          on_error);
}

void replan_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g);

// Group g of a push or pull of rows, queued behind the earlier requests to its shard (a
// worker's pushes and ticks keep their order).
void queue_group(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g) {
  auto& st = self->state;
  auto idx = st.index.at(req->groups[g].shard);
  auto h = req->hdr;
  h.seq = next_sequence();
  pending_request r;
  r.op = req->op;
  r.read = req->kind == op_kind::pull;
  r.write = !r.read;
  r.plan_epoch = req->hdr.epoch;
  r.bytes = req->groups[g].rows.ids.size() * (sizeof(std::uint64_t) + req->dim * sizeof(float));
  if (r.read) r.replan = [=] { replan_rows(self, req, g); };
  r.send = [=](std::uint64_t tag) { send_rows(self, req, g, idx, h, tag); };
  submit(self, idx, std::move(r));
}

// Rows the caller grouped by an older map than the client's: grouped again by the client's
// map (a push's gradients and a pull's positions travel with their rows).
void regroup_rows(client_state& st, rows_request& req) {
  std::vector<rows_request::shard_rows> groups;
  std::map<std::uint32_t, std::size_t> group_of;
  std::vector<std::vector<float>> grads;
  for (const auto& old : req.groups)
    for (std::size_t k = 0; k < old.rows.ids.size(); ++k) {
      auto owner = st.map->row_owner(req.table, old.rows.ids[k]);
      auto [it, fresh] = group_of.emplace(owner, groups.size());
      if (fresh) {
        groups.push_back({owner, row_ids{req.table, {}}, {}, {}});
        grads.emplace_back();
      }
      auto& g = groups[it->second];
      g.rows.ids.push_back(old.rows.ids[k]);
      if (!old.positions.empty()) g.positions.push_back(old.positions[k]);
      if (old.grads.size > 0)
        grads[it->second].insert(grads[it->second].end(), old.grads.data() + k * req.dim, old.grads.data() + (k + 1) * req.dim);
    }
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (!grads[g].empty()) groups[g].grads = float_block::own(std::move(grads[g]));
  req.groups = std::move(groups);
  req.hdr.epoch = st.core.map_epoch();
}

void dispatch_rows(client_ptr self, const std::shared_ptr<rows_request>& req) {
  if (req->hdr.epoch < self->state.core.map_epoch()) regroup_rows(self->state, *req);
  req->op->pending = req->groups.size();
  if (req->op->pending == 0) return req->op->finish({});
  for (std::size_t g = 0; g < req->groups.size(); ++g) queue_group(self, req, g);
}

// A pull of rows whose rows moved: grouped again by their owners under the newest map.
void replan_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g) {
  auto& st = self->state;
  const auto& moved = req->groups[g];
  auto again = std::make_shared<rows_request>();
  again->kind = op_kind::pull;
  again->hdr = req->hdr;
  again->hdr.epoch = st.core.map_epoch();
  again->table = req->table;
  again->dim = req->dim;
  again->op = req->op;
  std::map<std::uint32_t, std::size_t> group_of;
  for (std::size_t k = 0; k < moved.rows.ids.size(); ++k) {
    auto owner = st.map->row_owner(req->table, moved.rows.ids[k]);
    auto [it, fresh] = group_of.emplace(owner, again->groups.size());
    if (fresh) again->groups.push_back({owner, row_ids{req->table, {}}, {}, {}});
    again->groups[it->second].rows.ids.push_back(moved.rows.ids[k]);
    again->groups[it->second].positions.push_back(moved.positions[k]);
  }
  again->op->pending += again->groups.size();
  for (std::size_t k = 0; k < again->groups.size(); ++k) queue_group(self, again, k);
  chunk_answered(again->op.get());
}

}  // namespace ps::client_internal

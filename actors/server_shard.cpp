// The shard actor: the data path, chain replication, the disk tier and handoffs, each in
// its file under actors/shard/ around shard_core's decisions; here the shard's trace
// and its behaviour, which hands each message to the concern it belongs to.
#include "actors/shard/shard_internal.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>

#include "libps/persist/checkpoint.hpp"
#include "libps/core/codec.hpp"
#include "libps/core/handoff.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/observe/text.hpp"

#include <nlohmann/json.hpp>

namespace ps {

shard_state::~shard_state() {
  if (trace_fd >= 0) ::close(trace_fd);
}

void shard_state::trace(const trace_event& e) const {
  if (trace_fd < 0) return;
  auto tagged = e;
  tagged.copy = trace_copy;
  auto line = to_json(tagged) + "\n";
  // One write per line: O_APPEND keeps lines from several shard processes whole.
  if (::write(trace_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    std::fprintf(stderr, "%s: writing the trace failed: %s\n", name.c_str(), std::strerror(errno));
}

using namespace shard_internal;

namespace {

// The handlers' bodies that take more than a line.
caf::result<float_block> pull_keys(self_ptr self, const shard_options& opts, const request_header& hdr, range_list& ranges) {
  ++self->state.pulls_received;
  return gated_pull(self, opts, self->state.coordinator, hdr, [&](std::uint64_t token) {
    return self->state.core->pull(request_of(hdr), std::move(ranges.ranges), token, self->clock().now());
  });
}

caf::result<float_block> pull_rows_of(self_ptr self, const shard_options& opts, const request_header& hdr, row_ids& rows) {
  ++self->state.pulls_received;
  return gated_pull(self, opts, self->state.coordinator, hdr, [&](std::uint64_t token) {
    return self->state.core->pull_rows(request_of(hdr), rows.table, std::move(rows.ids), token, self->clock().now());
  });
}

void worker_left(self_ptr self, const shard_options& opts, std::uint32_t worker) {
  feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.leave(worker); });
  // As a join: a copy this tail seeds is not among those the coordinator tells.
  if (self->state.successor_unannounced) caf::anon_send(self->state.successor, leave_atom::value, worker);
}

caf::ok_atom stop_shard(self_ptr self, std::uint8_t code, std::string& why) {
  self->quit(code == 0 ? caf::error{} : make_error(static_cast<errc>(code), std::move(why)));  // 0: completed
  return caf::ok_atom::value;
}

}  // namespace

shard_actor::behavior_type server_shard(self_ptr self, coordinator_actor coordinator, shard_options opts) {
  start_shard(self, opts, coordinator);
  return {
    [=](push_atom, const request_header& hdr, const range_list& ranges, const float_block& values) {
      ++self->state.pushes_received;
      return write(self, opts, self->state.coordinator, true, hdr, ranges, values);
    },
    [=](push_atom, const request_header& hdr, const range_list& ranges, const encoded_block& data) {
      ++self->state.pushes_received;
      return write_encoded(self, opts, self->state.coordinator, hdr, ranges, data);
    },
    [=](init_atom, const request_header& hdr, const range_list& ranges, const float_block& values) {
      return write(self, opts, self->state.coordinator, false, hdr, ranges, values);
    },
    [=](data_atom) -> caf::result<std::string, std::uint16_t, std::uint64_t> {
      if (!opts.plane) return {std::string{}, std::uint16_t{0}, std::uint64_t{0}};
      return {opts.plane->host(), opts.plane->port(), opts.plane->token()};
    },
    [=](pull_atom, const request_header& hdr, range_list& ranges) { return pull_keys(self, opts, hdr, ranges); },
    [=](push_rows_atom, const request_header& hdr, const row_ids& rows, const float_block& grads) {
      ++self->state.pushes_received;
      return write_rows(self, opts, self->state.coordinator, hdr, rows, grads);
    },
    [=](pull_rows_atom, const request_header& hdr, row_ids& rows) { return pull_rows_of(self, opts, hdr, rows); },
    [=](prefetch_atom, const request_header& hdr, const row_ids& rows) {
      feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.prefetch_rows(request_of(hdr), rows.table, rows.ids); });
    },
    [=](clock_atom, const request_header& hdr) { return tick(self, opts, self->state.coordinator, hdr); },
    [=](leave_atom, std::uint32_t worker) { worker_left(self, opts, worker); },
    [=](join_atom, std::uint32_t worker) { return join(self, worker); },
    // From the coordinator: host a replacement for a dead shard in this process.
    [=](restore_atom, registration& reg, std::uint64_t clock, std::vector<std::uint32_t>& departed,
        std::string& source) -> caf::actor {
      return spawn_replacement(self, opts, self->state.coordinator, {std::move(reg), clock, std::move(departed), std::move(source)});
    },
    [=](min_clock_atom) -> std::uint64_t { return self->state.core ? self->state.core->min_clock() : 0; },
    [=](fill_atom, std::uint32_t table, std::uint64_t count) { return fill(self, table, count); },
    [=](stats_atom) { return stats(self); },
    [=](cut_atom, std::uint64_t boundary) { return cut_at(self, boundary); },
    [=](final_atom) -> std::uint64_t { return self->state.core ? self->state.core->highest_clock() : 0; },
    [=](final_atom, std::uint64_t clock) {
      feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.final_checkpoint(clock); });
    },
    [=](view_atom, const cluster_view& view) -> std::uint64_t { return take_view(self, view); },
    [=](host_copy_atom, registration& reg, std::uint32_t position) -> caf::actor {
      return host_copy(self, opts, self->state.coordinator, std::move(reg), position);
    },
    [=](extend_atom, const caf::actor& next) { return extend_chain(self, opts, next); },
    [=](handoff_atom, const cluster_view& view) { return hand_off(self, opts, self->state.coordinator, view); },
    [=](takeover_atom, const encoded_block& block) { return take_over(self, opts, self->state.coordinator, block); },
    [=](sweep_atom) { sweep(self, opts); },
    [=](stop_atom, std::uint8_t code, std::string& why) { return stop_shard(self, code, why); },
    [=](start_atom, std::uint16_t port) { start_server(self, opts, self->state.coordinator, port); },
    [=](rejoin_atom, const caf::actor& coordinator) { rejoin(self, opts, caf::actor_cast<coordinator_actor>(coordinator)); },
    [=](rejoin_atom, const std::string& why) { coordinator_gone(self, opts, why); },
  };
}

}  // namespace ps

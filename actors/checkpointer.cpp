#include "actors/checkpointer.hpp"

#include <algorithm>
#include <cstdio>

namespace ps {

namespace {

using self_ptr = checkpointer_actor::stateful_pointer<checkpointer_state>;

void tell(const checkpointer_options& opts, const std::string& text) {
  if (opts.observer)
    caf::anon_send(opts.observer, news_atom::value, text);
  else
    std::fprintf(stderr, "%s\n", text.c_str());
}

void fail_job(const checkpointer_options& opts, const std::string& text) {
  if (opts.observer)
    caf::anon_send(opts.observer, job_failed_atom::value, text);
  else
    std::fprintf(stderr, "%s\n", text.c_str());
}

// The epoch at which the map of `epoch` began its shape.
std::uint64_t shape_epoch(const checkpointer_state& st, std::uint64_t epoch) {
  auto it = st.shapes.upper_bound(epoch);
  return it == st.shapes.begin() ? st.shapes.begin()->first : std::prev(it)->first;
}

// The file for `clock` of the map shaped at `shape` once each of its shards' parts is in;
// nullptr while parts are missing.
std::shared_ptr<const checkpoint> complete(self_ptr self, const checkpointer_options& opts, std::uint64_t clock,
                                           std::uint64_t shape) {
  auto& st = self->state;
  auto& parts = st.pending[{clock, shape}];
  const auto& map = st.shapes.at(shape);
  if (parts.size() < map.shard_ids.size()) return nullptr;
  auto c = std::make_shared<checkpoint>();
  c->header = opts.header;
  c->header.clock = clock;
  c->header.epoch = std::max(opts.header.epoch, st.epoch);
  c->header.shard_ids = map.shard_ids;
  c->header.placement = map.placement;
  for (auto id : map.shard_ids) c->shards.push_back(std::move(parts[id]));
  // Older clocks still incomplete can never complete consistently now: drop them.
  st.pending.erase(st.pending.begin(), st.pending.upper_bound({clock, UINT64_MAX}));
  st.dropped.erase(st.dropped.begin(), st.dropped.upper_bound({clock, UINT64_MAX}));
  return c;
}

// Those waiting for the file of `clock`: its path, or why it was not written.
template <class Answer>
void answer_awaits(self_ptr self, std::uint64_t clock, const Answer& answer) {
  auto it = self->state.awaits.find(clock);
  if (it == self->state.awaits.end()) return;
  for (auto& rp : it->second) rp.deliver(answer);
  self->state.awaits.erase(it);
}

// A file was written or failed: flushes waiting for the last one are answered.
void written(self_ptr self) {
  auto& st = self->state;
  if (--st.writing > 0) return;
  for (auto& rp : st.flushes) rp.deliver(caf::ok_atom::value);
  st.flushes.clear();
}

}  // namespace

checkpoint_file_writer_actor::behavior_type checkpoint_file_writer(checkpoint_file_writer_actor::pointer self,
                                                                   std::string dir) {
  // It ends with the checkpointer, however that ends (a link ignores a normal exit).
  self->set_exit_handler([self](caf::exit_msg& msg) { self->quit(msg.reason); });
  return {[dir](write_atom, const std::shared_ptr<const checkpoint>& c) -> caf::result<std::string> {
    try {
      return write_checkpoint(dir, *c);
    } catch (const bad_request& e) {
      return make_ps_error(e.what());
    }
  }};
}

namespace {

// A view's map shape, kept by epoch (parts are laid out by the map they were cut under).
void note_view(self_ptr self, std::uint64_t epoch, std::vector<std::uint32_t>& shard_ids,
               const std::vector<std::uint64_t>& buckets, const std::vector<std::uint32_t>& owners) {
  auto& st = self->state;
  st.epoch = std::max(st.epoch, epoch);
  checkpointer_state::map_shape shape{std::move(shard_ids), {}};
  for (std::size_t i = 0; i < buckets.size() && i < owners.size(); ++i) shape.placement.emplace_back(buckets[i], owners[i]);
  if (!(shape == st.shapes.rbegin()->second)) st.shapes[epoch] = std::move(shape);
}

// Hands a complete checkpoint to the file writer. Files are written in the order their
// clocks completed: the writer's mailbox is a queue.
void write_file(self_ptr self, const checkpointer_options& opts, std::uint64_t clock, std::shared_ptr<const checkpoint> file) {
  ++self->state.writing;
  self->request(self->state.file_writer, caf::infinite, write_atom::value, file)
    .then(
      [=](const std::string& path) {
        tell(opts, "checkpoint written: " + path + " (clock " + std::to_string(clock) + ")");
        self->state.written[clock] = path;
        answer_awaits(self, clock, path);
        written(self);
      },
      [=](caf::error& err) {
        // A job that runs on without the checkpoints it was told to write would lose
        // what a failure costs: it fails, naming why.
        fail_job(opts, "checkpoint at clock " + std::to_string(clock) + " not written: " + describe(err) +
                         "; the job stops rather than run on without checkpoints");
        answer_awaits(self, clock, err);
        written(self);
      });
}

// Shard `shard`'s part of the checkpoint at `clock`, cut under map `epoch`: kept until the
// file is complete, then written.
void take_part(self_ptr self, const checkpointer_options& opts, std::uint32_t shard, std::uint64_t clock,
               std::uint64_t epoch, const encoded_block& data) {
  auto refused = [&](const std::string& why) {
    tell(opts, "checkpoint at clock " + std::to_string(clock) + ": part from shard " + std::to_string(shard) +
                 " refused: " + why);
  };
  const auto shape = shape_epoch(self->state, epoch);
  try {
    auto snap = snapshot_of(data);
    if (snap.shard != shard) return refused("holds the state of shard " + std::to_string(snap.shard));
    const auto& ids = self->state.shapes.at(shape).shard_ids;
    if (std::find(ids.begin(), ids.end(), shard) == ids.end()) return;  // it left that map: it holds nothing
    auto& st = self->state;
    if (st.map_changing && st.dropped.insert({clock, shape}).second)
      tell(opts, "checkpoint at clock " + std::to_string(clock) + " dropped: its parts were cut while the map changed");
    if (st.dropped.count({clock, shape})) return;
    st.pending[{clock, shape}][shard] = std::move(snap);
  } catch (const bad_request& e) {
    return refused(e.what());
  }
  auto file = complete(self, opts, clock, shape);
  if (file) write_file(self, opts, clock, std::move(file));
}

}  // namespace

checkpointer_actor::behavior_type checkpointer(self_ptr self, checkpointer_options opts) {
  self->state.shapes[0] = {opts.header.shard_ids, opts.header.placement};
  self->state.file_writer = opts.file_writer ? opts.file_writer
                                             : self->spawn<caf::linked + caf::detached>(checkpoint_file_writer, opts.dir);
  return {
    [=](view_atom, std::uint64_t epoch, std::vector<std::uint32_t>& shard_ids, const std::vector<std::uint64_t>& buckets,
        const std::vector<std::uint32_t>& owners) { note_view(self, epoch, shard_ids, buckets, owners); },
    [=](map_change_atom, bool begins) { self->state.map_changing = begins; },
    [=](flush_atom) -> caf::result<caf::ok_atom> {
      if (self->state.writing == 0) return caf::ok_atom::value;
      auto rp = self->make_response_promise<caf::ok_atom>();
      self->state.flushes.push_back(rp);
      return rp;
    },
    [=](final_atom, std::uint64_t clock) -> std::string {
      auto it = self->state.written.find(clock);
      return it == self->state.written.end() ? std::string() : it->second;
    },
    [=](await_atom, std::uint64_t clock) -> caf::result<std::string> {
      auto rp = self->make_response_promise<std::string>();
      self->state.awaits[clock].push_back(rp);
      return rp;
    },
    [=](snapshot_atom, std::uint32_t shard, std::uint64_t clock, std::uint64_t epoch, const encoded_block& data) {
      take_part(self, opts, shard, clock, epoch, data);
    },
  };
}

}  // namespace ps

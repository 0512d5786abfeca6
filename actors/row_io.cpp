#include "actors/row_io.hpp"

#include <cstdio>
#include <filesystem>

#include "actors/messages.hpp"
#include "libps/persist/checkpoint.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/observe/log.hpp"

namespace ps {

namespace {

// An I/O error (a full disk among them) ends the actor and, linked, its shard: the rows
// it could not write are still in the shard's RAM, but the shard cannot go on.
caf::error failed(caf::scheduled_actor* self, const std::string& name, const bad_request& e) {
  std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
  auto err = make_ps_error(name + ": " + e.what());
  self->quit(err);
  return err;
}

// Reads rows on its own thread.
row_reader_actor::behavior_type row_reader(row_reader_actor::pointer self, std::shared_ptr<row_store> disk,
                                           std::string name) {
  return {
    [=](read_rows_atom, const std::shared_ptr<const std::vector<row_key>>& keys)
      -> caf::result<std::shared_ptr<const disk_rows>> {
      auto out = std::make_shared<disk_rows>();
      out->keys = keys;
      try {
        disk->read(*keys, out->found, out->rows, out->pushed);
      } catch (const bad_request& e) {
        return failed(self, name, e);
      }
      return std::shared_ptr<const disk_rows>(std::move(out));
    },
  };
}

// What `io` returns, or the end of the actor when it fails (failed).
template <class Io>
auto guarded(caf::scheduled_actor* self, const std::string& name, Io io) -> caf::result<decltype(io())> {
  try {
    return io();
  } catch (const bad_request& e) {
    return failed(self, name, e);
  }
}

// Writes rows, saves checkpoints and fills, in the order asked, on its own thread.
row_writer_actor::behavior_type row_writer(row_writer_actor::pointer self, std::shared_ptr<row_store> disk,
                                           std::string name, std::size_t page_rows) {
  using moved = std::shared_ptr<const moved_page>;
  return {
    [=](write_rows_atom, const std::shared_ptr<const row_write>& w) {
      return guarded(self, name, [&] { disk->write(*w); return w->seq; });
    },
    [=](save_rows_atom, const std::shared_ptr<const row_write>& rows, const std::string& into) {
      return guarded(self, name, [&] { disk->save(*rows, into); return caf::ok_atom::value; });
    },
    [=](fill_atom, const std::shared_ptr<const fill_order>& f) {
      return guarded(self, name, [&] { return disk->fill(f->table, f->count, f->spec, f->keep); });
    },
    [=](sweep_rows_atom, const disk_sweep& s) {
      return guarded(self, name, [&] { return std::make_shared<const swept_page>(disk->expired(s)); });
    },
    [=](move_rows_atom, const disk_move& m) {
      return guarded(self, name, [&] { return moved(std::make_shared<const moved_page>(disk->take_moved(m, page_rows))); });
    },
    [=](pin_rows_atom, const std::shared_ptr<const row_write>& rows) {
      return guarded(self, name, [&] { disk->pin(*rows); return caf::ok_atom::value; });
    },
    [=](copy_rows_atom, std::uint32_t table, std::uint64_t from) {
      return guarded(self, name, [&] { return moved(std::make_shared<const moved_page>(disk->pinned_page(table, from, page_rows))); });
    },
    [=](unpin_rows_atom) { disk->unpin(); },
    [=](drop_rows_atom, const disk_move& m) { return guarded(self, name, [&] { return disk->drop_moved(m); }); },
  };
}

// The recovery layout the store was seeded from: its rows are in the store now.
void drop_recovery_layout(const std::string& name, const std::string& seed) {
  const auto layout = std::filesystem::path(seed).parent_path();
  std::error_code ec;
  std::filesystem::remove_all(layout, ec);
  log_line(log_level::warning, name + ": took its rows in from " + seed +
                                   (ec ? "; could not remove " + layout.string() + ": " + ec.message()
                                       : " and removed that layout"));
}

using row_io_ptr = row_io_actor::stateful_pointer<row_io_state>;

// The job's rows, its units' answers back to back in key order.
std::shared_ptr<const disk_rows> joined(const read_job& job) {
  if (job.parts.size() == 1) return job.parts.front();
  auto out = std::make_shared<disk_rows>();
  out->keys = job.keys;
  std::size_t floats = 0;
  for (const auto& part : job.parts) floats += part->rows.size();
  out->rows.reserve(floats);  // one copy of the rows read, no regrowth
  out->found.reserve(job.keys->size());
  out->pushed.reserve(job.keys->size());
  for (const auto& part : job.parts) {
    out->found.insert(out->found.end(), part->found.begin(), part->found.end());
    out->rows.insert(out->rows.end(), part->rows.begin(), part->rows.end());
    out->pushed.insert(out->pushed.end(), part->pushed.begin(), part->pushed.end());
  }
  return out;
}

// Hands waiting units to idle readers; a reader's answer makes it idle again.
void dispatch_reads(row_io_ptr self) {
  auto& st = self->state;
  while (!st.idle_readers.empty() && !st.units.empty()) {
    const auto reader = st.idle_readers.back();
    st.idle_readers.pop_back();
    auto unit = std::move(st.units.front());
    st.units.pop_front();
    self->request(st.readers[reader], caf::infinite, read_rows_atom::value, unit.keys)
      .then(
        [=](std::shared_ptr<const disk_rows>& got) {
          self->state.idle_readers.push_back(reader);
          auto& job = *unit.job;
          job.parts[unit.index] = std::move(got);
          if (--job.left == 0) job.promise.deliver(joined(job));
          dispatch_reads(self);
        },
        [=](caf::error& e) {
          unit.job->promise.deliver(e);
          self->quit(e);
        });
  }
}

// Cuts a read into units of read_unit_keys keys, queued behind those already waiting.
void queue_read(row_io_ptr self, const std::shared_ptr<const std::vector<row_key>>& keys,
                caf::typed_response_promise<std::shared_ptr<const disk_rows>> promise) {
  auto job = std::make_shared<read_job>();
  job->keys = keys;
  job->promise = std::move(promise);
  const auto n = keys->size();
  const auto units = std::max<std::size_t>(1, (n + read_unit_keys - 1) / read_unit_keys);
  job->parts.resize(units);
  job->left = units;
  for (std::size_t u = 0; u < units; ++u) {
    auto part = units == 1 ? keys
                           : std::make_shared<const std::vector<row_key>>(
                               keys->begin() + static_cast<std::ptrdiff_t>(u * read_unit_keys),
                               keys->begin() + static_cast<std::ptrdiff_t>(std::min(n, (u + 1) * read_unit_keys)));
    self->state.units.push_back({job, u, std::move(part)});
  }
  dispatch_reads(self);
}

}  // namespace

row_io_actor::behavior_type row_io(row_io_actor::stateful_pointer<row_io_state> self, std::string dir,
                                   std::string name, std::vector<std::size_t> strides, std::string seed,
                                   row_io_settings settings) {
  try {
    auto& st = self->state;
    // The store's directory is this actor's (its id in the name): a shard started again in
    // this process (the simulation's restarts) must not meet the store of the one before,
    // which may not have closed yet.
    st.disk = std::make_shared<row_disk>(dir, name + " " + std::to_string(self->id()), std::move(strides), nullptr, seed);
    if (!seed.empty() && in_recovery_layout(seed)) drop_recovery_layout(name, seed);
    for (std::size_t i = 0; i < std::max<std::size_t>(1, settings.readers); ++i) {
      st.idle_readers.push_back(st.readers.size());
      st.readers.push_back(spawn_io(self, settings, row_reader, st.disk, name));
    }
    st.writer = spawn_io(self, settings, row_writer, st.disk, name, settings.page_rows);
  } catch (const bad_request& e) {
    failed(self, name, e);  // the handlers below never run
  }
  // Only hands work on: a read never waits behind a write (a batch of evicted rows of
  // dimension 64 takes long enough to stall the reads queued behind it).
  return {
    [=](read_rows_atom, const std::shared_ptr<const std::vector<row_key>>& keys) {
      auto promise = self->make_response_promise<std::shared_ptr<const disk_rows>>();
      queue_read(self, keys, promise);
      return promise;
    },
    [=](write_rows_atom, const std::shared_ptr<const row_write>& w) {
      return self->delegate(self->state.writer, write_rows_atom::value, w);
    },
    [=](save_rows_atom, const std::shared_ptr<const row_write>& rows, const std::string& into) {
      return self->delegate(self->state.writer, save_rows_atom::value, rows, into);
    },
    [=](fill_atom, const std::shared_ptr<const fill_order>& f) {
      return self->delegate(self->state.writer, fill_atom::value, f);
    },
    [=](sweep_rows_atom, const disk_sweep& s) { return self->delegate(self->state.writer, sweep_rows_atom::value, s); },
    [=](move_rows_atom, const disk_move& m) { return self->delegate(self->state.writer, move_rows_atom::value, m); },
    [=](pin_rows_atom, const std::shared_ptr<const row_write>& rows) {
      return self->delegate(self->state.writer, pin_rows_atom::value, rows);
    },
    [=](copy_rows_atom, std::uint32_t table, std::uint64_t from) {
      return self->delegate(self->state.writer, copy_rows_atom::value, table, from);
    },
    [=](unpin_rows_atom) { self->send(self->state.writer, unpin_rows_atom::value); },
    [=](drop_rows_atom, const disk_move& m) { return self->delegate(self->state.writer, drop_rows_atom::value, m); },
  };
}

}  // namespace ps

#include "actors/row_io.hpp"

#include <cstdio>

#include "actors/messages.hpp"

namespace ps {

namespace {

// Reads rows on its own thread; an I/O error ends it and, linked, the shard.
row_reader_actor::behavior_type row_reader(row_reader_actor::pointer self, std::shared_ptr<row_disk> disk,
                                           std::string name) {
  return {
    [=](read_rows_atom, const std::shared_ptr<const std::vector<row_key>>& keys)
      -> caf::result<std::shared_ptr<const disk_rows>> {
      auto out = std::make_shared<disk_rows>();
      out->keys = *keys;
      try {
        disk->read(*keys, out->found, out->rows);
      } catch (const bad_request& e) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
        auto err = make_ps_error(name + ": " + e.what());
        self->quit(err);
        return err;
      }
      return std::shared_ptr<const disk_rows>(std::move(out));
    },
  };
}

}  // namespace

row_io_actor::behavior_type row_io(row_io_actor::stateful_pointer<row_io_state> self, std::string dir,
                                   std::string name, std::vector<std::size_t> strides) {
  try {
    self->state.disk = std::make_shared<row_disk>(dir, name, std::move(strides));
    for (std::size_t i = 0; i < row_disk::read_threads; ++i)
      self->state.readers.push_back(
        self->spawn<caf::detached + caf::linked>(row_reader, self->state.disk, name));
  } catch (const bad_request& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    self->quit(make_ps_error(name + ": " + e.what()));  // the handlers below never run
  }
  // An I/O error (a full disk among them) ends this actor and, linked, its shard: the
  // rows it could not write are still in the shard's RAM, but it cannot go on.
  auto failed = [self, name](const bad_request& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    auto err = make_ps_error(name + ": " + e.what());
    self->quit(err);
    return err;
  };
  return {
    [=](read_rows_atom, const std::shared_ptr<const std::vector<row_key>>& keys) {
      auto& st = self->state;
      auto reader = st.readers[st.next_reader++ % st.readers.size()];
      return self->delegate(reader, read_rows_atom::value, keys);
    },
    [=](write_rows_atom, const std::shared_ptr<const row_write>& w) -> caf::result<std::uint64_t> {
      try {
        self->state.disk->write(*w);
      } catch (const bad_request& e) {
        return failed(e);
      }
      return w->seq;
    },
    [=](disk_bytes_atom) -> std::uint64_t { return self->state.disk->bytes_on_disk(); },
    [=](fill_atom, const std::shared_ptr<const fill_order>& f) -> caf::result<std::uint64_t> {
      try {
        return self->state.disk->fill(f->table, f->count, f->spec, f->keep);
      } catch (const bad_request& e) {
        return failed(e);
      }
    },
  };
}

}  // namespace ps

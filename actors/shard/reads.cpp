// Answering pulls of keys and rows: values from the store (or the disk tier), over the
// reader's data connection or inside the message, once the consistency gate lets them through.
#include "actors/shard/shard_internal.hpp"

namespace ps::shard_internal {

shard_request request_of(const request_header& h) { return {h.epoch, h.worker, h.clock, h.seq, h.tick}; }

// The values of an answerable pull: encoded when asked for, over the reader's data
// connection when it has one (written straight from the store), else inside the message.
float_block pull_values(self_ptr self, const shard_options& opts, const request_header& hdr,
                        const std::vector<key_range>& ranges) {
  const auto& store = self->state.core->store();
  std::uint64_t n = 0;
  for (const auto& r : ranges) n += r.size();
  if (hdr.pull_codec != 0) {  // compressed: encoded inside the message, not over the data plane
    const auto kind = static_cast<codec_kind>(hdr.pull_codec);
    if (kind != codec_kind::fp16 && kind != codec_kind::int8)
      throw bad_request("pull codec " + std::to_string(hdr.pull_codec) + " is not fp16 (1) or int8 (2)");
    // Encoded straight from the store when the answer is one run of it; else gathered first.
    auto spans = store.view(ranges, n);
    std::vector<float> gathered;
    if (spans.size() > 1) {
      gathered.reserve(n);
      for (auto part : spans) gathered.insert(gathered.end(), part.begin(), part.end());
    }
    const float* values = spans.size() > 1 ? gathered.data() : spans.empty() ? nullptr : spans[0].data();
    return float_block::encode_of(encode(codec{kind}, values, n), n);
  }
  // Its ticket is the request's seq, so the reader may have said where it should land.
  // Written straight from the store by the plane's writer: the shard awaits the write
  // before it handles another message (await_store_writes), so nothing changes the store
  // under it, no thread waits and nothing is copied.
  auto& st = self->state;
  bool over_plane = opts.plane && hdr.reply_plane != 0;
  if (over_plane) {
    ++st.writes_issued;  // the signal fires once, also when the plane does not take it
    if (auto named = opts.plane->offload(hdr.reply_plane, store.view(ranges, n), n, hdr.seq, written_signal(st.writes, st.write_counts)))
      return *named;
  }
  std::vector<float> out(n);
  store.pull(ranges, out.data(), n);
  if (over_plane) {  // too many small pieces to write from where they are: copied first
    auto copied = float_block::own(std::move(out));
    std::span<const float> whole(copied.data(), n);
    if (auto named = opts.plane->offload(hdr.reply_plane, std::span(&whole, 1), n, hdr.seq, copied.storage))
      return *named;
    return copied;
  }
  return float_block::own(std::move(out));
}

// An update's result, delivered into the promise made when it arrived: a value or an
// error; a delegated result already went to that promise.
void settle(ack_promise rp, const caf::result<std::uint64_t>& r) {
  if (r.flag == caf::rt_value) rp.deliver(r.value.get_as<std::uint64_t>(0));
  else if (r.flag == caf::rt_error) rp.deliver(r.err);
}

// The rows of an answered row pull, inside the message (a batch's rows are small).
float_block row_values(shard_core& core, std::uint64_t token) { return float_block::own(core.take_row_values(token)); }

void answer_pull(self_ptr self, const shard_options& opts, std::uint64_t token) {
  auto& st = self->state;
  auto it = st.pulls.find(token);
  if (it == st.pulls.end()) return;
  auto waiting = std::move(it->second);
  st.pulls.erase(it);
  try {
    deliver_late(self, opts, waiting.promise,
                 st.core->is_row_pull(token) ? row_values(*st.core, token)
                                             : pull_values(self, opts, waiting.hdr, st.core->pull_ranges(token)));
  } catch (const bad_request& e) {
    waiting.promise.deliver(make_ps_error(st.name + ": " + e.what()));
  }
  st.core->forget_pull(token);
}

// Payloads written from the store are on their way: no other message is handled
// (await) until they are written, since it might change the store under them.
void await_store_writes(self_ptr self) {
  auto& st = self->state;
  if (st.writes_awaited == st.writes_issued || st.write_counts->done == st.writes_issued) return;  // all out already
  st.writes_awaited = st.writes_issued;
  self->request(st.writes, caf::infinite, drained_atom::value, st.writes_issued)
    .await([](caf::ok_atom) {}, [](caf::error&) {});  // the tracker ends only with the shard
}

// A refused request: errc::moved when it was planned by an older map than this shard's
// (its keys or rows may have moved: the client sends it again by the new map).
caf::error refusal(self_ptr self, const request_header& hdr, const std::string& why) {
  auto& st = self->state;
  return make_error(st.core && hdr.epoch < st.core->map_epoch() ? errc::moved : errc::failed, why);
}

caf::result<std::uint64_t> tick(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                const request_header& hdr) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  auto fx = st.core->tick(request_of(hdr));
  if (!fx.ok()) return make_ps_error(fx.error);
  carry_out(self, opts, coordinator, fx);
  auto make_send = [&] { return chain_sender(self, opts.forward_timeout, clock_atom::value, hdr); };
  return acknowledge(self, opts, hdr.clock, make_send);
}

encoded_block block_of(const std::string& bytes) {
  encoded_block block{std::make_shared<std::vector<std::byte>>(bytes.size())};
  std::memcpy(block.bytes->data(), bytes.data(), bytes.size());
  return block;
}

// Whether the shard's map still has it (a shard that left has handed all over).
bool in_own_map(const shard_core& core) {
  const auto& ids = core.map().shard_ids();
  return std::find(ids.begin(), ids.end(), core.id()) != ids.end();
}

}  // namespace ps::shard_internal

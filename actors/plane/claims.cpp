// The socket transport's claims: payloads taken from its store as blocks, and its counters.
#include "actors/plane/plane_internal.hpp"

namespace ps {

using namespace plane_internal;

std::string data_plane::origin_name(std::uint64_t origin) const {
  std::lock_guard<std::mutex> guard(mtx_);
  for (auto& c : conns_)
    if (c->peer == origin) return c->name;
  return "process " + std::to_string(origin);
}

std::shared_ptr<std::vector<float>> data_plane::copied(const float* from, std::size_t n) {
  return buffers_->copy_of(from, n);
}

// The claimed values as a block: a lent payload is copied out for a claimer that did
// not ask for it in place (it may keep the block for as long as it likes).
float_block data_plane::as_block(landed_values values, std::uint64_t size, bool lent_ok) {
  float_block b{std::move(values.owned), 0, size};  // neither: it landed in place
  if (values.lent && lent_ok) b.lent = std::move(values.lent);
  else if (values.lent) b.storage = copied(values.lent.get(), size);
  return b;
}

float_block data_plane::claim(const float_block& block) {
  if (block.ticket == 0) return block;
  return as_block(store_.take(block.origin, block.ticket, block.size, claim_timeout_, origin_name(block.origin)),
                  block.size, false);
}

std::optional<float_block> data_plane::try_claim(const float_block& block, bool lent_ok) {
  if (block.ticket == 0) return block;
  auto values = store_.try_take(block.origin, block.ticket, block.size, origin_name(block.origin));
  if (!values) return std::nullopt;
  return as_block(std::move(*values), block.size, lent_ok);
}

void data_plane::when_claimable(const float_block& block, std::function<void()> ready) {
  store_.on_ready(block.origin, block.ticket, std::move(ready));
}

transport_counters data_plane::counters() const {
  return {bytes_sent_, bytes_received_, shm_bytes_sent_, messages_sent_, messages_received_,
          socket_writes_, writer_thread_writes_, reader_runs_, polled_reads_};
}

}  // namespace ps

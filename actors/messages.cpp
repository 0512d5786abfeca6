#include "actors/messages.hpp"

#include <cstring>

#include <bit>

#include <caf/binary_deserializer.hpp>

#include "libps/net/bulk.hpp"
#include "libps/core/codec.hpp"

namespace ps {

namespace {

template <class T>
caf::error write_raw(caf::serializer& f, const T* data, std::uint64_t n) {
  size_t len = n;
  if (auto e = f.begin_sequence(len)) return e;
  if (n > 0)
    if (auto e = f.apply_raw(n * sizeof(T), const_cast<T*>(data))) return e;
  return f.end_sequence();
}

// The count of a sequence of T: it comes from the peer, and a few bytes could announce
// terabytes. CAF's network layer decodes from a buffer, whose remaining bytes bound what
// the block can hold.
template <class T>
caf::error read_count(caf::deserializer& f, size_t& n) {
  if (auto e = f.begin_sequence(n)) return e;
  if (auto* buffer = dynamic_cast<caf::binary_deserializer*>(&f); buffer && n > buffer->remaining() / sizeof(T))
    return make_ps_error("a block announces " + std::to_string(n) + " elements of " + std::to_string(sizeof(T)) +
                         " bytes; the message has " + std::to_string(buffer->remaining()) + " bytes left");
  return {};
}

// A sequence of T read into the storage that place(n) gives for its n elements.
template <class T, class Place>
caf::error read_into(caf::deserializer& f, Place place) {
  size_t n = 0;
  if (auto e = read_count<T>(f, n)) return e;
  T* data = place(n);
  if (n > 0)
    if (auto e = f.apply_raw(n * sizeof(T), data)) return e;
  return f.end_sequence();
}

template <class T>
caf::error read_raw(caf::deserializer& f, std::vector<T>& out) {
  return read_into<T>(f, [&](size_t n) {
    out.resize(n);
    return out.data();
  });
}

}  // namespace

// A fresh 4 KiB block per message, freed on another thread, cost the reading thread a
// glibc malloc_consolidate pass nearly every time (with the allocation itself, a third of
// the server's reader thread in a 4 KiB window-8 cell; BENCHMARKS.md).
std::shared_ptr<std::vector<float>> inline_values(std::size_t n) {
  static const auto recycled = buffer_pool::make(4u << 20);
  constexpr std::size_t largest_recycled = 64u << 10;  // floats
  return n > 0 && n <= largest_recycled ? recycled->get(n) : std::make_shared<std::vector<float>>(n);
}

namespace {

caf::error read_values(caf::deserializer& f, std::shared_ptr<std::vector<float>>& out) {
  return read_into<float>(f, [&](size_t n) {
    out = inline_values(n);
    return out->data();
  });
}

}  // namespace

// One byte first: 0 for the values inline, 1 for a named payload (ticket, origin, count),
// 2 for encoded values (count, then the encoded bytes).
caf::error inspect(caf::serializer& f, float_block& x) {
  std::uint8_t form = x.encoded ? 2 : x.ticket != 0 ? 1 : 0;
  if (auto e = f(form)) return e;
  if (form == 2) {
    if (auto e = f(x.size)) return e;
    return write_raw(f, x.encoded->data(), x.encoded->size());
  }
  if (form == 1) return f(x.ticket, x.origin, x.size);
  return write_raw(f, x.data(), x.size);
}

caf::error inspect(caf::deserializer& f, float_block& x) {
  x = float_block{};
  std::uint8_t form = 0;
  if (auto e = f(form)) return e;
  if (form > 2) return make_ps_error("float_block: unknown form " + std::to_string(form));
  if (form == 2) {
    auto bytes = std::make_shared<std::vector<std::byte>>();
    if (auto e = f(x.size)) return e;
    if (auto e = read_raw(f, *bytes)) return e;
    x.encoded = std::move(bytes);
    return {};
  }
  if (form == 1) {
    if (auto e = f(x.ticket, x.origin, x.size)) return e;
    if (x.ticket == 0) return make_ps_error("float_block: a named payload without a ticket");
    return {};
  }
  std::shared_ptr<std::vector<float>> v;
  if (auto e = read_values(f, v)) return e;
  x.size = v->size();
  x.storage = std::move(v);
  return {};
}

float_block decoded_values(const float_block& block) {
  // The count is the sender's word: a codec for answers holds at least a byte per value,
  // so no more values than bytes are allocated for.
  std::span<const std::byte> encoded(*block.encoded);
  if (block.size > encoded.size() || ps::inspect(encoded).n != block.size)
    throw bad_request("an encoded block of " + std::to_string(encoded.size()) + " bytes claims " +
                      std::to_string(block.size) + " values");
  std::vector<float> values(block.size);
  decode(encoded, values.data(), values.size());
  return float_block::own(std::move(values));
}

caf::error inspect(caf::serializer& f, encoded_block& x) {
  return x.bytes ? write_raw(f, x.bytes->data(), x.bytes->size()) : write_raw<std::byte>(f, nullptr, 0);
}

caf::error inspect(caf::deserializer& f, encoded_block& x) {
  x.bytes = std::make_shared<std::vector<std::byte>>();
  return read_raw(f, *x.bytes);
}

encoded_block snapshot_block(const shard_snapshot& s) {
  auto bytes = encode_shard(s);
  encoded_block b{std::make_shared<std::vector<std::byte>>(bytes.size())};
  std::memcpy(b.bytes->data(), bytes.data(), bytes.size());
  return b;
}

shard_snapshot snapshot_of(const encoded_block& b) {
  if (!b.bytes || b.bytes->empty()) throw bad_request("no shard state in the message");
  return decode_shard(std::string(reinterpret_cast<const char*>(b.bytes->data()), b.bytes->size()));
}

caf::error inspect(caf::serializer& f, range_list& x) {
  return write_raw(f, x.ranges.data(), x.ranges.size());
}

caf::error inspect(caf::deserializer& f, range_list& x) {
  return read_raw(f, x.ranges);
}

caf::error inspect(caf::serializer& f, row_ids& x) {
  if (auto e = f(x.table)) return e;
  return write_raw(f, x.ids.data(), x.ids.size());
}

caf::error inspect(caf::deserializer& f, row_ids& x) {
  if (auto e = f(x.table)) return e;
  return read_raw(f, x.ids);
}

table_msg table_msg::from(const sparse_table_spec& t) {
  return {t.name, t.dim, std::bit_cast<std::uint32_t>(t.init_scale), rule_msg::from(t.rule), t.seed, t.admit_after,
          t.expire_after};
}

sparse_table_spec table_msg::to_spec() const {
  sparse_table_spec t;
  t.name = name;
  t.dim = dim;
  t.init_scale = std::bit_cast<float>(init_scale);
  t.rule = rule.to_rule();
  t.seed = seed;
  t.admit_after = admit_after;
  t.expire_after = expire_after;
  t.validate();
  return t;
}

rule_msg rule_msg::from(const update_rule& r) {
  rule_msg m{r.kind.name(), std::bit_cast<std::uint32_t>(r.lr),
             std::bit_cast<std::uint32_t>(r.momentum), std::bit_cast<std::uint32_t>(r.beta1),
             std::bit_cast<std::uint32_t>(r.beta2), std::bit_cast<std::uint32_t>(r.eps), {}};
  for (float p : r.params) m.params.push_back(std::bit_cast<std::uint32_t>(p));
  return m;
}

update_rule rule_msg::to_rule() const {
  update_rule r;
  r.kind = kind;  // throws bad_request naming a rule this process does not know
  r.lr = std::bit_cast<float>(lr);
  r.momentum = std::bit_cast<float>(momentum);
  r.beta1 = std::bit_cast<float>(beta1);
  r.beta2 = std::bit_cast<float>(beta2);
  r.eps = std::bit_cast<float>(eps);
  for (auto p : params) r.params.push_back(std::bit_cast<float>(p));
  r.validate();
  return r;
}

namespace {
constexpr caf::atom_value ps_category = caf::atom("ps");

std::string render_ps_error(std::uint8_t code, caf::atom_value, const caf::message& ctx) {
  static const char* names[] = {"?", "failed", "refused", "job_failed", "stopped", "interrupted", "terminated"};
  std::string out = std::string("ps::") + (code < std::size(names) ? names[code] : "?");
  if (ctx.match_elements<std::string>()) out += ": " + ctx.get_as<std::string>(0);
  return out;
}
}  // namespace

void register_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<float_block>("ps::float_block");
  cfg.add_message_type<encoded_block>("ps::encoded_block");
  cfg.add_message_type<range_list>("ps::range_list");
  cfg.add_message_type<row_ids>("ps::row_ids");
  cfg.add_message_type<request_header>("ps::request_header");
  cfg.add_message_type<node_info>("ps::node_info");
  cfg.add_message_type<registration>("ps::registration");
  cfg.add_message_type<cluster_view>("ps::cluster_view");
  cfg.add_message_type<shard_actor>("ps::shard_actor");
  cfg.add_message_type<coordinator_actor>("ps::coordinator_actor");
  cfg.add_message_type<checkpointer_actor>("ps::checkpointer_actor");
  cfg.add_message_type<worker_result>("ps::worker_result");
  cfg.add_message_type<update_loss>("ps::update_loss");
  cfg.add_message_type<std::vector<std::uint32_t>>("std::vector<uint32_t>");
  cfg.add_message_type<std::vector<std::uint64_t>>("std::vector<uint64_t>");
  cfg.add_error_category(ps_category, render_ps_error);
}


caf::error make_error(errc code, std::string text) {
  return caf::error(static_cast<std::uint8_t>(code), ps_category, caf::make_message(std::move(text)));
}

errc code_of(const caf::error& err) {
  if (err && err.category() == ps_category && err.code() >= 1 &&
      err.code() <= static_cast<std::uint8_t>(errc::busy))
    return static_cast<errc>(err.code());
  return errc::failed;
}

const char* status_of(errc code) {
  switch (code) {
    case errc::stopped:
    case errc::interrupted:
    case errc::terminated:
      return "stopped";
    default:
      return "failed";
  }
}

int exit_status_of(errc code) {
  switch (code) {
    case errc::stopped:
      return 0;
    case errc::interrupted:
      return 130;
    case errc::terminated:
      return 143;
    case errc::refused:
    case errc::busy:  // refused for now
      return 3;
    default:
      return 1;
  }
}

partitioner map_of(const cluster_view& view) {
  std::vector<std::uint32_t> ids;
  for (const auto& s : view.shards) ids.push_back(s.id);
  partitioner map(view.epoch, ids, view.vnodes, view.bucket_bits, view.dense.ranges);
  if (view.placed_buckets.size() != view.placed_owners.size())
    throw bad_request("a map's placement has " + std::to_string(view.placed_buckets.size()) + " buckets and " +
                      std::to_string(view.placed_owners.size()) + " owners");
  if (view.placed_buckets.empty()) return map;
  partitioner::placement_list placement;
  for (std::size_t i = 0; i < view.placed_buckets.size(); ++i)
    placement.emplace_back(view.placed_buckets[i], view.placed_owners[i]);
  return map.with_placement(placement);
}

void set_placement(cluster_view& view, const partitioner& map) {
  view.placed_buckets.clear();
  view.placed_owners.clear();
  for (const auto& [bucket, owner] : map.placement()) {
    view.placed_buckets.push_back(bucket);
    view.placed_owners.push_back(owner);
  }
}

caf::error make_ps_error(std::string text) {
  return make_error(errc::failed, std::move(text));
}

std::string describe(const caf::error& err) {
  if (!err) return "normal exit";  // CAF 0.17: category() of an empty error crashes
  const auto& ctx = err.context();
  bool ours = err.category() == ps_category ||
              (err.category() == caf::atom("system") && err.code() == static_cast<std::uint8_t>(caf::sec::runtime_error));
  if (ours && ctx.match_elements<std::string>()) return ctx.get_as<std::string>(0);
  return caf::actor_system_config::render(err);
}

}  // namespace ps

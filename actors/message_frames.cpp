#include "actors/message_frames.hpp"

#include <cstring>
#include <string>
#include <type_traits>

#include "actors/messages.hpp"

namespace ps {

namespace {

enum class shape : std::uint8_t { push = 1, pull = 2, count_answer = 3, block_answer = 4 };
enum class block_form : std::uint8_t { inline_values = 0, named_payload = 1 };

class body_writer {
 public:
  explicit body_writer(std::vector<char>& out) : out_(out) {}
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof(T));
  }
  void bytes(const void* p, std::size_t n) {
    auto at = out_.size();
    out_.resize(at + n);
    if (n > 0) std::memcpy(out_.data() + at, p, n);
  }

 private:
  std::vector<char>& out_;
};

class body_reader {
 public:
  explicit body_reader(std::span<const char> in) : in_(in) {}
  template <class T>
  T get(const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    bytes(&v, sizeof(T), what);
    return v;
  }
  void bytes(void* p, std::size_t n, const char* what) {
    if (n > remaining())
      throw bad_request(std::string("a typed message frame cut short in its ") + what + " (" +
                        std::to_string(remaining()) + " bytes left, " + std::to_string(n) + " needed)");
    if (n > 0) std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }
  // A count of elements of `element_bytes` each that the rest of the body must hold.
  std::uint64_t count(std::size_t element_bytes, const char* what) {
    auto n = get<std::uint64_t>(what);
    if (n > remaining() / element_bytes)
      throw bad_request(std::string("a typed message frame announces ") + std::to_string(n) + " " + what + " of " +
                        std::to_string(element_bytes) + " bytes; " + std::to_string(remaining()) + " bytes remain");
    return n;
  }
  std::size_t remaining() const { return in_.size() - at_; }

 private:
  std::span<const char> in_;
  std::size_t at_ = 0;
};

void put_header(body_writer& w, const request_header& h) {
  w.put(h.epoch), w.put(h.worker), w.put(h.clock), w.put(h.seq), w.put(h.reply_plane), w.put(h.pull_codec);
  w.put(h.tick);
}

request_header get_header(body_reader& r) {
  request_header h;
  h.epoch = r.get<std::uint64_t>("header");
  h.worker = r.get<std::uint32_t>("header");
  h.clock = r.get<std::uint64_t>("header");
  h.seq = r.get<std::uint64_t>("header");
  h.reply_plane = r.get<std::uint64_t>("header");
  h.pull_codec = r.get<std::uint8_t>("header");
  h.tick = r.get<std::uint64_t>("header");
  return h;
}

void put_ranges(body_writer& w, const range_list& ranges) {
  w.put(static_cast<std::uint64_t>(ranges.ranges.size()));
  for (const auto& r : ranges.ranges) w.put(r.begin), w.put(r.end);
}

range_list get_ranges(body_reader& r) {
  range_list out;
  out.ranges.resize(r.count(2 * sizeof(key_type), "key ranges"));
  for (auto& k : out.ranges) k.begin = r.get<key_type>("key ranges"), k.end = r.get<key_type>("key ranges");
  return out;
}

void put_block(body_writer& w, const float_block& b) {
  if (b.ticket != 0) {
    w.put(block_form::named_payload), w.put(b.ticket), w.put(b.origin), w.put(b.size);
    return;
  }
  w.put(block_form::inline_values), w.put(b.size);
  w.bytes(b.data(), b.size * sizeof(float));
}

float_block get_block(body_reader& r) {
  float_block b;
  auto form = r.get<std::uint8_t>("block");
  if (form == static_cast<std::uint8_t>(block_form::named_payload)) {
    b.ticket = r.get<std::uint64_t>("block"), b.origin = r.get<std::uint64_t>("block"), b.size = r.get<std::uint64_t>("block");
    if (b.ticket == 0) throw bad_request("a typed message frame names a payload without a ticket");
    return b;
  }
  if (form != static_cast<std::uint8_t>(block_form::inline_values))
    throw bad_request("a typed message frame holds a block of unknown form " + std::to_string(form));
  b.size = r.count(sizeof(float), "values");
  b.storage = inline_values(b.size);
  r.bytes(b.storage->data(), b.size * sizeof(float), "values");
  return b;
}

// The sender's node as the layout carries it: false for a node of another form.
bool put_envelope(body_writer& w, shape s, const message_envelope& e) {
  std::uint8_t node_form = 0;
  std::uint32_t pid = 0;
  caf::node_id::default_data::host_id_type host{};
  if (e.from_node) {
    if (e.from_node->implementation_id() != caf::node_id::default_data::class_id) return false;
    const auto& d = static_cast<const caf::node_id::default_data&>(*e.from_node);
    node_form = 1, pid = d.process_id(), host = d.host_id();
  }
  w.put(s), w.put(node_form), w.put(std::uint16_t{0}), w.put(pid), w.put(e.to), w.put(e.from), w.put(e.mid);
  w.bytes(host.data(), host.size());
  return true;
}

// Encoded values, and values with neither storage nor a ticket, are left to CAF.
bool typed_block(const float_block& b) { return !b.encoded && (b.ticket != 0 || b.storage || b.size == 0); }

bool put_content(body_writer& w, const message_envelope& e, const caf::message& m) {
  if (m.match_elements<push_atom, request_header, range_list, float_block>()) {
    if (!typed_block(m.get_as<float_block>(3)) || !put_envelope(w, shape::push, e)) return false;
    put_header(w, m.get_as<request_header>(1)), put_ranges(w, m.get_as<range_list>(2)), put_block(w, m.get_as<float_block>(3));
    return true;
  }
  if (m.match_elements<pull_atom, request_header, range_list>()) {
    if (!put_envelope(w, shape::pull, e)) return false;
    put_header(w, m.get_as<request_header>(1)), put_ranges(w, m.get_as<range_list>(2));
    return true;
  }
  if (m.match_elements<std::uint64_t>()) {
    if (!put_envelope(w, shape::count_answer, e)) return false;
    w.put(m.get_as<std::uint64_t>(0));
    return true;
  }
  if (m.match_elements<float_block>()) {
    if (!typed_block(m.get_as<float_block>(0)) || !put_envelope(w, shape::block_answer, e)) return false;
    put_block(w, m.get_as<float_block>(0));
    return true;
  }
  return false;
}

caf::message get_content(body_reader& r, std::uint8_t s) {
  switch (static_cast<shape>(s)) {
    case shape::push: {
      auto h = get_header(r);
      auto ranges = get_ranges(r);
      return caf::make_message(push_atom::value, h, std::move(ranges), get_block(r));
    }
    case shape::pull: {
      auto h = get_header(r);
      return caf::make_message(pull_atom::value, h, get_ranges(r));
    }
    case shape::count_answer:
      return caf::make_message(r.get<std::uint64_t>("count"));
    case shape::block_answer:
      return caf::make_message(get_block(r));
  }
  throw bad_request("a typed message frame of unknown shape " + std::to_string(s));
}

}  // namespace

bool encode_typed_message(const message_envelope& envelope, const caf::message& content, std::vector<char>& out) {
  const auto size_before = out.size();
  body_writer w(out);
  if (put_content(w, envelope, content)) return true;
  out.resize(size_before);
  return false;
}

message_envelope decode_typed_message(std::span<const char> body, caf::message& content) {
  body_reader r(body);
  auto s = r.get<std::uint8_t>("shape");
  auto node_form = r.get<std::uint8_t>("envelope");
  if (node_form > 1) throw bad_request("a typed message frame with a sender's node of unknown form " + std::to_string(node_form));
  r.get<std::uint16_t>("envelope");
  auto pid = r.get<std::uint32_t>("envelope");
  message_envelope e;
  e.to = r.get<std::uint64_t>("envelope"), e.from = r.get<std::uint64_t>("envelope"), e.mid = r.get<std::uint64_t>("envelope");
  caf::node_id::default_data::host_id_type host;
  r.bytes(host.data(), host.size(), "envelope");
  if (node_form == 1) e.from_node = caf::make_node_id(pid, host);
  content = get_content(r, s);
  if (r.remaining() >= 4)
    throw bad_request("a typed message frame with " + std::to_string(r.remaining()) + " bytes after its message");
  return e;
}

}  // namespace ps

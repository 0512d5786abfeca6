#pragma once
// The messages every dense push and pull is made of, in a fixed layout for the data
// connections: the request (push or pull) and its answer (a count or a block).
//
// Why: CAF 0.17 writes a message element by element, each custom type under its name,
// which the reader looks up in a table of names, and every field through a call that
// returns an error object; in a 4 KiB window-8 cell that came to about a seventh of both
// processes' busy CPU (BENCHMARKS.md, "Typed message frames"). Every other message still
// travels as CAF serializes it (data_plane::send_message picks).
//
// Layout (native byte order, as the raw float blocks: both ends share it): shape (1 byte),
// sender's node form (1 byte: 0 none, 1 process id and host hash), 2 zero bytes, the
// node's process id (4 bytes), receiver, sender and message id (8 bytes each), the host
// hash (20 bytes), then the shape's fields.
#include <cstdint>
#include <span>
#include <vector>

#include <caf/message.hpp>
#include <caf/node_id.hpp>

namespace ps {

struct message_envelope {
  std::uint64_t to = 0;    // the receiving actor's id
  std::uint64_t from = 0;  // the sending actor's id (0: none)
  std::uint64_t mid = 0;   // caf::message_id's integer value
  caf::node_id from_node;  // the sender's node (none without a sender)
};

// Appends the typed body of `content` to `out` and returns true; false, with `out` as it
// was, when `content` is none of the shapes above (or holds encoded values, or its sender
// has a node id of another form): then CAF serializes it.
bool encode_typed_message(const message_envelope& envelope, const caf::message& content, std::vector<char>& out);

// The envelope and content of a typed body (up to 3 bytes of padding may follow). Throws
// bad_request naming what is wrong: an unknown shape or form, a field cut short, a count
// larger than the bytes that remain, bytes left over.
message_envelope decode_typed_message(std::span<const char> body, caf::message& content);

}  // namespace ps

// A handoff as bytes and back (libps/persist/handoff_codec.hpp).
#include "libps/persist/handoff_codec.hpp"

#include <zlib.h>

#include <cereal/archives/binary.hpp>
#include <cereal/types/deque.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cstring>
#include <sstream>

#include "libps/keys/keys.hpp"
#include "libps/persist/bounded_archive.hpp"
#include "libps/persist/cereal_types.hpp"

namespace ps {

template <class Archive>
void serialize(Archive& ar, key_range& r) {
  ar(r.begin, r.end);
}
template <class Archive>
void serialize(Archive& ar, deferred_update& d) {
  ar(d.epoch, d.worker, d.clock, d.seq, d.ranges, d.values, d.table, d.ids);
}
template <class Archive>
void serialize(Archive& ar, shard_handoff& h) {
  ar(h.from, h.to, h.epoch, h.segments, h.rows, h.deferred, h.clocks, h.applied, h.highest_clock, h.sightings, h.rows_only, h.whole, h.merges, h.again);
}

namespace {
constexpr char handoff_magic[4] = {'A', 'P', 'H', 'O'};

std::uint32_t crc_of(const char* data, std::size_t n) {
  return static_cast<std::uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
}
}  // namespace

std::string encode_handoff(const shard_handoff& h) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive ar(out);
    ar(h);
  }
  auto body = out.str();
  std::string bytes(handoff_magic, sizeof(handoff_magic));
  bytes += body;
  auto crc = crc_of(body.data(), body.size());
  bytes.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  return bytes;
}

shard_handoff decode_handoff(const std::string& bytes) {
  if (bytes.size() < sizeof(handoff_magic) + 4 || std::memcmp(bytes.data(), handoff_magic, sizeof(handoff_magic)) != 0)
    throw bad_request("a handoff of " + std::to_string(bytes.size()) + " bytes does not start as one");
  auto body = bytes.substr(sizeof(handoff_magic), bytes.size() - sizeof(handoff_magic) - 4);
  std::uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  if (crc != crc_of(body.data(), body.size())) throw bad_request("a handoff's checksum does not match (corrupt)");
  shard_handoff h;
  try {
    bounded_input_archive ar(body);
    ar(h);
  } catch (const std::exception& e) {
    throw bad_request(std::string("a handoff does not decode: ") + e.what());
  }
  return h;
}

}  // namespace ps

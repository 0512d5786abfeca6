// cereal's binary input archive with one more check: a container's length must fit in the
// bytes that remain. cereal sizes a vector from the length it reads before it reads the
// elements, so a corrupt checkpoint (or a shard's section from the wire) that claims 2^40
// elements would allocate them first (found by tests/fuzz/fuzz_checkpoint). Reads the
// same bytes as cereal::BinaryInputArchive.
#pragma once

#include <cereal/cereal.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace ps {

class bounded_input_archive : public cereal::InputArchive<bounded_input_archive, cereal::AllowEmptyClassElision> {
 public:
  explicit bounded_input_archive(const std::string& bytes)
      : InputArchive(this), bytes_(bytes) {}

  void loadBinary(void* const data, std::streamsize size) {
    if (size < 0 || static_cast<std::uint64_t>(size) > remaining())
      throw cereal::Exception("wants " + std::to_string(size) + " bytes where " + std::to_string(remaining()) +
                              " remain");
    if (size > 0) std::memcpy(data, bytes_.data() + at_, static_cast<std::size_t>(size));  // data is null for empty vectors
    at_ += static_cast<std::size_t>(size);
  }
  std::uint64_t remaining() const { return bytes_.size() - at_; }

 private:
  const std::string& bytes_;
  std::size_t at_ = 0;
};

template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, T& t) {
  ar.loadBinary(std::addressof(t), sizeof(t));
}

template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(bounded_input_archive& ar, cereal::NameValuePair<T>& t) {
  ar(t.value);
}

// Every element takes at least one byte, so a length above the remaining bytes is a lie.
template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(bounded_input_archive& ar, cereal::SizeTag<T>& t) {
  ar(t.size);
  if (static_cast<std::uint64_t>(t.size) > ar.remaining())
    throw cereal::Exception("a length of " + std::to_string(static_cast<std::uint64_t>(t.size)) + " where " +
                            std::to_string(ar.remaining()) + " bytes remain");
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(bounded_input_archive& ar, cereal::BinaryData<T>& bd) {
  ar.loadBinary(bd.data, static_cast<std::streamsize>(bd.size));
}

}  // namespace ps

CEREAL_REGISTER_ARCHIVE(ps::bounded_input_archive)

#pragma once
// The hashes every placement and first-touch value is built from: they must be the same
// on every member and platform, so they are spelled out here, not taken from std::hash.
#include <cstdint>
#include <string_view>

namespace ps {

// splitmix64 (Steele, Lea and Flood): a 64-bit mix with full avalanche.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a, 64 bits, of a byte string (names).
inline std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace ps

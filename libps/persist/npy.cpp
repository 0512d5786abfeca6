#include "libps/persist/npy.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <numeric>

#include "libps/keys/keys.hpp"

namespace ps {

std::string npy_header(const std::string& dtype, const std::vector<std::uint64_t>& shape) {
  std::string dims;
  for (auto d : shape) dims += std::to_string(d) + ",";
  if (shape.size() > 1) dims.pop_back();  // (n,) for one dimension, (n, m) for more
  std::string dict = "{'descr': '" + dtype + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t preamble = 10;  // magic (6), version (2), header length (2)
  std::size_t total = preamble + dict.size() + 1;  // + the newline
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

namespace {

template <class T>
void write_array(const std::string& path, const std::string& dtype, const std::vector<std::uint64_t>& shape,
                 const std::vector<T>& values) {
  auto count = std::accumulate(shape.begin(), shape.end(), std::uint64_t{1}, std::multiplies<>());
  if (count != values.size())
    throw bad_request(path + ": " + std::to_string(values.size()) + " values for a shape of " + std::to_string(count));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  auto header = npy_header(dtype, shape);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
  f.flush();
  if (!f) throw bad_request(path + ": cannot write: " + std::strerror(errno));
}

}  // namespace

void write_npy(const std::string& path, const std::vector<std::uint64_t>& shape, const std::vector<float>& values) {
  write_array(path, "<f4", shape, values);
}

void write_npy(const std::string& path, const std::vector<std::uint64_t>& shape,
               const std::vector<std::uint64_t>& values) {
  write_array(path, "<u8", shape, values);
}

}  // namespace ps

// NumPy's .npy format (version 1.0), written: what numpy.load reads without a pickle.
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ps {

// The file's bytes up to the data: magic, version, header length and the header dict
// padded so the data starts on a 64-byte boundary. dtype: "<f4" or "<u8".
std::string npy_header(const std::string& dtype, const std::vector<std::uint64_t>& shape);

// Writes a C-order array; throws bad_request naming the path on an I/O error or when the
// element count does not match the shape.
void write_npy(const std::string& path, const std::vector<std::uint64_t>& shape, const std::vector<float>& values);
void write_npy(const std::string& path, const std::vector<std::uint64_t>& shape,
               const std::vector<std::uint64_t>& values);

}  // namespace ps

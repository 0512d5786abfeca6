#pragma once
// A plain socket to a data plane's port, for writing what a broken or foreign peer would
// (tests of actors/data_plane.hpp).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/data_plane.hpp"

namespace ps::test {

inline int raw_connection(const data_plane& p) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(p.port());
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

inline void write_bytes(int fd, const void* p, std::size_t n) {
  REQUIRE(::send(fd, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
}

}  // namespace ps::test

#include "libps/net/tcp_congestion.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ps {

std::vector<std::string> available_tcp_congestion() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_congestion_control");
  std::vector<std::string> names;
  for (std::string name; in >> name;) names.push_back(name);
  return names;
}

std::string set_tcp_congestion(int fd, const std::string& name) {
  if (name == host_tcp_congestion) return {};
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0) return {};
  return std::strerror(errno);
}

std::string check_tcp_congestion(const std::string& name) {
  if (name == host_tcp_congestion) return {};
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("cannot open a socket to try it: ") + std::strerror(errno);
  auto why = set_tcp_congestion(fd, name);
  ::close(fd);
  if (why.empty()) return {};
  std::ostringstream offered;
  for (const auto& n : available_tcp_congestion()) offered << (offered.tellp() > 0 ? ", " : "") << n;
  return "TCP congestion control '" + name + "' cannot be used here (" + why + "); this kernel offers: " +
         (offered.tellp() > 0 ? offered.str() : "(unknown)") + ", or '" + host_tcp_congestion +
         "' for the host's default";
}

}  // namespace ps

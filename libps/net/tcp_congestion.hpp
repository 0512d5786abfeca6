#pragma once
// Which TCP congestion control a data connection uses (Linux's TCP_CONGESTION). BBR, the
// host's default on this machine kind, paces every connection with a kernel timer when the
// interface has no fq qdisc (loopback never has): a 2 servers x 2 workers cell of 1 MiB
// pulls at window 8 fired 5,300-12,700 pacing timers a second. Data connections use cubic
// by default (BENCHMARKS.md, "Data connections under cubic").
#include <string>
#include <vector>

namespace ps {

// What data connections use unless told otherwise.
inline constexpr const char* default_tcp_congestion = "cubic";

// The name that leaves a socket on the host's default.
inline constexpr const char* host_tcp_congestion = "system";

// The algorithms this kernel offers (/proc/sys/net/ipv4/tcp_available_congestion_control;
// empty when it cannot be read).
std::vector<std::string> available_tcp_congestion();

// Sets fd's congestion control to `name` (host_tcp_congestion: leaves it). Empty on
// success, else why not.
std::string set_tcp_congestion(int fd, const std::string& name);

// Whether a socket of this process can use `name`: empty when it can, else an error that
// names it and what the kernel offers (tried on a socket of its own, so a name the kernel
// lacks or does not let this user pick is found before any connection needs it).
std::string check_tcp_congestion(const std::string& name);

}  // namespace ps

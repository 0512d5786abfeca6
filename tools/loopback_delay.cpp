// How long a small loopback TCP write takes to reach a reader that busy-polls on the
// other vCPU while the writer goes on copying (as a ring payload's header, then its
// floats): 200 writes each way, with and without a sched_yield() after the write
// (BENCHMARKS.md, "A small loopback write seen milliseconds late"). Standalone:
//   g++ -O2 -pthread -o /tmp/loopback_delay tools/loopback_delay.cpp && /tmp/loopback_delay
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

using steady = std::chrono::steady_clock;

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

int main() {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(listener, (sockaddr*)&addr, sizeof addr) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, (sockaddr*)&addr, &len) != 0) {
    std::perror("loopback_delay: listen");
    return 1;
  }
  int writer = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(writer, (sockaddr*)&addr, sizeof addr) != 0) {
    std::perror("loopback_delay: connect");
    return 1;
  }
  int reader_fd = accept(listener, nullptr, nullptr);
  int one = 1;
  setsockopt(writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::atomic<long> seen{0};
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    pin(1);
    char buf[64];
    while (!stop)
      if (recv(reader_fd, buf, sizeof buf, MSG_DONTWAIT) > 0) seen = steady::now().time_since_epoch().count();
  });
  pin(0);
  std::vector<char> from(1 << 20, 1), to(1 << 20);
  for (int yield = 0; yield < 2; ++yield) {
    std::vector<double> us;
    for (int i = 0; i < 200; ++i) {
      seen = 0;
      char header[24] = {};
      const auto sent = steady::now().time_since_epoch().count();
      send(writer, header, sizeof header, MSG_NOSIGNAL);
      if (yield) sched_yield();
      std::memcpy(to.data(), from.data(), from.size());  // the writer's work goes on
      while (seen == 0) {
      }
      us.push_back(static_cast<double>(seen - sent) / 1e3);
      usleep(300);
    }
    std::sort(us.begin(), us.end());
    std::printf("{\"after_write\":\"%s\",\"p50_us\":%.0f,\"p90_us\":%.0f,\"max_us\":%.0f}\n",
                yield ? "sched_yield" : "nothing", us[100], us[180], us.back());
  }
  stop = true;
  reader.join();
}

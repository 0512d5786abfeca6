#include "libps/net/cpu_room.hpp"
#include "libps/observe/text.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <thread>

namespace ps {

std::optional<unsigned> runnable_in_loadavg(std::string_view line) {
  // Three averages, then "running/total".
  const auto fields = split(std::string(line), ' ');
  if (fields.size() < 4) return std::nullopt;
  const auto counts = split(fields[3], '/');
  if (counts.size() != 2) return std::nullopt;
  const auto running = parse_count(counts[0]);
  if (!running || *running > std::numeric_limits<unsigned>::max()) return std::nullopt;
  return static_cast<unsigned>(*running);
}

cpu_room::cpu_room(unsigned cpus, std::chrono::microseconds refresh, sampler sample)
    : cpus_(cpus), refresh_(refresh), sample_(std::move(sample)) {}

bool cpu_room::spare(clock::time_point now) {
  const auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  auto at = sampled_at_.load(std::memory_order_relaxed);
  const auto refresh_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(refresh_).count();
  // One asker takes each new sample; the others go by the last one meanwhile.
  if ((at == std::numeric_limits<std::int64_t>::min() || now_ns - at >= refresh_ns) &&
      sampled_at_.compare_exchange_strong(at, now_ns, std::memory_order_relaxed)) {
    const auto runnable = sample_();
    spare_.store(!runnable || *runnable <= cpus_, std::memory_order_relaxed);
  }
  return spare_.load(std::memory_order_relaxed);
}

namespace {

// /proc/loadavg read again through one descriptor (pread at 0 makes the kernel write it anew).
std::optional<unsigned> sample_loadavg() {
  static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char line[128];
  const auto n = ::pread(fd, line, sizeof line - 1, 0);
  if (n <= 0) return std::nullopt;
  return runnable_in_loadavg(std::string_view(line, static_cast<std::size_t>(n)));
}

}  // namespace

unsigned host_cpus() { return std::max(1u, std::thread::hardware_concurrency()); }

cpu_room& host_cpu_room() {
  static cpu_room room(host_cpus(), std::chrono::microseconds(100), sample_loadavg);
  return room;
}

}  // namespace ps

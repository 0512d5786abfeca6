#include "apps/disk_probe.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "libps/keys/keys.hpp"

namespace ps {

namespace {
constexpr std::size_t page = 4096;
using aligned_buffer = std::unique_ptr<void, decltype(&free)>;
aligned_buffer aligned(std::size_t bytes) { return {aligned_alloc(page, bytes), &free}; }
}  // namespace

std::optional<timed_ops> timed_rate(std::size_t threads, double seconds,
                                    const std::function<std::optional<std::uint64_t>(std::size_t, std::mt19937_64&)>& step) {
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> failed{false};
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      while (!failed && elapsed() < seconds) {
        auto n = step(t, rng);
        if (!n) failed = true;
        else done += *n;
      }
    });
  for (auto& t : pool) t.join();
  if (failed) return std::nullopt;
  return timed_ops{done.load(), static_cast<double>(done) / elapsed()};
}

disk_probe::disk_probe(const std::string& dir, std::uint64_t bytes)
    : path_(dir + "/actorps-disk-probe-" + std::to_string(getpid())), bytes_(bytes) {
  if (bytes_ < page || bytes_ % page != 0)
    throw bad_request("disk probe: a file of " + std::to_string(bytes_) + " bytes is not a whole number of 4 KiB pages");
  fd_ = ::open(path_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0) throw bad_request("disk probe: cannot create " + path_ + ": " + std::strerror(errno));
  ::unlink(path_.c_str());  // gone when closed
  constexpr std::size_t block = 1 << 20;
  auto buf = aligned(block);
  std::memset(buf.get(), 0x5a, block);
  for (std::uint64_t at = 0; at < bytes_; at += block) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(block, bytes_ - at));
    if (::pwrite(fd_, buf.get(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) {
      const std::string why = std::strerror(errno);
      ::close(fd_);
      throw bad_request("disk probe: writing " + path_ + ": " + why);
    }
  }
  ::fsync(fd_);
}

disk_probe::~disk_probe() { ::close(fd_); }

double disk_probe::reads_per_s(double seconds, std::size_t threads) const {
  std::vector<aligned_buffer> pages;
  for (std::size_t t = 0; t < threads; ++t) pages.push_back(aligned(page));
  auto rate = timed_rate(threads, seconds, [&](std::size_t t, std::mt19937_64& rng) -> std::optional<std::uint64_t> {
    auto at = (rng() % (bytes_ / page)) * page;
    if (::pread(fd_, pages[t].get(), page, static_cast<off_t>(at)) != static_cast<ssize_t>(page)) return std::nullopt;
    return 1;
  });
  if (!rate) throw bad_request("disk probe: reading " + path_ + " failed");
  return rate->per_s;
}

}  // namespace ps

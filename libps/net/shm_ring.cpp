#include "libps/net/shm_ring.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <mutex>
#include <new>
#include <optional>

#include "libps/net/busy_poll.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

// The ring's first page: who made it, its size, and the two counters (bytes ever written
// and read: the writer alone moves head, the reader alone tail, so plain atomic loads and
// stores suffice), each on a cache line of its own.
struct shm_ring_control {
  std::uint64_t magic = 0;
  std::uint64_t nonce = 0;
  std::uint64_t capacity = 0;
  alignas(64) std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  alignas(64) sem_t data;  // posted when bytes were added
  sem_t room;              // posted when bytes were freed
};

namespace {

constexpr std::uint64_t ring_magic = 0x474e495253504141ull;  // "AAPSRING"
constexpr std::size_t control_bytes = 4096;
static_assert(sizeof(shm_ring_control) <= control_bytes);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the counters are shared between processes");
// Bytes copied between publications: small enough that the reader starts early, large
// enough that the semaphore's cost is noise.
constexpr std::size_t slice_bytes = 256u << 10;
constexpr auto wait_slice = std::chrono::milliseconds(10);
// How long a reader lets lent records hold its writer before their owner hears of it: a
// shard adds a 1 MiB push in about 0.1 ms, so one that takes longer is busy elsewhere (and
// copying the records out at once cost a copy per push at window 8).
constexpr auto held_grace = std::chrono::milliseconds(1);

std::string errno_text() { return std::strerror(errno); }

// One wait on `sem` of `slice` at most (a post ends it early): false with *why when
// `alive` reports the peer gone or nothing moved since `since` for `stall`.
bool wait_once(sem_t* sem, std::chrono::milliseconds slice, const shm_ring::alive_check& alive,
               std::chrono::steady_clock::time_point since, std::chrono::milliseconds stall, const char* what,
               std::string* why) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += std::chrono::nanoseconds(slice).count();
  ts.tv_sec += ts.tv_nsec / 1000000000;
  ts.tv_nsec %= 1000000000;
  if (sem_timedwait(sem, &ts) == 0 || errno == EINTR) return true;
  if (errno != ETIMEDOUT) {
    *why = std::string("shared-memory ring: waiting for ") + what + ": " + errno_text();
    return false;
  }
  if (auto gone = alive ? alive() : std::string(); !gone.empty()) {
    *why = gone;
    return false;
  }
  if (std::chrono::steady_clock::now() - since >= stall) {
    *why = std::string("shared-memory ring: no ") + what + " for " + std::to_string(stall.count()) + " ms";
    return false;
  }
  return true;
}

std::size_t page_rounded(std::size_t n) {
  auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

}  // namespace

std::string shm_ring::name_of(std::uint32_t pid, std::uint64_t nonce) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/actorps-ring-%u-%016llx", pid, static_cast<unsigned long long>(nonce));
  return buf;
}

// The reader's position and its lent records. It holds the mapping: a lent record may
// outlive the ring object (a shard still adding when the connection ends).
struct shm_ring::lending {
  lending(shm_ring_control* c, std::size_t bytes) : control(c), mapped(bytes) {}
  ~lending() { ::munmap(control, mapped); }
  lending(const lending&) = delete;
  lending& operator=(const lending&) = delete;

  // The reader moved past `at` (read or lent everything before it).
  void moved_to(std::uint64_t at) {
    std::lock_guard<std::mutex> guard(mtx);
    cursor = at;
    publish();
  }
  void returned(std::uint64_t start) {
    {
      std::lock_guard<std::mutex> guard(mtx);
      lent.erase(start);
      publish();
    }
    sem_post(&control->room);
  }
  // The writer may reuse everything before the earliest record still out, or before the
  // cursor when none is.
  void publish() { control->tail.store(lent.empty() ? cursor : *lent.begin(), std::memory_order_release); }

  shm_ring_control* control;
  std::size_t mapped;
  std::mutex mtx;
  std::uint64_t cursor = 0;                      // the reader's alone to move (under mtx)
  std::set<std::uint64_t> lent;  // where each record out on loan starts
};

shm_ring::shm_ring(std::string name, shm_ring_control* control, std::size_t mapped, bool owner)
    : name_(std::move(name)), control_(control), data_(reinterpret_cast<std::byte*>(control) + control_bytes),
      capacity_(control->capacity), lending_(std::make_shared<lending>(control, mapped)), owner_(owner),
      linked_(owner) {
  lending_->cursor = control->tail.load(std::memory_order_acquire);
}

std::unique_ptr<shm_ring> shm_ring::create(std::uint64_t nonce, std::size_t capacity) {
  capacity = page_rounded(std::max<std::size_t>(capacity, slice_bytes));
  auto name = name_of(static_cast<std::uint32_t>(::getpid()), nonce);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw bad_request("shared-memory ring " + name + ": " + errno_text());
  const auto mapped = control_bytes + capacity;
  // The room is taken now (fallocate), or refused now: a ring mapped over a full /dev/shm
  // (a container's 64 MiB) would end the process with SIGBUS at its first touch.
  struct statvfs fs{};
  int err = ::fstatvfs(fd, &fs) == 0 && fs.f_bavail * fs.f_bsize < mapped ? ENOSPC : 0;
  if (err == 0) err = ::posix_fallocate(fd, 0, static_cast<off_t>(mapped));
  void* at = MAP_FAILED;
  if (err == 0) at = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (err == 0 && at == MAP_FAILED) err = errno;
  ::close(fd);
  if (at == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    throw bad_request("shared-memory ring " + name + " (" + std::to_string(mapped) + " bytes): " + std::strerror(err) +
                      (err == ENOSPC ? " (/dev/shm is full or too small)" : ""));
  }
  auto* control = new (at) shm_ring_control;
  control->nonce = nonce;
  control->capacity = capacity;
  sem_init(&control->data, 1, 0);
  sem_init(&control->room, 1, 0);
  std::atomic_thread_fence(std::memory_order_release);
  control->magic = ring_magic;  // last: a reader checks it
  return std::unique_ptr<shm_ring>(new shm_ring(std::move(name), control, mapped, true));
}

std::unique_ptr<shm_ring> shm_ring::open(std::uint32_t pid, std::uint64_t nonce, std::string* why) {
  auto name = name_of(pid, nonce);
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    *why = "no shared-memory ring " + name + " here: " + errno_text();
    return nullptr;
  }
  struct stat st{};
  void* at = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) > control_bytes)
    at = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (at == MAP_FAILED) {
    *why = "shared-memory ring " + name + " cannot be mapped (" + std::to_string(st.st_size) + " bytes)";
    return nullptr;
  }
  auto* control = static_cast<shm_ring_control*>(at);
  const auto size = static_cast<std::size_t>(st.st_size);
  if (control->magic != ring_magic || control->nonce != nonce || control->capacity + control_bytes != size) {
    ::munmap(at, size);
    *why = "shared-memory ring " + name + " is not the one announced";
    return nullptr;
  }
  ::shm_unlink(name.c_str());  // both hold it mapped: the name is no longer needed
  return std::unique_ptr<shm_ring>(new shm_ring(std::move(name), control, size, false));
}

shm_ring::~shm_ring() {
  if (owner_) unlink();
}

void shm_ring::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

namespace {

// Bytes a side moves past without copying (the skip before a record that would wrap, a
// record lent in place).
struct gap {
  std::size_t bytes;
  std::size_t size() const { return bytes; }
};

// How a side waits for the other: polling for `poll` first (shm_ring::poll_before_waiting),
// then on `sem`, which the other side posts after each move.
struct ring_wait {
  sem_t* sem;
  std::chrono::microseconds poll;
};

// Takes back the posts of moves this side did not wait for (the other side posts after
// every move): left in the count, each would end a later wait at once, and a side that
// found the other's bytes ready for a while (at 10 GB/s, 40,000 slices a second) then
// spun through as many empty waits. Called before a side starts waiting, which then asks
// again before it sleeps, so no move is missed.
void take_back_posts(sem_t* sem) {
  while (sem_trywait(sem) == 0) {
  }
}

// One side's pass over its pieces from position `at`: `theirs` is the other side's
// counter; `open(at, theirs)` is how many bytes this side may move now (0: take back stale
// posts and ask again, then poll, then wait on the semaphore for at most `slice()`, and ask
// again), `copy(piece, ring_offset, piece_offset, n)` moves them, and `moved(at)` publishes
// the new position and tells the other side.
template <class Piece, class Open, class Slice, class Copy, class Moved>
bool pass(std::span<const Piece> pieces, std::uint64_t at, const std::atomic<std::uint64_t>& theirs,
          std::size_t capacity, const ring_wait& wait, Open open, Slice slice, Copy copy, Moved moved,
          const shm_ring::alive_check& alive, std::chrono::milliseconds stall, const char* what, std::string* why) {
  std::optional<std::chrono::steady_clock::time_point> waiting_since;  // since the last move
  auto opened = [&] { return open(at, theirs.load(std::memory_order_acquire)) > 0; };
  for (auto piece : pieces) {
    for (std::size_t off = 0; off < piece.size();) {
      const auto ready = open(at, theirs.load(std::memory_order_acquire));
      if (ready == 0) {
        if (!waiting_since) {
          waiting_since = std::chrono::steady_clock::now();
          take_back_posts(wait.sem);
          continue;
        }
        if (!poll_while_idle(wait.poll, opened) && !wait_once(wait.sem, slice(), alive, *waiting_since, stall, what, why))
          return false;
        continue;
      }
      waiting_since.reset();
      const auto n = std::min({piece.size() - off, ready, capacity - at % capacity, slice_bytes});
      copy(piece, at % capacity, off, n);
      at += n;
      moved(at);
      off += n;
    }
  }
  return true;
}

constexpr auto no_copy = [](gap, std::size_t, std::size_t, std::size_t) {};
constexpr auto plain_slices = [] { return wait_slice; };

}  // namespace

std::uint64_t shm_ring::written() const { return control_->head.load(std::memory_order_acquire); }
std::uint64_t shm_ring::consumed() const { return control_->tail.load(std::memory_order_acquire); }

std::size_t shm_ring::pad_before(std::uint64_t at, std::size_t bytes) const {
  const auto offset = static_cast<std::size_t>(at % capacity_);
  return lendable(bytes) && offset + bytes > capacity_ ? capacity_ - offset : 0;
}

bool shm_ring::fits_now(std::size_t bytes) const { return room() >= pad_before(written(), bytes) + bytes; }

bool shm_ring::write(std::span<const std::span<const std::byte>> pieces, const alive_check& alive,
                     std::chrono::milliseconds stall, std::string* why) {
  auto& c = *control_;
  auto room = [cap = capacity_](std::uint64_t head, std::uint64_t tail) { return cap - (head - tail); };
  auto copy_in = [this](std::span<const std::byte> piece, std::size_t at, std::size_t off, std::size_t n) {
    std::memcpy(data_ + at, piece.data() + off, n);
  };
  auto moved = [&c](std::uint64_t at) {
    c.head.store(at, std::memory_order_release);
    sem_post(&c.data);
  };
  if (writing_.exchange(true, std::memory_order_acquire)) {
    *why = "shared-memory ring " + name_ + ": a second thread wrote while one was writing";
    return false;
  }
  struct done_writing {
    std::atomic<bool>& flag;
    ~done_writing() { flag.store(false, std::memory_order_release); }
  } done{writing_};
  std::size_t total = 0;
  for (auto p : pieces) total += p.size();
  const gap skip[] = {{pad_before(written(), total)}};
  const ring_wait wait{&c.room, budget_now(poll_)};
  return pass(std::span<const gap>(skip), written(), c.tail, capacity_, wait, room, plain_slices, no_copy, moved,
              alive, stall, "room", why) &&
         pass(pieces, written(), c.tail, capacity_, wait, room, plain_slices, copy_in, moved, alive, stall, "room", why);
}

// What the reader may take now. When nothing, and lent records have held the writer for
// held_grace, their owner hears so (the reader then asks again every millisecond).
std::uint64_t shm_ring::available(std::uint64_t cursor, std::uint64_t head) {
  if (head != cursor || !on_held_ || !held_by_lent()) {
    held_since_.reset();
    return head - cursor;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!held_since_) held_since_ = now;
  else if (now - *held_since_ >= held_grace) {
    held_since_.reset();
    on_held_();
  }
  return 0;
}

// The reader's pass: it waits for data, in shorter slices while lent records hold the
// writer. frees: what it passes is the writer's again (not lent), and the writer hears so.
template <class Piece, class Copy>
bool shm_ring::reader_pass(std::span<const Piece> pieces, std::uint64_t at, Copy copy, bool frees,
                           const alive_check& alive, std::chrono::milliseconds stall, std::string* why) {
  auto& c = *control_;
  auto slice = [this] { return held_since_ ? held_grace : wait_slice; };
  auto moved = [&](std::uint64_t to) {
    lending_->moved_to(to);
    if (frees) sem_post(&c.room);
  };
  return pass(pieces, at, c.head, capacity_, ring_wait{&c.data, budget_now(poll_)}, std::bind_front(&shm_ring::available, this),
              slice, copy, moved, alive, stall, "data", why);
}

bool shm_ring::skip_to_record(std::size_t bytes, const alive_check& alive, std::chrono::milliseconds stall,
                              std::string* why) {
  const gap skip[] = {{pad_before(lending_->cursor, bytes)}};
  return reader_pass(std::span<const gap>(skip), lending_->cursor, no_copy, true, alive, stall, why);
}

bool shm_ring::read(std::span<const std::span<std::byte>> into, const alive_check& alive, std::chrono::milliseconds stall,
                    std::string* why) {
  auto copy_out = [this](std::span<std::byte> piece, std::size_t at, std::size_t off, std::size_t n) {
    std::memcpy(piece.data() + off, data_ + at, n);
  };
  return reader_pass(into, lending_->cursor, copy_out, true, alive, stall, why);
}

std::shared_ptr<const std::byte> shm_ring::lend(std::size_t bytes, const alive_check& alive,
                                                std::chrono::milliseconds stall, std::string* why) {
  if (!lendable(bytes) || pad_before(lending_->cursor, bytes) != 0)
    throw bad_request("shared-memory ring: a record of " + std::to_string(bytes) + " bytes cannot be lent here");
  const auto start = lending_->cursor;
  {
    std::lock_guard<std::mutex> guard(lending_->mtx);
    lending_->lent.insert(start);
  }
  const gap record[] = {{bytes}};  // the writer gets nothing back until it returns
  if (!reader_pass(std::span<const gap>(record), start, no_copy, false, alive, stall, why)) {
    lending_->returned(start);
    return nullptr;
  }
  std::shared_ptr<void> loan(nullptr, [book = lending_, start](void*) { book->returned(start); });
  return std::shared_ptr<const std::byte>(loan, data_ + start % capacity_);
}

bool shm_ring::held_by_lent() const {
  std::lock_guard<std::mutex> guard(lending_->mtx);
  const auto head = written();
  return !lending_->lent.empty() && lending_->cursor == head && head - consumed() == capacity_;
}

std::size_t remove_stale_rings() {
  std::size_t removed = 0;
  DIR* dir = ::opendir("/dev/shm");
  if (!dir) return 0;
  const std::string prefix = "actorps-ring-";
  while (auto* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    auto pid = std::strtoul(name.c_str() + prefix.size(), nullptr, 10);
    if (pid == 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
      removed += ::shm_unlink(("/" + name).c_str()) == 0;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace ps

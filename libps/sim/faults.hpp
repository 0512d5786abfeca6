#pragma once
// The fault injector's plan, parsed from --faults=SPEC: a ';'-separated list of
//   kill server=I at=CLOCK    the process hosting shard I ends abruptly (SIGKILL) once its
//                             minimum clock reaches CLOCK
//   kill server=I at=handoff  the process hosting shard I ends abruptly (SIGKILL) once the
//                             shard, asked to hand keys over in a map change, has passed
//                             the change down its chain and before it sends any part
//   kill worker=I at=CLOCK    worker I's process ends abruptly when it ticks to CLOCK
//   slow worker=I factor=F    worker I computes F times slower
//   drop p=P seed=S           each remote request is lost with probability P
//   delay ms=M                each remote request leaves M ms late
//   duplicate p=P seed=S      each remote request is sent twice with probability P
// Pure logic: actors ask the plan what to do; the decisions are seeded, so a run repeats.
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace ps {

struct fault_plan {
  enum class role { server, worker };
  struct kill {
    role who;
    std::uint32_t id;
    std::uint64_t at;
  };
  struct slow {
    std::uint32_t worker;
    double factor;
  };
  std::vector<kill> kills;
  std::vector<slow> slows;
  double drop_p = 0;
  std::uint64_t drop_seed = 0;
  double duplicate_p = 0;
  std::uint64_t duplicate_seed = 0;
  std::uint64_t delay_ms = 0;

  bool empty() const;
  static constexpr std::uint64_t at_handoff = UINT64_MAX;  // kill::at: in its first map change
  // Whether shard `server`'s process is killed in its first map change (at=handoff).
  bool kills_at_handoff(std::uint32_t server) const;
  // The clock at which that member is to be killed, if any (at=handoff: none).
  std::optional<std::uint64_t> kill_clock(role who, std::uint32_t id) const;
  // How many times slower worker w computes (1: not slowed).
  double slow_factor(std::uint32_t w) const;
  // Whether requests need the message faults (drop, duplicate, delay).
  bool touches_messages() const { return drop_p > 0 || duplicate_p > 0 || delay_ms > 0; }
  // Checks ids against the cluster size; throws bad_request naming the clause.
  void check_against(std::size_t servers, std::size_t workers) const;
};

// Throws bad_request naming the clause and what is wrong with it.
fault_plan parse_faults(const std::string& spec);
// The canonical SPEC of a plan (parse_faults(to_string(p)) == p).
std::string to_string(const fault_plan& p);

// Decides, message by message, what the message faults do to one sender's requests.
// Seeded by the plan's seeds and the sender, so each member's sequence repeats.
class message_faults {
 public:
  message_faults(const fault_plan& plan, std::uint64_t sender);
  struct verdict {
    bool drop = false;
    bool duplicate = false;
    std::uint64_t delay_ms = 0;
  };
  verdict next();

 private:
  double drop_p_, duplicate_p_;
  std::uint64_t delay_ms_;
  std::mt19937_64 drop_rng_, duplicate_rng_;
};


}  // namespace ps

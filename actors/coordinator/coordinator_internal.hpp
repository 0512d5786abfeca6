#pragma once
// The coordinator's inside, shared by its files (actors/coordinator/): what a recovery
// reads, the actor's pointer, and the functions each concern offers the others. The
// state is coordinator_state (actors/coordinator.hpp). Not part of the public API.
#include "actors/coordinator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>

#include "libps/observe/cluster_status.hpp"
#include "libps/core/consistency.hpp"
#include "libps/core/handoff.hpp"
#include "libps/observe/text.hpp"

namespace ps::detail {
// What a recovery reads: the checkpoint laid out for the map, its file, the newer files
// refused and why; or why there is none (error).
struct recovery_source {
  std::optional<checkpoint> found;
  std::string path;
  std::vector<std::string> refused;
  std::string error;
};
}  // namespace ps::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::detail::recovery_source>)

namespace ps::coordinator_internal {

using detail::recovery_source;

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;


// Tells the observer an event; without one (a coordinator on its own) prints `text`.
template <class... Event>
void tell(const coordinator_options& opts, const std::string& text, Event&&... event) {
  if (opts.observer)
    caf::anon_send(opts.observer, std::forward<Event>(event)...);
  else
    std::fprintf(stderr, "%s\n", text.c_str());
}

// Asks every head the same question (each answers a number): all(answers), in the heads'
// order, or failed(why) naming a head that did not answer within 5 s ("did not <what>").
template <class... Question>
void ask_heads(self_ptr self, const std::vector<shard_actor>& heads, const std::string& what,
               std::function<void(std::vector<std::uint64_t>)> all, std::function<void(std::string)> failed,
               Question... question) {
  auto answers = std::make_shared<std::vector<std::uint64_t>>(heads.size());
  auto remaining = std::make_shared<std::size_t>(heads.size());
  auto silent = std::make_shared<std::string>();
  auto answered = [=] {
    if (--*remaining > 0) return;
    if (silent->empty()) all(*answers);
    else failed(*silent);
  };
  for (std::size_t i = 0; i < heads.size(); ++i)
    self->request(heads[i], std::chrono::seconds(5), question...)
      .then(
        [=](std::uint64_t answer) {
          (*answers)[i] = answer;
          answered();
        },
        [=](caf::error& e) {
          *silent = "shard " + std::to_string(i) + " did not " + what + " (" + describe(e) + ")";
          answered();
        });
}

// ---- job.cpp

cluster_view make_view(self_ptr self, const coordinator_options& opts);
registration make_registration(self_ptr self, const coordinator_options& opts, std::uint32_t id,
                               encoded_block state = {}, std::uint64_t start_clock = 0);
std::vector<std::uint32_t> live_ids(const coordinator_state& st);
std::vector<shard_actor> live_heads(const coordinator_state& st);
void tell_news(const coordinator_options& opts, const std::string& text);
void tell_members(self_ptr self);
coordinator_record record_of(const coordinator_state& st, const coordinator_options& opts);
void persist(self_ptr self, const coordinator_options& opts);
void carry_out(self_ptr self, const coordinator_options& opts, const job_effects& fx);
caf::result<std::uint64_t> enter_barrier(self_ptr self, const coordinator_options& opts, std::uint32_t worker,
                                         std::uint64_t generation);
void end_job(self_ptr self, const coordinator_options& opts, errc code, const std::string& text,
             bool completed = false);
void write_final_checkpoint(self_ptr self, const coordinator_options& opts, std::uint64_t clock);
void stop_job(self_ptr self, const coordinator_options& opts, errc kind, const std::string& why);
void finish_job(self_ptr self, const coordinator_options& opts);
void go_on(self_ptr self, const coordinator_options& opts);
void worker_finished(self_ptr self, const coordinator_options& opts, std::uint32_t id);
std::string refusal(const coordinator_options& opts, const node_info& info);
std::string member_name(const node_info& info);

// ---- chains.cpp

void tell_map_change(const coordinator_options& opts, bool begins);
void tell_checkpointer(const coordinator_options& opts, const cluster_view& view);
void announce_view(self_ptr self, const coordinator_options& opts, std::function<void()> then = {});
bool serving_leaver(const coordinator_state& st, std::uint32_t id);
bool leavers_copy(const coordinator_state& st, const shard_actor& copy);
void tell_leavers_chains(self_ptr self, const coordinator_options& opts);
void tell_chains(self_ptr self, const coordinator_options& opts);
void deliver_waiting(self_ptr self, const coordinator_options& opts, bool servers_only);
bool copy_failed_while_resuming(self_ptr self, std::uint32_t id, const caf::actor_addr& gone);
std::uint32_t process_of(const coordinator_options& opts, std::uint32_t id, std::uint32_t position);
std::uint32_t grown_position(const coordinator_options& opts, std::uint32_t process);
std::uint32_t process_of_copy(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id,
                              const caf::actor_addr& copy);
std::size_t copies_in_process(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id,
                              std::uint32_t process);
std::optional<std::uint32_t> host_for_copy(const coordinator_options& opts, const coordinator_state& st,
                                           std::uint32_t id);
void grow_on(self_ptr self, const coordinator_options& opts);
std::size_t lasting_copies(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id);
bool can_grow(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id);
void grow_chains(self_ptr self, const coordinator_options& opts);
void chain_grown(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::uint32_t position,
                 const caf::actor& tail, const caf::actor& copy, std::chrono::steady_clock::time_point asked,
                 std::function<void()> next);
void grow_chain(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::uint32_t process,
                std::function<void()> next = {});

// ---- recovery.cpp

void copy_failed(self_ptr self, const coordinator_options& opts, std::uint32_t id, const caf::actor_addr& gone,
                 const std::string& who, const caf::error& reason);
void recover_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                   const caf::error& reason);
void read_recovery_source(self_ptr self, const coordinator_options& opts, const partitioner& map, std::uint32_t dead,
                          std::function<void(std::shared_ptr<const recovery_source>)> then);
void unrecoverable(self_ptr self, const coordinator_options& opts, const std::string& who, const caf::error& reason,
                   const std::string& why);
void shard_failed(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason);
void recover_from(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason, const checkpoint& ckpt, const std::string& source);
encoded_block encoded_state(const checkpoint& c, std::uint32_t shard);
caf::result<registration> join_running_job(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                           const node_info& info);
std::chrono::milliseconds checkpoint_period(const coordinator_options& opts);
void member_down(self_ptr self, const coordinator_options& opts, const caf::down_msg& dm);

// ---- checkpoints.cpp

void propose_cut(self_ptr self, std::vector<shard_actor> heads, std::uint64_t boundary, int attempts,
                 std::function<void(std::uint64_t)> cut, std::function<void(std::string)> failed);
void cut_checkpoint(self_ptr self, std::function<void(std::uint64_t)> cut, std::function<void(std::string)> failed);
void checkpoint_round(self_ptr self, const coordinator_options& opts);
void report_waiting(self_ptr self, const coordinator_options& opts);
caf::result<std::uint64_t> checkpoint_now(self_ptr self, const coordinator_options& opts);
caf::result<std::string> cluster_status(self_ptr self);

// ---- elastic.cpp

void handoff_answered(self_ptr self, const std::shared_ptr<handover_round>& r, std::uint32_t id, std::uint64_t attempt,
                      const std::string& why);
void ask_for_handoff(self_ptr self, const coordinator_options& opts, const std::shared_ptr<handover_round>& r,
                     std::uint32_t id);
void hand_over(self_ptr self, const coordinator_options& opts, const std::vector<std::uint32_t>& ids,
               const cluster_view& view, std::function<void(std::string)> done);
void ask_again_after_failover(self_ptr self, const coordinator_options& opts, std::uint32_t id);
std::string fraction_text(double f);
void begin_change(self_ptr self, const coordinator_options& opts, const std::string& kind, std::uint32_t shard);
void end_change(self_ptr self);
std::pair<errc, std::string> map_change_refusal(const coordinator_state& st);
void when_shards_can_move(self_ptr self, const coordinator_options& opts, std::function<void()> go,
                          std::function<void(std::string)> refused);
void build_joiner_chain(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::function<void()> then);
void hand_to_joiner(self_ptr self, const coordinator_options& opts, const std::string& who,
                    std::vector<std::uint32_t> givers, cluster_view view, double moved);
void admit_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender, const node_info& info,
                 caf::typed_response_promise<registration> rp);
caf::result<registration> join_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                     const node_info& info);
std::optional<std::string> rehoming_needed(const coordinator_options& opts, const coordinator_state& st,
                                           std::uint32_t process);
void stop_if_drained(self_ptr self, const coordinator_options& opts, std::uint32_t id);
std::optional<std::string> last_copy_in_process(const coordinator_options& opts, const coordinator_state& st,
                                                std::uint32_t process);
std::optional<std::string> leaver_holds_last_copy(const coordinator_options& opts, const coordinator_state& st,
                                                  std::uint32_t id);
caf::result<std::string> remove_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id);
void forget_copy(coordinator_state& st, const caf::actor_addr& copy);
void stop_leavers_copies(self_ptr self, std::uint32_t id);
void let_leaver_go(self_ptr self, std::uint32_t id);
void drain_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id,
                 caf::typed_response_promise<std::string> rp);

// ---- registration.cpp

caf::result<registration> register_replica(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                           const node_info& info);
caf::result<registration> park_registration(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                            std::uint32_t id, const std::string& who, bool server,
                                            const std::string& where = "");
caf::result<registration> register_server(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                          const node_info& info);
caf::result<registration> register_worker(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                          const node_info& info);
caf::result<registration> register_member(self_ptr self, const coordinator_options& opts, const node_info& info);
bool leaving_now(const coordinator_state& st, std::uint32_t id);

// ---- resume.cpp

std::vector<std::uint32_t> saved_chain(const coordinator_options& opts, std::uint32_t id);
void assemble_chains(self_ptr self, const coordinator_options& opts);
void finish_resume(self_ptr self, const coordinator_options& opts);
void finish_change(self_ptr self, const coordinator_options& opts);
void go_on_resumed(self_ptr self, const coordinator_options& opts);
void resume_job(self_ptr self, const coordinator_options& opts);
void give_up_absent(self_ptr self, const coordinator_options& opts);
caf::result<registration> rejoin_drained_leaver(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                                std::uint32_t id);
caf::result<registration> rejoin_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                       const node_info& info);
caf::result<registration> rejoin_worker(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                        const node_info& info);
caf::result<registration> rejoin_member(self_ptr self, const coordinator_options& opts, const node_info& info);

// ---- actors/coordinator.cpp

caf::ok_atom worker_done(self_ptr self, const coordinator_options& opts, const worker_result& result);

}  // namespace ps::coordinator_internal

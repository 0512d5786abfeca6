// The coordinator actor: membership, barriers, the job's end, chains, recovery,
// checkpoints, elastic changes and resuming, each in its file under actors/coordinator/;
// here its behaviour, which hands each message to the concern it belongs to.
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps {
namespace coordinator_internal {

// A worker's end: its result is kept (saved for a resume) and it leaves; one sent again
// after a restart is acknowledged and changes nothing.
caf::ok_atom worker_done(self_ptr self, const coordinator_options& opts, const worker_result& result) {
  auto& st = self->state;
  if (!st.core.record_result(result.worker, result.ok, result.json)) return caf::ok_atom::value;
  tell(opts, "worker " + std::to_string(result.worker) + " finished: " + result.json, done_atom::value, result);
  worker_finished(self, opts, result.worker);
  return caf::ok_atom::value;
}

}  // namespace coordinator_internal

using namespace coordinator_internal;

coordinator_actor::behavior_type coordinator(self_ptr self, coordinator_options opts) {
  self->state.core = coordinator_core(opts.servers, opts.workers, opts.replication);
  if (opts.checkpoint_seconds > 0 && opts.checkpointer)
    self->delayed_send(self, checkpoint_period(opts), checkpoint_atom::value);
  if (opts.wait_report.count() > 0 && !opts.resume) self->delayed_send(self, opts.wait_report, wait_report_atom::value);
  self->set_down_handler([=](caf::down_msg& dm) { member_down(self, opts, dm); });
  if (opts.resume) resume_job(self, opts);
  return {
    [=](register_atom, node_info& info) { return register_member(self, opts, info); },
    [=](end_atom) { self->quit(self->state.end_reason); },
    [=](barrier_atom, std::uint32_t worker, std::uint64_t generation) {
      return enter_barrier(self, opts, worker, generation);
    },
    [=](rejoin_atom, const node_info& info) { return rejoin_member(self, opts, info); },
    [=](rejoin_atom) { give_up_absent(self, opts); },
    [=](report_atom, std::uint32_t worker, const std::string& text) {
      tell(opts, "worker " + std::to_string(worker) + ": " + text, report_atom::value, worker, text);
    },
    [=](loss_atom, const update_loss& loss) {
      tell(opts, describe(loss, "shard " + std::to_string(loss.shard)), loss_atom::value, loss);
    },
    [=](checkpoint_atom) { checkpoint_round(self, opts); },
    [=](wait_report_atom) { report_waiting(self, opts); },
    [=](checkpoint_now_atom) { return checkpoint_now(self, opts); },
    [=](status_atom) { return cluster_status(self); },
    [=](remove_shard_atom, std::uint32_t id) { return remove_shard(self, opts, id); },
    [=](idle_atom, std::uint32_t shard, std::uint32_t worker) {
      auto it = self->state.draining_clients.find(shard);
      if (it == self->state.draining_clients.end()) return;
      it->second.erase(worker);
      stop_if_drained(self, opts, shard);
    },
    [=](view_atom, std::uint32_t worker) {
      auto& st = self->state;
      auto sub = caf::actor_cast<client_actor>(self->current_sender());
      if (!sub) return;
      st.view_subscribers.push_back(sub);
      st.subscriber_workers[sub.address()] = worker;
      if (st.epoch > 1) caf::anon_send(sub, view_atom::value, make_view(self, opts));  // missed one
    },
    [=](done_atom, const worker_result& result) { return worker_done(self, opts, result); },
    [=](stop_atom, std::uint8_t code, std::string& why) -> caf::result<caf::ok_atom> {
      auto kind = static_cast<errc>(code);
      if (kind != errc::stopped && kind != errc::interrupted && kind != errc::terminated && kind != errc::job_failed)
        return make_ps_error("coordinator: stop with code " + std::to_string(code) + " (expected stopped, "
                             "interrupted, terminated or job_failed)");
      auto rp = self->make_response_promise<caf::ok_atom>();
      rp.deliver(caf::ok_atom::value);
      stop_job(self, opts, kind, why);
      return rp;
    },
  };
}

}  // namespace ps

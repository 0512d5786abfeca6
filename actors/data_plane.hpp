#pragma once
// The bulk data path beside CAF: one per process (psnode server and worker roles). It
// listens on its own TCP port; a worker's client connects to the plane of each server
// process it talks to (learned with data_atom) and the connection carries large value
// blocks both ways, as libps/net/bulk.hpp frames. CAF messages still carry every request
// and reply, with a float_block that names its payload instead of holding it, so
// ordering, timeouts, monitoring and failover stay CAF's.
//
// Why: CAF 0.17 copies each byte five times on its way between two actors (serialize,
// kernel send, kernel receive, BASP worker, deserialize), plus a zero-fill; a frame here
// is written from the block and read into the block (two copies, both in the kernel).
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <set>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/invoke_message_result.hpp>
#include <caf/mailbox_element.hpp>

#include "actors/message_frames.hpp"
#include "actors/messages.hpp"
#include "actors/transport.hpp"
#include "actors/write_batch.hpp"
#include "libps/net/bulk.hpp"
#include "libps/net/busy_poll.hpp"
#include "libps/net/secret.hpp"
#include "libps/net/shm_ring.hpp"
#include "libps/net/tcp_congestion.hpp"

#include <sys/uio.h>

namespace ps {

struct data_plane_frame;  // a payload on its way out (actors/plane/plane_internal.hpp)

// Where a data plane listens and what it announces (the same host on one machine; across
// hosts the bind address may be every interface and the announced one the route's).
struct data_plane_address {
  data_plane_address(const char* host) : bind_host(host), advertised_host(host) {}
  data_plane_address(const std::string& host) : bind_host(host), advertised_host(host) {}
  data_plane_address(std::string bind, std::string advertised, std::uint16_t port_wanted)
      : bind_host(std::move(bind)), advertised_host(std::move(advertised)), port(port_wanted) {}
  std::string bind_host, advertised_host;
  std::uint16_t port = 0;  // 0: any free port
};

// The socket transport ("tcp", and "shm" with rings): see transport.hpp for the calls
// the actors make; what follows documents how this one does them.
class data_plane : public transport {
 public:
  // Listens at `at`. Blocks of at least min_bytes go over data connections;
  // claims wait at most claim_timeout for their payload; a write that makes no progress
  // for stall_timeout fails (the block then goes inline through CAF). Throws
  // bad_request when it cannot listen. With a secret, every connection proves it both ways
  // (libps/net/secret.hpp) before any frame is read from it. ring_bytes > 0: each side of a
  // connection offers the other a ring of that size in shared memory (libps/net/shm_ring.hpp)
  // once the connection is proven; a peer on the same host maps it and says so, and
  // payloads then go through the ring while the connection carries their headers (and
  // tells when either side dies). A peer elsewhere cannot map it: payloads stay on TCP.
  // 0: no rings offered, none taken. busy_poll: how long a connection's reader polls its
  // socket for the next frame, and a ring's side the other side, before it sleeps (0: it
  // sleeps at once), while no other thread wants its vCPU and while this process and its
  // peers on this host fit its CPUs (libps/net/busy_poll.hpp). tcp_congestion: the congestion
  // control of its ends of connections (libps/net/tcp_congestion.hpp; "system": the host's);
  // a socket that refuses it stays on the host's, with a warning.
  data_plane(const data_plane_address& at, std::uint64_t min_bytes, std::chrono::milliseconds claim_timeout,
             std::chrono::milliseconds stall_timeout, std::optional<shared_secret> secret = std::nullopt,
             std::size_t ring_bytes = 0, std::chrono::microseconds busy_poll = std::chrono::microseconds(0),
             std::string tcp_congestion = host_tcp_congestion);
  ~data_plane() override;
  // The plane, shared, for owners that may let go of it last on one of the plane's own
  // threads (an actor that a reader ran ends there, and with it its state's share): its
  // destructor joins those threads, so it then runs on a thread of its own instead.
  static std::shared_ptr<data_plane> shared(std::unique_ptr<data_plane> plane);
  // The plane the settings describe, shared, with messages enabled when they say so;
  // rings: it offers shared-memory rings of settings.ring_bytes (the "shm" transport).
  static std::shared_ptr<transport> make(const transport_settings& settings, bool rings);
  data_plane(const data_plane&) = delete;
  data_plane& operator=(const data_plane&) = delete;

  // This process's identity on data connections (random, nonzero).
  std::uint64_t token() const override { return token_; }
  const std::string& host() const override { return host_; }  // the announced host
  std::uint16_t port() const override { return port_; }
  std::uint64_t min_bytes() const override { return min_bytes_; }
  bool connect_blocks() const override { return true; }  // it resolves names and dials

  // Opens a connection to the plane at host:port whose token is peer (once; later calls
  // for a connected peer return true at once). False with *why on failure.
  bool connect(std::uint64_t peer, const std::string& host, std::uint16_t port, std::string* why) override;
  // Queues the block's floats for peer and returns a block that names them, or nothing
  // when the block is below min_bytes, holds no storage, there is no connection to peer
  // or it broke (the caller then sends the block itself). The connection's writer
  // thread writes them (a handler never waits on a socket); should that write fail, the
  // connection ends and the receiver's claim fails naming it.
  std::optional<float_block> offload(std::uint64_t peer, const float_block& block) override;
  // The same for values lying in several places (a shard's segments, the pieces of a
  // caller's buffer), written straight from there; count is their total, and `keep`
  // holds them alive and unchanged until written. Nothing, too, when they are not worth
  // it (in_pieces): copy them first.
  std::optional<float_block> offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                     std::uint64_t count, std::shared_ptr<const void> keep) override;
  // The same with the ticket the receiver chose (a pull's seq, see expect).
  std::optional<float_block> offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                     std::uint64_t count, std::uint64_t ticket,
                                     std::shared_ptr<const void> keep) override;
  // A buffer of n floats from the plane's pool (contents unspecified: no zero-fill, and
  // warm pages once reused), for values copied out to be offloaded.
  std::shared_ptr<std::vector<float>> buffer(std::size_t n) override { return buffers_->get(n); }
  // A pool buffer holding a copy of n floats (a lent block's, for a claimer that keeps it).
  std::shared_ptr<std::vector<float>> copied(const float* from, std::size_t n) override;
  // Payload `ticket` from peer, when it comes, is read straight into `into` (kept alive
  // by `keep`) instead of a buffer, if its size fits; its claim then gives a block
  // without storage. For answers whose destination is known before they are asked for.
  void expect(std::uint64_t peer, std::uint64_t ticket, std::vector<std::span<float>> into,
              std::shared_ptr<const void> keep) override;
  // Withdraws the expectation: the memory it named is left alone from now on (if the
  // payload is being read into it, this waits until that ends). Call it before the
  // memory is used or freed, whichever way the answer came.
  void forget(std::uint64_t peer, std::uint64_t ticket) override;
  // A block with its values: itself if it holds them, else its payload, waited for
  // (without storage if it landed where expect said). Throws bad_request naming the
  // payload and what went wrong. Blocks: for threads of their own; an actor asks its
  // payload_claimer (below), which uses try_claim and when_claimable.
  float_block claim(const float_block& block) override;
  // claim without waiting: nothing while the payload is still on its way. lent_ok: a
  // payload that came through a shared-memory ring may stay there (the block's `lent`),
  // for a claimer that is done with it at once (a shard adding a push): its peer's
  // writer waits for that room, so such a block must not be kept.
  std::optional<float_block> try_claim(const float_block& block, bool lent_ok = false) override;
  // From now on ring payloads nobody expected stay in their ring until claimed, rather
  // than being copied out on arrival: for a process whose claimers take them in place (a
  // shard's). A claimer that does not ask for that gets them copied at its claim.
  void lend_ring_payloads() override { lend_ = true; }
  // Calls ready once the block's payload landed or its connection ended (at once if
  // either happened already); ready runs on the plane's reader thread.
  void when_claimable(const float_block& block, std::function<void()> ready) override;
  std::chrono::milliseconds claim_timeout() const override { return claim_timeout_; }
  // The name of the connection whose token is origin, for errors.
  std::string origin_name(std::uint64_t origin) const override;

  // Messages between actors over data connections, off CAF's broker (docs/wire-and-caf.md,
  // "Requests over the data connections": a small request and its answer cross two
  // threads fewer in each process).
  // After enable_messages, a local actor that serve()s takes messages from the proxies
  // peers hold of it, and proxy() is this side's stand-in for an actor of a connected
  // peer: what is sent to it goes on the connection as a message frame (in order with
  // the connection's payloads) and its answers come back the same way. A request whose
  // connection ends before its answer came is answered with errc::unsent.
  void enable_messages(caf::actor_system& sys);
  bool messages_enabled() const override { return sys_ != nullptr; }
  // Peers may send `local` the messages `allowed` accepts (the others are refused,
  // requests with an error).
  void serve(const caf::strong_actor_ptr& local, message_filter allowed) override;
  // The stand-in for actor `remote` (of node `node`) in the process whose token is peer:
  // null without messages enabled or a connection to peer. Its address is the actor's
  // own, so it compares equal to CAF's proxy of that actor.
  caf::strong_actor_ptr proxy(std::uint64_t peer, caf::actor_id remote, const caf::node_id& node) override;
  // Whether the connected peer said it takes messages, waiting at most `within` for it
  // (its word crosses the connection once, after the hello).
  bool takes_messages(std::uint64_t peer, std::chrono::milliseconds within);
  // Writes x for actor `target` of process `peer` (a proxy's enqueue): false when there
  // is no connection to peer or it broke.
  bool send_message(std::uint64_t peer, caf::actor_id target, caf::mailbox_element& x);
  // Messages written to and read from data connections so far.
  std::uint64_t messages_sent() const { return messages_sent_; }
  std::uint64_t messages_received() const { return messages_received_; }
  // Writes of frames on sockets so far (a write_batch makes one of many frames).
  std::uint64_t socket_writes() const { return socket_writes_; }
  // Of all writes, those left to a connection's writer thread (each a wake-up of it):
  // what the sending thread could not write without waiting.
  std::uint64_t writer_thread_writes() const { return writer_thread_writes_; }
  // Actors that reader threads ran themselves (inline_runner): each time one of them
  // took the messages a burst read from its connection had for it.
  std::uint64_t reader_runs() const { return reader_runs_; }
  // Reads of frames that found their bytes while the reader polled (busy_poll): each a
  // sleep and a wake-up saved.
  std::uint64_t polled_reads() const { return polled_reads_; }
  // Connections whose reader thread is not waiting for bytes (lingering write batches
  // count on them; tests wait for 0).
  std::size_t readers_awake() const;
  // The poll budget in effect: busy_poll, or 0 while this process and the peers it is
  // connected to on this host are more than its CPUs.
  std::chrono::microseconds poll_budget_now() const { return budget_now(poll_budget_); }
  // Whether this process and its peers on its host outnumber the host's CPUs now
  // (libps/net/host_share.hpp): clients then keep fewer bytes in flight.
  bool host_crowded() const override { return crowded_.load(std::memory_order_relaxed); }
  // Whether payloads to peer go through a shared-memory ring (the peer mapped ours).
  bool sends_by_ring(std::uint64_t peer) const override;
  // The process whose token is origin is gone (a shard there went down): claims of its
  // payloads fail now (payload_lost), unless a connection from it stands (its end tells).
  // A later connection from it opens it again.
  void origin_gone(std::uint64_t origin, const std::string& why) override;
  // Whether it has connections and payloads go through a shared-memory ring on each.
  bool sends_by_ring_to_all() const override;
  // The TCP congestion control of each connection this plane accepted (true) or opened
  // (false), as the kernel reports it (tests: what tcp_congestion did).
  std::vector<std::string> congestion_controls(bool accepted) const;
  // From now on a connection that ends says nothing: the process printed its status line,
  // which must stay its last, while the plane lives on with the actors that share it.
  void quiet() override { quiet_ = true; }
  transport_counters counters() const override;
  // Requests sent over data connections whose answers have not come.
  std::size_t requests_unanswered() const;

  // Payload bytes handed to and read from data connections so far.
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  std::uint64_t bytes_received() const { return bytes_received_; }
  // Of bytes_sent, those that went through shared-memory rings.
  std::uint64_t shm_bytes_sent() const { return shm_bytes_sent_; }
  // Of the payloads sent through rings, those whose header went first, their floats
  // following while the receiver copies them out: answers larger than
  // stream_answers_above (their receiver copies them into place) and payloads larger than
  // the ring's room.
  std::uint64_t streamed_payloads() const { return streamed_payloads_; }
  // Answers (offloaded under the receiver's ticket) larger than this stream through a ring
  // behind their header, so that the receiver copies one slice out while this side copies
  // the next in; smaller ones go in before it, one wake-up of the receiver. By default 4
  // MiB answers (pulls' chunks) stream and 1 MiB ones do not: bench_ring_answer, which
  // compares both ways, had 4 MiB at 0.65-1.02 of the time and 1 MiB at 0.97-1.05. The
  // largest value: none streams.
  static constexpr std::uint64_t default_streamed_above = 2u << 20;
  void stream_answers_above(std::uint64_t bytes) { streamed_above_ = bytes; }

 private:
  // offload's body: `expected` when the receiver chose the ticket (it reads the payload
  // straight into its destination, copying it out of a ring as it comes).
  std::optional<float_block> offload_frame(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                           std::uint64_t count, std::uint64_t ticket, std::shared_ptr<const void> keep,
                                           bool expected);
  friend class write_batch;
  using connection = plane_connection;
  void accept_loop();
  void read_loop(std::shared_ptr<connection> c);
  // Fills pieces with a payload's next bytes (from the socket or the peer's ring).
  using payload_source = std::function<bool(iovec*, std::size_t, std::string*)>;
  bool read_payload(const payload_source& from, std::uint64_t bytes, std::shared_ptr<std::vector<float>>& values,
                    std::string* why);
  void read_frames(const std::shared_ptr<connection>& c, std::string* why);
  bool land(const std::shared_ptr<connection>& c, const bulk_header& h, std::string* why);
  // A ring payload nobody expected: lent in place when the ring allows, else copied out.
  bool land_from_ring(const std::shared_ptr<connection>& c, const bulk_header& h, const payload_source& from,
                      landed_values& values, std::string* why);
  float_block as_block(landed_values values, std::uint64_t size, bool lent_ok);
  // Shared memory: offers c a ring of ours; maps the ring the peer offered and says so.
  // offer_ring: false when none was offered.
  bool offer_ring(const std::shared_ptr<connection>& c);
  void take_ring(const std::shared_ptr<connection>& c, const bulk_header& h);
  void ring_answer(const std::shared_ptr<connection>& c, const bulk_header& h);
  // "" while c stands, else why it does not (a ring's wait asks between slices).
  std::string gone(const connection& c) const;
  bool write_ring_payload(const std::shared_ptr<connection>& c, const data_plane_frame& frame, std::string* why);
  bool write_plain(const std::shared_ptr<connection>& c, std::span<const data_plane_frame> frames, std::string* why);
  bool into_ring(const std::shared_ptr<connection>& c, const data_plane_frame& frame, const shm_ring::alive_check& alive,
                 std::string* why);
  void write_loop(std::shared_ptr<connection> c);
  bool send_or_queue(const std::shared_ptr<connection>& c, data_plane_frame frame);
  // send_or_queue while a write_batch is open on this thread: queued and held.
  // tcp_congestion on a socket not yet connected (a warning, once, if it is refused).
  void set_congestion(int fd);
  bool hold_in_batch(write_batch& batch, const std::shared_ptr<connection>& c, data_plane_frame frame);
  // Writes what waits in c's queue, without waiting: plain frames in as few sendmsg calls
  // as they take, ring payloads the ring has room for; the writer thread gets the rest.
  // Each takes the lock held on c's out_mtx and gives it back locked; a write that fails
  // drops c. The parts say whether all they took went out.
  void flush_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock);
  bool plain_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock,
                     std::vector<data_plane_frame>& frames);
  bool ring_front_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock);
  // write_at_once of a frame nothing queued precedes, with c's lock let go meanwhile (and
  // given back locked). Nothing: the write failed and c was dropped; false: the frame's
  // rest went to the front of the queue, the writer thread's.
  std::optional<bool> write_front_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock,
                                          data_plane_frame& frame, bool by_ring);
  // A batch lets go of c: the last holder writes what waits.
  void release(const std::shared_ptr<connection>& c);
  // A lingering batch lets go of c: what waits stays (c held for it) while c's reader is
  // awake or answers to requests already written on c are due (its reader then wakes for
  // them); else it is written as release would. True when something lingers on c (this
  // batch's or another's), which flush_lingering then ends.
  bool linger(const std::shared_ptr<connection>& c);
  // Whether c has requests written and not answered (c's out_mtx held).
  static bool answers_due(connection& c);
  // Ends c's linger, if it has one: the last holder writes what waits.
  void unlinger(const std::shared_ptr<connection>& c);
  // c's reader is about to wait for bytes: it sleeps from now on, as far as lingering
  // batches go, and writes what lingers.
  void reader_waits(const std::shared_ptr<connection>& c);
  std::optional<bool> write_at_once(const std::shared_ptr<connection>& c, data_plane_frame& frame, bool by_ring);
  // Tells the peer this side takes messages (a message frame without a body).
  void announce_messages(const std::shared_ptr<connection>& c);
  // The live connection to peer, if any.
  std::shared_ptr<connection> connection_to(std::uint64_t peer) const;
  // A message frame: read, checked against what its target serves, and delivered (an
  // idle target is woken through runner: the reader's inline_runner, or the scheduler).
  bool deliver(const std::shared_ptr<connection>& c, const bulk_header& h, caf::execution_unit* runner,
               std::string* why);
  void deliver_message(const std::shared_ptr<connection>& c, const message_envelope& envelope, caf::message content,
                       caf::execution_unit* runner);
  // Requests sent on c and not yet answered are answered with errc::unsent.
  void fail_unanswered(connection& c, const std::string& why);
  void add(std::shared_ptr<connection> c);
  // Counts c's peer among those on this host (delta +1 or -1) if it is one, and sets the
  // poll budget for the count. Under mtx_.
  void count_peer_here(connection& c, int delta);
  void drop(const std::shared_ptr<connection>& c, const std::string& why);
  // Joins the threads of ended connections and closes their descriptors.
  void reap();

  std::string host_;
  std::uint16_t port_ = 0;
  std::uint64_t token_ = 0;
  std::uint64_t min_bytes_;
  std::chrono::milliseconds claim_timeout_;
  std::chrono::milliseconds stall_timeout_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> quiet_{false};  // quiet()
  std::atomic<std::uint64_t> next_ticket_{1};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
  std::atomic<std::uint64_t> shm_bytes_sent_{0};
  std::atomic<std::uint64_t> streamed_payloads_{0};
  std::atomic<std::uint64_t> streamed_above_{default_streamed_above};
  std::size_t ring_bytes_ = 0;  // of each ring we offer (0: none)
  std::atomic<bool> lend_{false};
  payload_store store_;
  struct expectation {
    std::vector<std::span<float>> into;
    std::shared_ptr<const void> keep;
  };
  std::map<std::pair<std::uint64_t, std::uint64_t>, expectation> expected_;  // by (peer, ticket); under mtx_
  std::set<std::pair<std::uint64_t, std::uint64_t>> landing_;                // being read into place; under mtx_
  std::condition_variable landed_;
  std::shared_ptr<buffer_pool> buffers_;  // payloads are read into these
  mutable std::mutex mtx_;
  std::vector<std::shared_ptr<connection>> conns_;  // by peer token (0 until its hello)
  std::vector<std::shared_ptr<connection>> dead_;   // ended; reap() closes them once their threads are done
  std::thread acceptor_;
  std::optional<shared_secret> secret_;
  // Messages (enable_messages): the system they are read in, the actors served, by id,
  // and the proxies made, by (peer, actor id).
  caf::actor_system* sys_ = nullptr;
  struct served_actor {
    caf::weak_actor_ptr actor;
    message_filter allowed;
  };
  std::map<caf::actor_id, served_actor> served_;  // under mtx_
  std::map<std::pair<std::uint64_t, caf::actor_id>, caf::strong_actor_ptr> proxies_;  // under mtx_
  std::shared_ptr<plane_link> link_;
  std::atomic<std::uint64_t> messages_sent_{0};
  std::atomic<std::uint64_t> messages_received_{0};
  std::atomic<std::uint64_t> socket_writes_{0};
  std::atomic<std::uint64_t> writer_thread_writes_{0};
  std::atomic<std::uint64_t> reader_runs_{0};
  std::chrono::microseconds busy_poll_;
  std::string tcp_congestion_;
  std::atomic<bool> congestion_warned_{false};  // a refusing socket is told of once
  unsigned cpus_;  // the host's
  std::shared_ptr<std::atomic<std::int64_t>> poll_budget_;  // what readers and rings poll with now
  std::size_t peers_here_ = 0;                               // connections to this host; under mtx_
  std::atomic<bool> crowded_{false};                         // host_crowded(peers_here_, cpus_)
  std::atomic<std::uint64_t> polled_reads_{0};
};

}  // namespace ps

// A server process told to stop (SIGTERM, as a scheduler sends before it kills) while its
// job runs on: its shard leaves the job as `psctl remove-shard` makes one leave.
#include "runtime/node_parts.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

namespace ps {

namespace {

// The shard's id, from its own figures (0 and why when it does not answer).
std::uint32_t shard_id_of(caf::scoped_actor& self, const shard_actor& shard, std::string& why) {
  std::uint32_t id = 0;
  self->request(shard, std::chrono::seconds(5), stats_atom::value)
    .receive([&](std::string& figures) { id = nlohmann::json::parse(figures).at("shard").get<std::uint32_t>(); },
             [&](caf::error& e) { why = "the shard did not say its id: " + describe(e); });
  return id;
}

}  // namespace

std::string remove_shard_when_settled(caf::scoped_actor& self, const coordinator_actor& coord, std::uint32_t id,
                                      std::chrono::seconds patience, std::string* done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::string why;
    errc code = errc::failed;
    self->request(coord, std::chrono::seconds(600), remove_shard_atom::value, id)
      .receive([&](std::string& summary) { *done = std::move(summary); },
               [&](caf::error& e) { why = describe(e), code = code_of(e); });
    if (code != errc::busy || std::chrono::steady_clock::now() - start > patience) return why;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the coordinator sends no notice when a change ends
  }
}

std::string drain_server(caf::scoped_actor& self, const coordinator_actor& coord, const shard_actor& shard,
                         json_line& line, errc stop_code) {
  std::string why;
  const auto id = shard_id_of(self, shard, why);
  if (why.empty()) {
    std::fprintf(stderr, "server: stop signal: shard %u leaves the job (its keys and rows go to the others)\n", id);
    // A leave moves the shard's whole state: as long as psctl remove-shard allows it. A
    // refusal for now (another shard joining or leaving, a rolling update's previous
    // server) is asked again for 8 s, within the schedulers' 30 s grace.
    std::string done;
    why = remove_shard_when_settled(self, coord, id, std::chrono::seconds(8), &done);
    if (why.empty()) line["drained"] = done;
    line["shard"] = id;
  }
  if (why.empty()) return "";
  // It cannot leave (the last shard, the last copy of another): the job stops as on the
  // coordinator's own SIGTERM, with a final checkpoint, and this shard ends with it.
  auto reason = "a server got a stop signal and its shard cannot leave the job (" + why + ")";
  std::fprintf(stderr, "server: %s; asking the coordinator to stop the job\n", reason.c_str());
  self->request(coord, std::chrono::seconds(15), stop_atom::value, static_cast<std::uint8_t>(stop_code), reason)
    .receive([](caf::ok_atom) {}, [&](caf::error& e) { reason += "; the coordinator did not take the stop: " + describe(e); });
  return reason;
}

}  // namespace ps

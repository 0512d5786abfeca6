#pragma once
// The in-memory transport ("memory"): members of one process hand each other payloads by
// copying them, on the sender's thread, into the receiver's store (or straight into the
// memory the receiver expected them in). A payload has thus landed before the message that
// names it is sent, so claims never wait and a run on CAF's deterministic scheduler stays
// deterministic; tokens are numbered in order of creation. Members find each other through
// a fabric named by their host (transport_settings::advertised_host): members of different
// fabrics, like processes on different hosts without a route, cannot connect. Requests are
// not carried (in one process CAF delivers them without a network).
//
// Why: the simulator and the protocol tests then run the path production takes by default
// (blocks named in messages, claimed, landing in place, payloads of a member that died)
// without sockets or threads.
#include <memory>

#include "actors/transport.hpp"

namespace ps {

std::shared_ptr<transport> make_memory_transport(const transport_settings& settings);

}  // namespace ps

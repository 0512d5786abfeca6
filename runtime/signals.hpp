#pragma once
// SIGINT and SIGTERM on a process that runs a job: the handler only records the signal;
// the launcher's and the coordinator role's loops see it and stop the job through the
// coordinator, so every member hears why and the job ends with "status":"stopped".
#include <chrono>

namespace ps {

void catch_stop_signals();
// Puts back the handlers catch_stop_signals replaced: a process that goes on after its job
// (the Python module's) gets its own Ctrl-C back.
void restore_stop_signals();
// The signal caught (SIGINT or SIGTERM), 0 when none.
int stop_signal();
// A stop signal came at least `age` ago (a member's grace before it leaves alone: a
// scheduler stopping the whole job signals every member at once, and the coordinator's
// stop then ends it first).
bool stop_signal_older_than(std::chrono::milliseconds age);

// Once a program has printed its last line, tearing down its actor system may still wait
// on a peer it cannot reach (seen once in CI: a worker of the netns test, its job done,
// still alive 80 s after a link cut). From now on the process exits with `status` within
// `limit` at the latest, saying so on stderr.
void bound_teardown(int status, int limit_seconds);

}  // namespace ps

#pragma once
// SIGINT and SIGTERM on a process that runs a job: the handler only records the signal;
// the launcher's and the coordinator role's loops see it and stop the job through the
// coordinator, so every member hears why and the job ends with "status":"stopped".
namespace ps {

void catch_stop_signals();
// The signal caught (SIGINT or SIGTERM), 0 when none.
int stop_signal();

}  // namespace ps

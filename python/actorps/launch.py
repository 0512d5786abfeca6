"""python3 -m actorps.launch [job flags] SCRIPT [script args]: runs SCRIPT as a job.

SCRIPT calls actorps.run(...) and is the whole job: with no --role it is a local cluster
whose servers and workers are copies of SCRIPT (processes on this host, the default, or
--cluster=embedded); with --role=coordinator|server|worker and --coordinator=HOST:PORT it
is one member of a job across hosts. The job flags (--servers=2 --workers=2, ...) are
handed to it, before its own arguments. Exits with the job's status.
"""
import os
import subprocess
import sys


def split_args(argv):
    """(job flags, script, script args) from the launcher's arguments."""
    for i, a in enumerate(argv):
        if not a.startswith("-"):
            return argv[:i], a, argv[i + 1:]
    raise SystemExit("usage: python3 -m actorps.launch [--servers=N --workers=N ...] SCRIPT [ARGS...]")


def main(argv=None):
    flags, script, rest = split_args(list(sys.argv[1:] if argv is None else argv))
    if not os.path.isfile(script):
        raise SystemExit(f"actorps.launch: no script {script}")
    return subprocess.call([sys.executable, os.path.abspath(script)] + flags + rest)


if __name__ == "__main__":
    sys.exit(main())

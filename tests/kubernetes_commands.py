#!/usr/bin/python3
"""The commands of deploy/kubernetes/actorps.yaml's containers, checked and made runnable
here, so the test that plays Kubernetes' part runs exactly what the manifests say.

Checks (exit 1 naming each): the secret is mounted with defaultMode 0400 and given as
--secret-file; every probe asks /healthz or /readyz on the container's --health-port; the
servers and workers dial COORDINATOR_POD.SERVICE:PORT (the coordinator StatefulSet's pod 0,
the headless Service, its port, the coordinator's --port); servers advertise
$(POD_NAME).SERVICE; the coordinator keeps --state-dir on its volume, steps down on SIGTERM
and resumes when a saved job is there.

usage: kubernetes_commands.py MANIFEST ROLE POD FROM=>TO...
  prints ROLE's (coordinator|server|worker) command as one shell line, with $(POD_NAME)
  set to POD and each FROM replaced by TO (paths, the binary's directory)."""
import shlex
import sys

try:
    import yaml
except ImportError:
    print("SKIP: needs python3-yaml")
    sys.exit(77)


def flag(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def container_args(doc):
    c = doc["spec"]["template"]["spec"]["containers"][0]
    words = c.get("command", []) + c["args"]
    if words[:2] == ["/bin/sh", "-c"]:
        return c, words, shlex.split(words[2].split("$(")[0])  # the flags before the shell's own part
    return c, words, words


def check(docs):
    problems = []
    service = next(d for d in docs if d["kind"] == "Service")
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("StatefulSet", "Job")}
    coord_set = next(n for n, d in sets.items() if "coordinator" in n)
    port = service["spec"]["ports"][0]["port"]
    address = f"{coord_set}-0.{service['metadata']['name']}:{port}"
    for name, d in sets.items():
        pod = d["spec"]["template"]["spec"]
        c, _, args = container_args(d)
        mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
        secret = next(v for v in pod["volumes"] if "secret" in v)
        if secret["secret"].get("defaultMode") != 0o400:
            problems.append(f"{name}: the secret's defaultMode is not 0400")
        if not (flag(args, "secret-file") or "").startswith(mounts[secret["name"]] + "/"):
            problems.append(f"{name}: --secret-file is not on the secret's mount")
        health = flag(args, "health-port")
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            got = c.get(probe, {}).get("httpGet", {})
            if got.get("path") != path or str(got.get("port")) != health:
                problems.append(f"{name}: {probe} is not {path} on --health-port={health}")
        if name == coord_set:
            if flag(args, "port") != str(port):
                problems.append(f"{name}: --port is not the Service's {port}")
            if flag(args, "state-dir") != mounts.get("state") or flag(args, "on-sigterm") != "step-down":
                problems.append(f"{name}: needs --state-dir on its volume and --on-sigterm=step-down")
            if "--resume" not in c["args"][0]:
                problems.append(f"{name}: does not resume a saved job")
        elif flag(args, "coordinator") != address:
            problems.append(f"{name}: --coordinator is not {address}")
        if "server" in name and flag(args, "advertise") != f"$(POD_NAME).{service['metadata']['name']}":
            problems.append(f"{name}: servers must advertise their DNS name")
    return problems


def main():
    manifest, role, pod = sys.argv[1:4]
    docs = list(yaml.safe_load_all(open(manifest)))
    problems = check(docs)
    if problems:
        sys.exit("\n".join(f"{manifest}: {p}" for p in problems))
    doc = next(d for d in docs if d["kind"] in ("StatefulSet", "Job") and role in d["metadata"]["name"])
    _, words, _ = container_args(doc)
    line = shlex.join(words) if words[:2] != ["/bin/sh", "-c"] else "/bin/sh -c " + shlex.quote(words[2])
    line = line.replace("$(POD_NAME)", pod)
    for pair in sys.argv[4:]:
        old, new = pair.split("=>", 1)
        line = line.replace(old, new)
    print(line)


main()

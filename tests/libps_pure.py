#!/usr/bin/python3
"""The pure part of libps (the ps_logic target) does no I/O: it links nothing but the
kernels (and header-only nlohmann_json), and its objects call no file, socket, mmap,
process, thread-creating, RocksDB, OpenSSL or zlib function. Exits 1 naming each.
usage: libps_pure.py LIBPS_LOGIC_A LINK_LIBRARIES_FILE"""
import re
import subprocess
import sys

ALLOWED_LINKS = {"ps_kernels", "nlohmann_json::nlohmann_json"}
# Whole C names, and prefixes of C++ ones (demangled).
BANNED_C = {"open", "open64", "openat", "fopen", "fopen64", "read", "write", "pread", "pwrite", "close", "mmap",
            "mmap64", "munmap", "socket", "connect", "bind", "listen", "accept", "accept4", "send", "sendmsg", "recv",
            "recvmsg", "setsockopt", "getaddrinfo", "kill", "getpid", "fork", "syscall", "pthread_create", "statfs",
            "statvfs", "unlink", "rename", "fsync", "crc32", "deflate", "inflate", "compress2", "uncompress",
            "RAND_bytes", "HMAC"}
BANNED_PREFIX = ("rocksdb::", "std::thread", "std::filesystem::", "std::basic_ifstream", "std::basic_ofstream",
                 "std::basic_fstream", "std::basic_filebuf", "EVP_", "SSL_", "gz", "deflate", "inflate")


def undefined(lib):
    out = subprocess.run(["nm", "-C", "--undefined-only", lib], capture_output=True, text=True, check=True).stdout
    found = {}
    member = "?"
    for line in out.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            member = line[:-1]
            continue
        m = re.match(r"\s*U\s+(.*)", line)
        if m:
            found.setdefault(m.group(1).split("@")[0], set()).add(member)
    return found


def main():
    lib, links_file = sys.argv[1], sys.argv[2]
    problems = []
    links = [l for l in re.split(r"[;\s]+", open(links_file).read().strip()) if l]
    for l in links:
        if l not in ALLOWED_LINKS:
            problems.append(f"ps_logic links {l} (only {', '.join(sorted(ALLOWED_LINKS))} may be)")
    for name, members in sorted(undefined(lib).items()):
        bare = name.split("(")[0]
        if bare in BANNED_C or bare.startswith(BANNED_PREFIX):
            problems.append(f"{', '.join(sorted(members))} calls {name}: I/O belongs in ps_core")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"ps_logic: {len(links)} link(s) ({', '.join(links)}), no I/O call: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""kolo_bench across two hosts made of network namespaces (needs root).

    tools/bench/multihost_bench.py [--rounds N] [--ranks-per-host K]
                                   [-- KOLO_BENCH_FLAGS...]

Sets up hostA and hostB as the multi-host tests do (tests/multihost/
harness.py: two network namespaces joined by veth, sshd in each, the job
started by kolorun over ssh, every listener on the veth interface), then
gives each host half of this machine's cores (the first half to hostA's
kolorun, the second to hostB's sshd, whose workers inherit it), and runs
`kolorun -np 2K -H hostA:K,hostB:K kolo_bench ...` with the host relay
on (KOLO_HIT_BOARD=1, the default: a host's ranks send their request lists
through its leader, Note [Host relay] in runtime/negotiation/host_batch.h) and off
(=0: every rank sends its own to the coordinator), the two alternated for
--rounds rounds, and prints each run's tables. Without flags after `--`
it runs the lone allreduce of 4 KB - 1 MB and the fusion workload.

What this measures and what it does not: the hosts share this machine's
cores and memory, and the link between them is a veth pair (the kernel's
TCP stack on both ends, no wire), so the numbers show the relay's and the
control plane's costs against the same job without the relay, not what a
real network would give. Build first:
  bazel build //tools/kolorun:kolorun //tools/kolorun:kolo_rank_guard \
      //tools/bench:kolo_bench
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "multihost"))
from harness import IFACE, Cluster, Skip  # noqa: E402

DEFAULT_RUNS = [
    ["--ops", "allreduce", "--sizes", "4K,64K,1M", "--baselines", "none"],
    ["--mode", "fusion", "--baselines", "none"],
]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [--rounds N] [--ranks-per-host K] [-- FLAGS...]")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternations of relay on/off (default 2)")
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="ranks on each of the two hosts (default 1: "
                        "each host gets half of this machine's cores)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds one kolo_bench run may take")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1:]
    if args.rounds < 1 or args.ranks_per_host < 1:
        parser.error("--rounds and --ranks-per-host must be at least 1")
    if os.geteuid() != 0:
        print("multihost_bench: needs root (network namespaces, sshd)",
              file=sys.stderr)
        return 2
    runs = [rest] if rest else DEFAULT_RUNS

    scratch = tempfile.mkdtemp(prefix="kolo-mh-bench-")
    os.chmod(scratch, 0o755)
    cluster = Cluster(scratch)
    status = 0
    try:
        # Copies, as the multi-host tests make: a build meanwhile may
        # replace bazel-bin's files.
        bin_dir = os.path.join(scratch, "bin")
        os.makedirs(bin_dir)
        binaries = {}
        for key, path in (("kolorun", "tools/kolorun/kolorun"),
                          ("guard", "tools/kolorun/kolo_rank_guard"),
                          ("bench", "tools/bench/kolo_bench")):
            src = os.path.join(REPO, "bazel-bin", path)
            if not os.path.exists(src):
                print(f"multihost_bench: {src} is missing: build first "
                      "(see --help)", file=sys.stderr)
                return 2
            binaries[key] = os.path.join(bin_dir, os.path.basename(path))
            shutil.copy2(src, binaries[key])
        try:
            a, _ = cluster.setup_pair()
            cluster.setup_ssh()
        except Skip as e:
            print(f"multihost_bench: {e}", file=sys.stderr)
            return 2
        # Each host gets its own half of this machine's cores, as if they
        # were two machines: kolorun binds a host's workers within what it
        # may use (hostA's kolorun; hostB's workers inherit sshd's mask).
        cpus = sorted(os.sched_getaffinity(0))
        halves = {"hostA": cpus[:max(1, len(cpus) // 2)],
                  "hostB": cpus[len(cpus) // 2:] or cpus}
        for label, host in cluster.hosts.items():
            if host.sshd:
                os.sched_setaffinity(host.sshd.pid, halves[label])
        k = args.ranks_per_host
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": scratch,
               "HOME": os.environ.get("HOME", "/root")}
        for round_ in range(args.rounds):
            for relay in ("1", "0"):
                for flags in runs:
                    argv = a.prefix() + [
                        "taskset", "-c", ",".join(map(str, halves["hostA"])),
                        binaries["kolorun"], "-np", str(2 * k),
                        "-H", f"hostA:{k},hostB:{k}",
                        "--ssh-config", cluster.ssh_config,
                        "--network-interface", IFACE,
                        "-x", f"KOLO_HIT_BOARD={relay}",
                        "-x", f"TMPDIR={scratch}",
                        binaries["bench"]] + flags
                    print(f"\n## round {round_ + 1}, host relay "
                          f"{'on' if relay == '1' else 'off'}: kolo_bench "
                          f"{' '.join(flags)}", flush=True)
                    try:
                        done = subprocess.run(
                            argv, env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=args.timeout)
                    except subprocess.TimeoutExpired:
                        print(f"multihost_bench: timed out after "
                              f"{args.timeout:.0f} s", flush=True)
                        status = 1
                        continue
                    # The tables (rank 0) and the per-rank stderr lines.
                    for line in (done.stdout + done.stderr).splitlines():
                        if line.startswith("[0] ") or "# fusion rank" in line:
                            print(line)
                    if done.returncode != 0:
                        print(f"multihost_bench: exit {done.returncode}\n"
                              f"{done.stderr[-2000:]}", flush=True)
                        status = 1
    finally:
        for problem in cluster.teardown():
            print(f"multihost_bench: cleanup: {problem}", file=sys.stderr)
            status = 1
        shutil.rmtree(scratch, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

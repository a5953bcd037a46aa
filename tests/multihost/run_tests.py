#!/usr/bin/env python3
"""Multi-host and launcher-engine tests of kolo, with real parts.

Hosts are network namespaces joined by veth, each with a real sshd (keys
generated per run, host keys checked); kolorun runs on hostA and starts the
ranks on hostB through ssh. The engine tests run real mpirun and torchrun,
and a Slurm-style job from SLURM_* variables.

Needs root (network namespaces, mounts, sshd). Run through
tests/multihost/run.sh, which builds the binaries first. Prints one line per
test, "PASSED multihost/NAME", "FAILED multihost/NAME: why" or
"SKIPPED multihost/NAME: why", then "multihost: N passed, N failed, N
skipped"; exits 1 if any test failed.

Every test has a harness deadline, and after each one checks that nothing
of the job is left: no process on any host but sshd, no listening socket
but sshd's, no secret file. The namespaces, sshd and temporary files are
removed at the end, also after failures and on SIGINT/SIGTERM.
"""

import argparse
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (IFACE, SUBNET, Cluster, Failure, Process, Skip, check,  # noqa: E402
                     process_name, run, wait_for_exit)

JOB_DEADLINE = 60.0  # Seconds: a job still running then fails its test.

# A rank of test_torch_distributed_across_hosts.
TORCH_DISTRIBUTED_WORKER = r"""
import torch
import torch.distributed as dist
import kolo.torch

dist.init_process_group("kolo")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
nxt, prev = (rank + 1) % size, (rank - 1) % size
got = torch.empty(3)
req = dist.isend(torch.full((3,), float(rank)), nxt, tag=2)
dist.recv(got, prev, tag=2)
req.wait()
assert torch.equal(got, torch.full((3,), float(prev))), got
if rank == 0:
    senders = sorted(dist.recv(torch.empty(1), tag=3) for _ in range(size - 1))
    print("ANY " + ",".join(map(str, senders)), flush=True)
else:
    dist.send(torch.ones(1), 0, tag=3)
# The world spans the hosts: gloo's transport. A group of one host's two
# ranks: shared memory (Note [Point-to-point of a process group]).
def transport(group):  # torch 1.13's group is the backend itself
    backend = group._get_backend(torch.device("cpu")) if hasattr(
        group, "_get_backend") else group
    return backend._point_to_point_transport()
world = transport(dist.distributed_c10d._get_default_group())
assert world.startswith("gloo (TCP): its ranks are on more than one host"), world
pair = [rank - rank % 2, rank - rank % 2 + 1]
groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
mine = groups[rank // 2]
assert transport(mine) == "shared memory", transport(mine)
other = pair[1] if rank == pair[0] else pair[0]
got = torch.empty(2)
req = dist.isend(torch.full((2,), float(rank)), other, group=mine)
dist.recv(got, other, group=mine)
req.wait()
assert torch.equal(got, torch.full((2,), float(other))), got
# Rank 0 hosts torch's store: nobody leaves while another may still use it
# (new_group's store-based barrier).
dist.barrier()
print("OK rank %d local %d/%d cross %d/%d sum %s from %d" % (
    rank, kolo.torch.local_rank(), kolo.torch.local_size(),
    kolo.torch.cross_rank(), kolo.torch.cross_size(), t.item(), prev),
    flush=True)
dist.destroy_process_group()
"""
KILL_BOUND = 5.0     # RELIABILITY.md: workers exit within 5 s of kill -9.
OK_LINE = re.compile(r"^\[(\d+)\] OK rank (\d+) of (\d+): .* checksum ([0-9a-f]+)$")


class Suite:
    def __init__(self, repo):
        self.repo = repo
        self.scratch = tempfile.mkdtemp(prefix="kolo-multihost-")
        os.chmod(self.scratch, 0o755)
        self.bin = {}
        self.cluster = Cluster(self.scratch)
        self.pair_error = None   # Why hostA/hostB could not be set up.
        self.ssh_error = None    # Why sshd could not be set up.
        self.counter = 0

    # --- set-up and environment ---

    def setup(self):
        if os.geteuid() != 0:
            self.pair_error = "needs root (network namespaces, sshd)"
            return
        # Copies, installed side by side as on a real host: a build running
        # meanwhile (others share this tree) may replace bazel-bin's files.
        bin_dir = os.path.join(self.scratch, "bin")
        os.makedirs(bin_dir)
        for key, path in (("kolorun", "tools/kolorun/kolorun"),
                          ("guard", "tools/kolorun/kolo_rank_guard"),
                          ("demo", "tools/examples/allreduce_demo"),
                          ("worker", "tests/multihost/multihost_worker"),
                          ("elastic", "tests/frontends/torch/elastic_train")):
            self.bin[key] = os.path.join(bin_dir, os.path.basename(path))
            shutil.copy2(os.path.join(self.repo, "bazel-bin", path),
                         self.bin[key])
        # The Python package (kolo.torch), for the torch.distributed test.
        self.bin["site"] = os.path.join(self.scratch, "site")
        shutil.copytree(os.path.join(self.repo, "bazel-bin", "frontends",
                                     "python", "site"), self.bin["site"])
        try:
            self.cluster.setup_pair()
        except Skip as e:
            self.pair_error = str(e)
            return
        try:
            self.cluster.setup_ssh()
        except Skip as e:
            self.ssh_error = str(e)

    def fresh_dir(self, name):
        self.counter += 1
        path = os.path.join(self.scratch, f"{self.counter:02d}-{name}")
        os.makedirs(path)
        return path

    def base_env(self, tmpdir):
        """This process's environment without launcher variables, with TMPDIR
        (where kolorun's secret file goes) set to `tmpdir`."""
        drop = re.compile(r"^(KOLO_|OMPI_|PMIX_|SLURM_|TORCHELASTIC_)|"
                          r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|"
                          r"GROUP_RANK|GROUP_WORLD_SIZE|MASTER_ADDR|"
                          r"MASTER_PORT|OMP_NUM_THREADS)$")
        env = {k: v for k, v in os.environ.items() if not drop.search(k)}
        paths = env.get("PATH", "").split(":")
        for extra in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
            if extra not in paths:
                paths.append(extra)
        env["PATH"] = ":".join(p for p in paths if p)
        env["TMPDIR"] = tmpdir
        return env

    def secret_file(self, directory):
        path = os.path.join(directory, "job-secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secrets.token_hex(32).encode())
        os.close(fd)
        return path

    def kolorun(self, host, args, env):
        argv = host.prefix() + [self.bin["kolorun"]] + args
        return Process(argv, env, self.repo, JOB_DEADLINE)

    def hosts_ab(self):
        if self.pair_error:
            raise Skip(self.pair_error)
        return self.cluster.hosts["hostA"], self.cluster.hosts["hostB"]

    def ssh_hosts(self):
        a, b = self.hosts_ab()
        if self.ssh_error:
            raise Skip(self.ssh_error)
        return a, b

    # --- checks ---

    def expect_clean(self, hosts, secret_dirs=()):
        """Nothing of the job is left: only sshd runs and listens on each
        host, and no secret file remains."""
        for host in hosts:
            left = host.job_pids()
            # sshd's per-connection processes may still be exiting after ssh
            # returned; they end by themselves, the job's processes must not
            # be there at all.
            job = {p for p in left if not process_name(p).startswith("sshd")}
            check(not job, f"{host.label}: processes of the job left: " +
                  ", ".join(f"{p} ({process_name(p)})" for p in sorted(job)))
            alive, _ = wait_for_exit(left - job, 5)
            check(not alive, f"{host.label}: sshd sessions did not end: " +
                  ", ".join(process_name(p) for p in alive))
            sshd_only = {f"{host.addr}:22"} if host.sshd else set()
            listeners = host.listeners()
            check(listeners == sshd_only,
                  f"{host.label}: listening sockets left: {listeners}")
        for d in secret_dirs:
            files = [f for f in os.listdir(d) if f.startswith("kolo-secret")]
            check(not files, f"secret files left in {d}: {files}")

    def finish_ranks(self, procs, what):
        """Waits for every rank's process (procs[r] is rank r); fails naming
        each rank that exited non-zero. Returns their outputs."""
        failures = []
        for rank, proc in enumerate(procs):
            rc = proc.wait()
            if rc != 0:
                failures.append(f"rank {rank} exited {rc}:\n"
                                f"{proc.stdout()}\n{proc.stderr()}")
        check(not failures, f"{what}: " + "\n".join(failures))
        return [p.stdout() for p in procs]

    def expect_demo_ok(self, output, size, what):
        ranks, checksums = set(), set()
        for line in output.splitlines():
            m = OK_LINE.match(line)
            if m:
                check(m.group(1) == m.group(2),
                      f"{what}: output prefix is not the rank: {line}")
                check(m.group(3) == str(size), f"{what}: wrong size: {line}")
                ranks.add(int(m.group(2)))
                checksums.add(m.group(4))
        check(ranks == set(range(size)),
              f"{what}: OK from ranks {sorted(ranks)}, expected 0..{size - 1}"
              f"\n{output}")
        check(len(checksums) == 1,
              f"{what}: results differ between ranks: {checksums}")

    @staticmethod
    def placements(output):
        """rank -> dict of the worker's "placement" fields."""
        found = {}
        for line in output.splitlines():
            m = re.search(r"placement (rank=.*)$", line)
            if m:
                fields = dict(f.split("=", 1) for f in m.group(1).split())
                found[int(fields["rank"])] = fields
        return found

    @staticmethod
    def pid_of(pid_dir, rank):
        with open(os.path.join(pid_dir, str(rank))) as f:
            return int(f.read())

    def expect_on_host(self, pid, host, what):
        inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        check(inode == host.net_inode(),
              f"{what} (pid {pid}) does not run on {host.label}")

    # --- ssh tests ---

    def test_ssh_allreduce_demo(self):
        """The demo on hostA:2,hostB:2 through ssh: exact, bitwise-identical
        results, and the traffic crosses the veth link."""
        a, b = self.ssh_hosts()
        work = self.fresh_dir("ssh-demo")
        rx0, tx0 = a.counters()
        job = self.kolorun(a, [
            "-np", "4", "-H", "hostA:2,hostB:2",
            "--ssh-config", self.cluster.ssh_config,
            "--network-interface", IFACE,
            self.bin["demo"], "--tensors", "64", "--iterations", "2"],
            self.base_env(work))
        rc = job.wait()
        check(rc == 0, f"kolorun exited {rc}\n{job.stdout()}\n{job.stderr()}")
        self.expect_demo_ok(job.stdout(), 4, "ssh demo")
        rx1, tx1 = a.counters()
        print(f"  hostA {IFACE}: {tx1 - tx0} bytes out, {rx1 - rx0} bytes in")
        # Each host must send the other at least its share of every sum;
        # ssh and the control plane alone move a few kilobytes.
        for name, delta in (("sent", tx1 - tx0), ("received", rx1 - rx0)):
            check(delta >= 1 << 20,
                  f"hostA {name} only {delta} bytes on {IFACE}: the data did "
                  "not cross the link between the hosts")
        self.expect_clean([a, b], [work])

    def test_ssh_placement_forwarding_and_hygiene(self):
        """Placement, forwarded environment, listeners on the hosts'
        addresses only, the secret in no argv or log, per-rank logs, exact
        traffic across the link; the store address is chosen by route."""
        a, b = self.ssh_hosts()
        work = self.fresh_dir("ssh-placement")
        pids, hold, logs, remote_tmp = (os.path.join(work, d) for d in
                                        ("pids", "hold", "logs", "remote-tmp"))
        for d in (pids, hold, remote_tmp):
            os.makedirs(d)
        fifos = []
        for rank in range(4):
            path = os.path.join(hold, f"go.{rank}")
            os.mkfifo(path)
            fifos.append(os.open(path, os.O_RDWR | os.O_NONBLOCK))
        env = self.base_env(work)
        env["KOLO_TEST_FROM_ENV"] = "kept"
        env["KOLO_SECRET"] = "must-not-reach-any-worker"
        env["LD_LIBRARY_PATH"] = "/kolo-test/lib"
        env["OMP_NUM_THREADS"] = "3"
        env["NOT_FORWARDED"] = "stays-here"
        payload = 8 << 20
        rx0, tx0 = a.counters()
        job = self.kolorun(a, [
            "-np", "4", "-H", "hostA:2,hostB:2",
            "--ssh-config", self.cluster.ssh_config,
            "-x", "KOLO_TEST_X=x value", "-x", f"TMPDIR={remote_tmp}",
            "--output-filename", logs, "--log-level", "info", "--verbose",
            self.bin["worker"], "--pid-dir", pids, "--hold", hold,
            "--bytes", str(payload), "--print-env", "KOLO_TEST_X",
            "--print-env", "KOLO_TEST_FROM_ENV", "--print-env", "KOLO_SECRET",
            "--print-env", "KOLO_LOG_LEVEL", "--print-env", "PATH",
            "--print-env", "LD_LIBRARY_PATH", "--print-env", "OMP_NUM_THREADS",
            "--print-env", "NOT_FORWARDED"], env)
        try:
            job.wait_for(lambda out: sum("joined rank=" in l for l in out) == 4,
                         "4 joined ranks")
            found = self.placements(job.stdout())
            check(sorted(found) == [0, 1, 2, 3], f"placements: {found}")
            for rank, p in found.items():
                host = a if rank < 2 else b
                want = {"size": "4", "local": f"{rank % 2}/2",
                        "cross": f"{rank // 2}/2", "source": "kolo",
                        "bind": host.addr, "store": p["store"],
                        "host_store": "0"}
                got = {k: p[k] for k in want}
                check(got == want, f"rank {rank}: {got}, expected {want}")
                check(p["store"].startswith(f"{a.addr}:"),
                      f"rank {rank}: store at {p['store']}, expected hostA")
                self.expect_on_host(self.pid_of(pids, rank), host,
                                    f"rank {rank}")
            out = job.stdout()
            for rank in range(4):
                for line in ("env KOLO_TEST_X=x value",
                             "env KOLO_TEST_FROM_ENV=kept",
                             "env KOLO_SECRET=unset",
                             "env KOLO_LOG_LEVEL=info",
                             f"env PATH={env['PATH']}",
                             "env LD_LIBRARY_PATH=/kolo-test/lib",
                             "env OMP_NUM_THREADS=3",
                             # Local ranks inherit kolorun's environment,
                             # remote ones get only what is forwarded.
                             "env NOT_FORWARDED=" +
                             ("stays-here" if rank < 2 else "unset")):
                    check(f"[{rank}] {line}" in out,
                          f"rank {rank} lacks \"{line}\":\n{out}")
            # Listeners (kolorun's store and rank 0's control channel on
            # hostA, besides sshd), on the hosts' addresses only.
            check(len(a.listeners()) >= 3, f"hostA: {a.listeners()}")
            for host in (a, b):
                wrong = [l for l in host.listeners()
                         if not l.startswith(f"{host.addr}:")]
                check(not wrong, f"{host.label} listens on {wrong}")
            # The secret: in memory files the workers inherit (kolorun's
            # here, each guard's own on hostB), never a file on disk.
            local = [f for f in os.listdir(work) if f.startswith("kolo-secret")]
            check(not local, f"secret files in kolorun's TMPDIR: {local}")
            remote = os.listdir(remote_tmp)
            check(not remote, f"secret files on hostB: {remote}")
            secrets = set()
            for rank in range(4):
                pid = self.pid_of(pids, rank)
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env_of = dict(e.split(b"=", 1) for e in
                                  f.read().split(b"\0") if b"=" in e)
                fd = env_of[b"KOLO_SECRET_FD"].decode()
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                check(target.startswith("/memfd:kolo-secret"),
                      f"rank {rank}: the secret's descriptor is {target}")
                with open(f"/proc/{pid}/fd/{fd}") as f:
                    secrets.add(f.read().strip())
            check(len(secrets) == 1 and len(next(iter(secrets))) == 64,
                  f"the ranks hold {len(secrets)} secrets")
            secret = next(iter(secrets))
            leaks = []
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            if secret.encode() in f.read():
                                leaks.append(process_name(pid))
                    except OSError:
                        pass
            check(not leaks, f"the secret is on command lines: {leaks}")
            for fd in fifos:
                os.write(fd, b"g")
            rc = job.wait()
        finally:
            job.kill()
            for fd in fifos:
                os.close(fd)
        check(rc == 0, f"kolorun exited {rc}\n{job.stdout()}\n{job.stderr()}")
        check(job.stdout().count("allreduce ok") == 4, job.stdout())
        check("(the local address that routes to hostB)" in job.stderr(),
              f"--verbose does not say how the store address was chosen:\n"
              f"{job.stderr()}")
        check(secret not in job.stdout() + job.stderr(), "secret in output")
        for rank in range(4):
            with open(os.path.join(logs, f"rank.{rank}.log")) as f:
                log = f.read()
            check(f"placement rank={rank} " in log and "allreduce ok" in log
                  and secret not in log, f"rank.{rank}.log:\n{log}")
            # Two ranks on each of two hosts: shm within, gloo between.
            check("process set 0: 4 ranks over shm+gloo" in log,
                  f"rank.{rank}.log does not say shm+gloo:\n{log}")
            # Note [Host relay]: each host's lists go through its leader.
            leader = 0 if rank < 2 else 2
            check(f"this host's 2 ranks send through rank {leader}" in log,
                  f"rank.{rank}.log does not name its host's leader:\n{log}")
        rx1, tx1 = a.counters()
        print(f"  hostA {IFACE}: {tx1 - tx0} bytes out, {rx1 - rx0} bytes in "
              f"for a {payload}-byte allreduce")
        # Hierarchical: each host sends the other about one payload (its
        # leader's share of a 2-leader ring allreduce and allgather), not
        # one per rank; ssh and the control plane add a little.
        for name, delta in (("sent", tx1 - tx0), ("received", rx1 - rx0)):
            check(payload <= delta < payload * 5 // 4,
                  f"hostA {name} {delta} bytes for a {payload}-byte "
                  "allreduce: expected about one payload (shm+gloo)")
        self.expect_clean([a, b], [work, remote_tmp])

    def _looping_job(self, a, work, pids, survive):
        extra = ["--survive-peer-loss"] if survive else []
        job = self.kolorun(a, [
            "-np", "4", "-H", "hostA:2,hostB:2",
            "--ssh-config", self.cluster.ssh_config,
            "--network-interface", IFACE, "--grace-period", "3",
            "-x", f"TMPDIR={work}/remote-tmp",
            self.bin["worker"], "--pid-dir", pids, "--loop", "--bytes", "4096"]
            + extra, self.base_env(work))
        job.wait_for(lambda out: sum("looping rank=" in l for l in out) == 4,
                     "4 ranks looping")
        return job

    def test_ssh_remote_worker_killed(self):
        """kill -9 of a worker on hostB: kolorun names host, rank and signal,
        exits non-zero, and nothing is left on either host."""
        a, b = self.ssh_hosts()
        work = self.fresh_dir("ssh-remote-kill")
        pids = os.path.join(work, "pids")
        os.makedirs(pids)
        os.makedirs(os.path.join(work, "remote-tmp"))
        job = self._looping_job(a, work, pids, survive=True)
        try:
            victim = self.pid_of(pids, 3)
            self.expect_on_host(victim, b, "rank 3")
            killed_at = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            rc = job.wait()
        finally:
            job.kill()
        print(f"  kolorun exited {time.monotonic() - killed_at:.2f} s after "
              "the kill")
        check(rc == 1, f"kolorun exited {rc}\n{job.stderr()}")
        want = f"kolorun: rank 3 on hostB (pid {victim}) was killed by signal SIGKILL"
        check(want in job.stderr(), f"expected \"{want}\" in:\n{job.stderr()}")
        self.expect_clean([a, b], [os.path.join(work, "remote-tmp")])

    def test_elastic_host_added_and_removed(self):
        """Elastic mode across hosts: while 2 workers train on hostA, the
        discovery script adds hostB with one slot: kolorun starts a worker
        there over ssh and it trains in the next generation (it got the
        state by broadcast); then the script drops hostB: its worker leaves
        with status 0 and the job finishes on hostA."""
        a, b = self.ssh_hosts()
        work = self.fresh_dir("elastic")
        os.makedirs(os.path.join(work, "remote-tmp"))
        hosts = os.path.join(work, "hosts.txt")
        with open(hosts, "w") as f:
            f.write("hostA:2\n")
        script = os.path.join(work, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, 0o755)
        env = self.base_env(work)
        env["SAMPLES"] = "640"
        env["STEP_DELAY_MS"] = "100"
        job = self.kolorun(a, [
            "-np", "2", "--min-np", "1", "--max-np", "3",
            "--host-discovery-script", script, "--discovery-interval", "0.2",
            "--ssh-config", self.cluster.ssh_config,
            "--network-interface", IFACE, "-x", f"TMPDIR={work}/remote-tmp",
            "-x", "SAMPLES", "-x", "STEP_DELAY_MS", self.bin["elastic"]], env)
        try:
            job.wait_for(lambda out: any("STEP 3 size 2" in l for l in out),
                         "2 workers training on hostA")
            with open(hosts, "w") as f:
                f.write("hostA:2\nhostB:1\n")
            job.wait_for(lambda out: any(re.search(r"STEP \d+ size 3", l)
                                         for l in out),
                         "3 workers training, one on hostB")
            with open(hosts, "w") as f:
                f.write("hostA:2\n")
            rc = job.wait()
        finally:
            job.kill()
        out, err = job.stdout(), job.stderr()
        check(rc == 0, f"kolorun exited {rc}\n{out}\n{err}")
        check("generation 1: 3 workers (1 new)" in err, err)
        check(re.search(r"generation 2: 2 workers, after: hosts changed: "
                        r"rank 2 on hostB \(pid \d+\) leaves \(host hostB "
                        r"removed\)", err), err)
        finals = re.findall(r"FINAL pid \d+ rank (\d) of (\d) gen (\d)", out)
        check(sorted(finals) == [("0", "2", "2"), ("1", "2", "2")],
              f"final lines: {finals}\n{out}")
        replay = re.search(r"REPLAY (\S+)", out)
        check(replay and float(replay.group(1)) < 1e-9, out)
        self.expect_clean([a, b], [os.path.join(work, "remote-tmp")])

    def test_ssh_launcher_killed(self):
        """kill -9 of kolorun: every worker on every host exits within 5 s."""
        a, b = self.ssh_hosts()
        work = self.fresh_dir("ssh-launcher-kill")
        pids = os.path.join(work, "pids")
        os.makedirs(pids)
        os.makedirs(os.path.join(work, "remote-tmp"))
        job = self._looping_job(a, work, pids, survive=False)
        try:
            workers = {self.pid_of(pids, r) for r in range(4)}
            others = (a.job_pids() | b.job_pids()) - {job.pid}
            os.kill(job.pid, signal.SIGKILL)
            alive, took = wait_for_exit(workers | others, 20)
        finally:
            job.kill()
        slowest = max(took.values()) if took else 0.0
        print(f"  {len(workers)} workers and {len(others) - len(workers)} "
              f"helpers gone; the last after {slowest:.2f} s")
        check(not alive, "still alive 20 s after kill -9 of kolorun: " +
              ", ".join(f"{p} ({process_name(p)})" for p in alive))
        late = {p: t for p, t in took.items() if p in workers and t > KILL_BOUND}
        check(not late, f"workers exited later than {KILL_BOUND} s: {late}")
        # kolorun's own secret file cannot be removed by a killed kolorun.
        for name in os.listdir(work):
            if name.startswith("kolo-secret"):
                os.remove(os.path.join(work, name))
        self.expect_clean([a, b], [os.path.join(work, "remote-tmp")])

    def test_ssh_host_key_checked(self):
        """A wrong host key for hostB: ssh refuses (BatchMode, checking on),
        kolorun names rank and host, and nothing starts on hostB."""
        a, b = self.ssh_hosts()
        work = self.fresh_dir("ssh-host-key")

        def logins(log):
            return sum("Accepted publickey" in l for l in log)

        # With the right key, one rank on hostB is one login there.
        before = logins(b.sshd_log)
        job = self.kolorun(a, ["-np", "1", "-H", "hostB",
                               "--ssh-config", self.cluster.ssh_config,
                               "--network-interface", IFACE, "true"],
                           self.base_env(work))
        rc = job.wait()
        check(rc == 0, f"kolorun exited {rc}\n{job.stderr()}")
        check(b.wait_sshd_log(lambda log: logins(log) == before + 1, 5),
              "sshd on hostB logged no login")
        before = logins(b.sshd_log)
        job = self.kolorun(a, [
            "-np", "3", "-H", "hostA:1,hostB:2",
            "--ssh-config", self.cluster.ssh_config + ".wrong",
            "--network-interface", IFACE, self.bin["demo"]],
            self.base_env(work))
        rc = job.wait()
        err = job.stderr()
        check(rc == 1, f"kolorun exited {rc}\n{err}")
        check("Host key verification failed" in err, err)
        check(re.search(r"kolorun: rank [12] on hostB: ssh to hostB \(pid \d+\) "
                        r"failed with exit status 255", err), err)
        # ssh gave up before logging in: hostB's sshd saw no new login.
        check(logins(b.sshd_log) == before,
              "a login on hostB despite the wrong host key:\n" +
              "\n".join(b.sshd_log))
        self.expect_clean([a, b], [work])

    # --- engine tests ---

    def engine_host(self, name):
        if self.pair_error:
            raise Skip(self.pair_error)
        return self.cluster.add_namespace(name)

    def test_mpirun(self):
        """4 processes under real mpirun: the demo, and placement from
        OMPI_COMM_WORLD_* with rank 0 hosting the store on 127.0.0.1:29600."""
        if not shutil.which("mpirun"):
            raise Skip("mpirun is not installed (openmpi-bin)")
        host = self.engine_host("mpi")
        work = self.fresh_dir("mpirun")
        env = self.base_env(work)
        env["KOLO_SECRET_FILE"] = self.secret_file(work)
        mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                  "4", "-x", "KOLO_SECRET_FILE"]
        demo = Process(host.prefix() + mpirun + [self.bin["demo"], "--tensors",
                                                  "64", "--iterations", "2"],
                       env, self.repo, JOB_DEADLINE)
        rc = demo.wait()
        check(rc == 0, f"mpirun exited {rc}\n{demo.stdout()}\n{demo.stderr()}")
        # mpirun does not prefix output: add the rank ourselves.
        out = "\n".join(re.sub(r"^OK rank (\d+)", r"[\1] OK rank \1", l)
                        for l in demo.stdout().splitlines())
        self.expect_demo_ok(out, 4, "mpirun demo")
        job = Process(host.prefix() + mpirun + [self.bin["worker"]], env,
                      self.repo, JOB_DEADLINE)
        rc = job.wait()
        check(rc == 0, f"mpirun exited {rc}\n{job.stdout()}\n{job.stderr()}")
        found = self.placements(job.stdout())
        check(sorted(found) == [0, 1, 2, 3], f"placements: {found}")
        for rank, p in found.items():
            want = {"size": "4", "local": f"{rank}/4", "cross": "0/1",
                    "source": "mpirun", "bind": "127.0.0.1",
                    "store": "127.0.0.1:29600", "host_store": "1"}
            got = {k: p[k] for k in want}
            check(got == want, f"rank {rank}: {got}, expected {want}")
        self.expect_clean([host])

    def torch_python(self):
        for python in ("/usr/bin/python3", shutil.which("python3")):
            if python and run([python, "-c", "import torch"], timeout=60,
                              check_rc=False).returncode == 0:
                return python
        raise Skip("no python3 with torch (python3-torch)")

    def test_torchrun(self):
        """2 processes under real torchrun: the demo, and placement from
        RANK/WORLD_SIZE/LOCAL_*/GROUP_* with kolo's store on 29600 next to
        torchrun's on MASTER_PORT 29500."""
        python = self.torch_python()
        host = self.engine_host("torch")
        work = self.fresh_dir("torchrun")
        env = self.base_env(work)
        env["KOLO_SECRET_FILE"] = self.secret_file(work)
        # Debian's torch 1.13 on Python 3.11 cannot parse the default
        # --redirects 0: "1" (stdout to a log file, teed) works on both.
        torchrun = [python, "-m", "torch.distributed.run", "--nproc_per_node=2",
                    "--redirects", "1", "--tee", "1", "--log_dir",
                    os.path.join(work, "torch-logs"), "--no_python"]
        demo = Process(host.prefix() + torchrun + [self.bin["demo"],
                                                   "--tensors", "64"],
                       env, self.repo, JOB_DEADLINE)
        rc = demo.wait()
        check(rc == 0, f"torchrun exited {rc}\n{demo.stdout()}\n{demo.stderr()}")
        out = "\n".join(re.sub(r"^\[default\d\]:OK rank (\d+)",
                               r"[\1] OK rank \1", l)
                        for l in demo.stdout().splitlines())
        self.expect_demo_ok(out, 2, "torchrun demo")
        job = Process(host.prefix() + torchrun + [self.bin["worker"]], env,
                      self.repo, JOB_DEADLINE)
        rc = job.wait()
        check(rc == 0, f"torchrun exited {rc}\n{job.stdout()}\n{job.stderr()}")
        found = self.placements(job.stdout())
        check(sorted(found) == [0, 1], f"placements: {found}\n{job.stdout()}")
        for rank, p in found.items():
            want = {"size": "2", "local": f"{rank}/2", "cross": "0/1",
                    "source": "torchrun", "bind": "127.0.0.1",
                    "store": "127.0.0.1:29600", "host_store": "1"}
            got = {k: p[k] for k in want}
            check(got == want, f"rank {rank}: {got}, expected {want}")
        self.expect_clean([host])

    def test_torch_distributed_across_hosts(self):
        """4 plain python processes, 2 on each of hostA and hostB, started
        with torch's env:// and no kolo variable: kolo joins through torch's
        store (placement 2 hosts x 2), reduces across the link, and
        point-to-point crosses it over gloo's transport (a ring, and a recv
        from any source on rank 0); a group of one host's ranks exchanges
        over shared memory."""
        python = self.torch_python()
        a, b = self.hosts_ab()
        work = self.fresh_dir("torch-distributed")
        script = os.path.join(work, "p2p.py")
        with open(script, "w") as f:
            f.write(TORCH_DISTRIBUTED_WORKER)
        env = self.base_env(work)
        env["PYTHONPATH"] = self.bin["site"]
        env.update(MASTER_ADDR=a.addr, MASTER_PORT="29700", WORLD_SIZE="4")
        procs = [Process((a if rank < 2 else b).prefix() + [python, script],
                         dict(env, RANK=str(rank)), self.repo, JOB_DEADLINE)
                 for rank in range(4)]
        self.finish_ranks(procs, "torch.distributed across hosts")
        for rank, proc in enumerate(procs):
            want = (f"OK rank {rank} local {rank % 2}/2 cross {rank // 2}/2 "
                    f"sum 10.0 from {(rank - 1) % 4}")
            check(want in proc.stdout(), f"rank {rank}: expected {want!r} in "
                  f"{proc.stdout()}\n{proc.stderr()}")
        check("ANY 1,2,3" in procs[0].stdout(), procs[0].stdout())
        self.expect_clean([a, b])

    def test_slurm_two_nodes(self):
        """4 processes from SLURM_* variables, 2 on each of hostA and hostB
        (SLURM_NODELIST=kolonode[1-2]): rank 0 hosts the store on the first
        node; the demo runs exact across the link."""
        a, b = self.hosts_ab()
        work = self.fresh_dir("slurm")
        env = self.base_env(work)
        env["KOLO_SECRET_FILE"] = self.secret_file(work)
        slurm = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "4",
                 "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
                 "SLURM_NODELIST": "kolonode[1-2]"}

        def start(command):
            procs = []
            for rank in range(4):
                rank_env = dict(env, **slurm, SLURM_PROCID=str(rank),
                                SLURM_LOCALID=str(rank % 2),
                                SLURM_NODEID=str(rank // 2))
                host = a if rank < 2 else b
                procs.append(Process(host.prefix() + command, rank_env,
                                     self.repo, JOB_DEADLINE))
            return procs

        demo = start([self.bin["demo"], "--tensors", "64"])
        outs = self.finish_ranks(demo, "Slurm-style demo")
        self.expect_demo_ok("\n".join(f"[{r}] {o}" for r, o in enumerate(outs)),
                            4, "Slurm-style demo")
        outs = self.finish_ranks(start([self.bin["worker"]]),
                                 "Slurm-style worker")
        for rank, out in enumerate(outs):
            p = self.placements(out).get(rank)
            check(p is not None, f"rank {rank}: no placement in {out}")
            want = {"size": "4", "local": f"{rank % 2}/2",
                    "cross": f"{rank // 2}/2", "source": "slurm",
                    "bind": f"{SUBNET}.{1 + rank // 2}",
                    "store": "kolonode1:29600",
                    "host_store": "1"}
            got = {k: p[k] for k in want}
            check(got == want, f"rank {rank}: {got}, expected {want}")
        self.expect_clean([a, b])

    # --- running ---

    def tests(self):
        return [(name[5:], getattr(self, name)) for name in dir(self)
                if name.startswith("test_")]

    def run_all(self, selected):
        results = []
        for name, test in self.tests():
            if selected and not any(s in name for s in selected):
                continue
            start = time.monotonic()
            try:
                test()
                status, detail = "PASSED", ""
            except Skip as e:
                status, detail = "SKIPPED", str(e)
            except Failure as e:
                status, detail = "FAILED", str(e)
            except Exception:  # noqa: BLE001 - report, then clean up
                status, detail = "FAILED", traceback.format_exc()
            took = time.monotonic() - start
            line = f"{status} multihost/{name}"
            if status == "PASSED":
                print(f"{line} ({took:.1f} s)", flush=True)
            else:
                print(f"{line}: {detail}", flush=True)
            results.append(status)
            if status == "FAILED":
                self.reset_hosts()
        return results

    def reset_hosts(self):
        """After a failure: kill whatever the failed test left, so that the
        next test starts clean."""
        for host in self.cluster.hosts.values():
            keep = {host.sshd.pid} if host.sshd else set()
            self.cluster.kill_namespace_processes(host, keep)

    def teardown(self):
        problems = self.cluster.teardown()
        shutil.rmtree(self.scratch, ignore_errors=True)
        return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=os.getcwd(),
                        help="repository root with bazel-bin (default: .)")
    parser.add_argument("tests", nargs="*",
                        help="run only tests whose names contain one of these")
    args = parser.parse_args()
    suite = Suite(os.path.abspath(args.repo))

    def on_signal(signo, frame):
        raise KeyboardInterrupt(f"signal {signo}")

    signal.signal(signal.SIGTERM, on_signal)
    results = []
    problems = []
    try:
        suite.setup()
        if suite.pair_error:
            print(f"note: {suite.pair_error}", flush=True)
        results = suite.run_all(args.tests)
    except KeyboardInterrupt as e:
        print(f"FAILED multihost/interrupted: {e}", flush=True)
        results.append("FAILED")
    except Exception:  # noqa: BLE001 - set-up failed: report, clean up
        print(f"FAILED multihost/setup: {traceback.format_exc()}", flush=True)
        results.append("FAILED")
    finally:
        problems = suite.teardown()
    for problem in problems:
        print(f"FAILED multihost/cleanup: {problem}", flush=True)
        results.append("FAILED")
    counts = {s: results.count(s) for s in ("PASSED", "FAILED", "SKIPPED")}
    print(f"multihost: {counts['PASSED']} passed, {counts['FAILED']} failed, "
          f"{counts['SKIPPED']} skipped", flush=True)
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())

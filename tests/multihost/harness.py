"""Building blocks of the multi-host tests: network namespaces as hosts,
real sshd, processes with deadlines, and leftover checks.

Every "host" is a network namespace of this machine, entered through
`ip netns exec` with its own /etc/hosts bind-mounted (private to that mount
namespace, so the machine's /etc/hosts is untouched). Two hosts are joined by
a veth pair named kolo0 on both sides (10.77.0.1/24 and 10.77.0.2/24); no
namespace has a route anywhere else, so nothing the tests do can reach
another address. The file system and the process table are shared, which is
what lets the tests look at every host's processes and files.
"""

import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time

SUBNET = "10.77.0"
IFACE = "kolo0"


class Skip(Exception):
    """The test cannot run here; the message says why."""


class Failure(AssertionError):
    """The test ran and found something wrong."""


def check(condition, message):
    if not condition:
        raise Failure(message)


def run(argv, timeout=30, check_rc=True, **kwargs):
    """Runs a short command to completion; raises Failure on error."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True,
                                timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise Failure(f"{' '.join(argv)}: still running after {timeout} s")
    if check_rc and result.returncode != 0:
        raise Failure(f"{' '.join(argv)} exited with {result.returncode}: "
                      f"{result.stdout}{result.stderr}")
    return result


def process_name(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        return " ".join(a.decode(errors="replace") for a in args if a)
    except OSError:
        return "?"


def wait_for_exit(pids, timeout):
    """Waits (pidfd, no polling) until every pid has exited. Returns the pids
    still alive at the deadline and the seconds each exit took."""
    start = time.monotonic()
    fds = {}
    took = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            took[pid] = 0.0
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = start + timeout
    try:
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(left * 1000):
                took[fds[fd]] = time.monotonic() - start
                poller.unregister(fd)
                os.close(fd)
                del fds[fd]
    finally:
        for fd in fds:
            os.close(fd)
    return set(fds.values()), took


class Process:
    """A started command whose stdout and stderr are collected by reader
    threads; waits are for events (a line, the exit) with deadlines."""

    def __init__(self, argv, env, cwd, deadline=60.0):
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd,
                                     stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.deadline = time.monotonic() + deadline
        self.out = []
        self.err = []
        self.cond = threading.Condition()
        self.open_streams = 2
        self.threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout,
                                                      self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr,
                                                      self.err), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _read(self, stream, sink):
        for raw in iter(stream.readline, b""):
            with self.cond:
                sink.append(raw.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.open_streams -= 1
            self.cond.notify_all()

    def stdout(self):
        with self.cond:
            return "\n".join(self.out)

    def stderr(self):
        with self.cond:
            return "\n".join(self.err)

    def wait_for(self, predicate, what):
        """Waits until predicate(stdout lines) holds; Failure at EOF or at
        the deadline."""
        with self.cond:
            while not predicate(self.out):
                left = self.deadline - time.monotonic()
                if left <= 0 or self.open_streams == 0:
                    raise Failure(
                        f"waiting for {what}: "
                        f"{'deadline passed' if left <= 0 else 'output ended'}"
                        f"\nstdout:\n" + "\n".join(self.out) +
                        "\nstderr:\n" + "\n".join(self.err))
                self.cond.wait(left)

    def wait(self):
        """Waits for the exit (and the end of its output); returns the exit
        code. Kills the process at the deadline and raises Failure."""
        left = max(0.0, self.deadline - time.monotonic())
        try:
            rc = self.proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self.kill()
            raise Failure(f"{' '.join(self.argv[-12:])}: still running at "
                          "the harness deadline\nstdout:\n" + self.stdout() +
                          "\nstderr:\n" + self.stderr())
        for t in self.threads:
            t.join(max(0.0, self.deadline - time.monotonic()))
        return rc

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


class Host:
    """One network namespace, seen as a host."""

    def __init__(self, cluster, label, ns, addr=None):
        self.cluster = cluster
        self.label = label
        self.ns = ns
        self.addr = addr
        self.sshd = None
        self.sshd_log = []
        self.sshd_log_changed = threading.Condition()

    def wait_sshd_log(self, predicate, timeout):
        """Waits until predicate(sshd's log lines) holds; returns whether it
        did within `timeout` seconds."""
        with self.sshd_log_changed:
            return self.sshd_log_changed.wait_for(
                lambda: predicate(self.sshd_log), timeout)

    def prefix(self):
        """argv prefix that runs a command on this host."""
        return ["ip", "netns", "exec", self.ns, "sh", "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"',
                self.cluster.hosts_file]

    def net_inode(self):
        return os.stat(f"/run/netns/{self.ns}").st_ino

    def pids(self):
        out = run(["ip", "netns", "pids", self.ns]).stdout
        return {int(p) for p in out.split()}

    def job_pids(self):
        """Processes on this host other than the sshd daemon."""
        keep = {self.sshd.pid} if self.sshd else set()
        return self.pids() - keep

    def listeners(self):
        out = run(["ip", "netns", "exec", self.ns, "ss", "-Hltn"]).stdout
        return {line.split()[3] for line in out.splitlines() if line.strip()}

    def counters(self):
        info = json.loads(run(["ip", "-n", self.ns, "-j", "-s", "link", "show",
                               IFACE]).stdout)[0]["stats64"]
        return info["rx"]["bytes"], info["tx"]["bytes"]


class Cluster:
    """Namespaces hostA and hostB joined by veth (each with sshd when asked),
    plus fresh single-host namespaces for the launcher-engine tests."""

    def __init__(self, scratch):
        self.scratch = scratch
        self.tag = f"kolo-mh-{os.getpid()}"
        self.hosts = {}
        self.namespaces = []
        self.hosts_file = os.path.join(scratch, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n"
                    f"{SUBNET}.1 hostA kolonode1\n"
                    f"{SUBNET}.2 hostB kolonode2\n")
        self.ssh_dir = os.path.join(scratch, "ssh")
        self.ssh_config = os.path.join(self.ssh_dir, "config")

    # --- namespaces ---

    def add_namespace(self, label, addr=None):
        ns = f"{self.tag}-{label}"
        try:
            run(["ip", "netns", "add", ns])
        except Failure as e:
            raise Skip(f"cannot create network namespaces ({e})")
        self.namespaces.append(ns)
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        host = Host(self, label, ns, addr)
        self.hosts[label] = host
        return host

    def setup_pair(self):
        """hostA and hostB, joined by veth kolo0 <-> kolo0."""
        a = self.add_namespace("hostA", f"{SUBNET}.1")
        b = self.add_namespace("hostB", f"{SUBNET}.2")
        pid = os.getpid()
        left, right = f"kv{pid}a", f"kv{pid}b"
        run(["ip", "link", "add", left, "type", "veth", "peer", "name", right])
        for host, dev in ((a, left), (b, right)):
            run(["ip", "link", "set", dev, "netns", host.ns])
            run(["ip", "-n", host.ns, "link", "set", dev, "name", IFACE])
            run(["ip", "-n", host.ns, "addr", "add", f"{host.addr}/24", "dev",
                 IFACE])
            run(["ip", "-n", host.ns, "link", "set", IFACE, "up"])
        return a, b

    # --- ssh ---

    def setup_ssh(self):
        """Keys, known_hosts and the client config; sshd on hostA and hostB."""
        for tool in ("/usr/sbin/sshd", "ssh", "ssh-keygen"):
            if not shutil.which(tool):
                raise Skip(f"{tool} is not installed (openssh-server, "
                           "openssh-client)")
        os.makedirs(self.ssh_dir, mode=0o700)
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        run(keygen + ["-f", os.path.join(self.ssh_dir, "id_ed25519"),
                      "-C", "kolo-test-client"])
        os.rename(os.path.join(self.ssh_dir, "id_ed25519.pub"),
                  os.path.join(self.ssh_dir, "authorized_keys"))
        known = []
        for label in ("hostA", "hostB"):
            host = self.hosts[label]
            key = os.path.join(self.ssh_dir, f"{label}_host_key")
            run(keygen + ["-f", key, "-C", label])
            with open(key + ".pub") as f:
                known.append(f"{label},{host.addr} {f.read().strip()}")
        # A second, wrong key for hostB: host key checking must refuse it.
        wrong = os.path.join(self.ssh_dir, "wrong_key")
        run(keygen + ["-f", wrong, "-C", "impostor"])
        with open(wrong + ".pub") as f:
            wrong_line = f"hostB,{SUBNET}.2 {f.read().strip()}"
        with open(os.path.join(self.ssh_dir, "known_hosts"), "w") as f:
            f.write("\n".join(known) + "\n")
        with open(os.path.join(self.ssh_dir, "wrong_known_hosts"), "w") as f:
            f.write(known[0] + "\n" + wrong_line + "\n")
        self._write_client_config(self.ssh_config, "known_hosts")
        self._write_client_config(self.ssh_config + ".wrong",
                                  "wrong_known_hosts")
        for label in ("hostA", "hostB"):
            self._start_sshd(self.hosts[label])

    def _write_client_config(self, path, known_hosts):
        d = self.ssh_dir
        with open(path, "w") as f:
            f.write(f"""# kolorun --ssh-config for the test hosts.
Host hostA
    HostName {SUBNET}.1
Host hostB
    HostName {SUBNET}.2
Host *
    User root
    IdentityFile {d}/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile {d}/{known_hosts}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    UpdateHostKeys no
    LogLevel ERROR
""")

    def _start_sshd(self, host):
        config = os.path.join(self.ssh_dir, f"sshd_{host.label}")
        with open(config, "w") as f:
            f.write(f"""ListenAddress {host.addr}:22
HostKey {self.ssh_dir}/{host.label}_host_key
PidFile none
AuthorizedKeysFile {self.ssh_dir}/authorized_keys
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
PrintMotd no
PrintLastLog no
PermitTTY no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
MaxStartups 64
LogLevel INFO
""")
        # sshd needs /run/sshd; a tmpfs on /run, private to this mount
        # namespace, provides it without touching the machine's /run.
        argv = host.prefix() + [
            "sh", "-c", 'mount -t tmpfs -o mode=0755 kolo-run /run && '
            'mkdir /run/sshd && exec /usr/sbin/sshd -D -e -f "$0"', config]
        host.sshd = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE,
                                     start_new_session=True)
        listening = threading.Event()

        def drain():
            for raw in iter(host.sshd.stderr.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                with host.sshd_log_changed:
                    host.sshd_log.append(line)
                    host.sshd_log_changed.notify_all()
                if "Server listening on" in line:
                    listening.set()
            listening.set()

        threading.Thread(target=drain, daemon=True).start()
        if not listening.wait(15) or host.sshd.poll() is not None:
            raise Failure(f"sshd on {host.label} did not start:\n" +
                          "\n".join(host.sshd_log))

    # --- cleanup ---

    def kill_namespace_processes(self, host, keep=()):
        for pid in host.pids() - set(keep):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def teardown(self):
        """Stops everything this cluster started; returns problems found."""
        problems = []
        for host in self.hosts.values():
            if host.sshd and host.sshd.poll() is None:
                host.sshd.terminate()
                try:
                    host.sshd.wait(10)
                except subprocess.TimeoutExpired:
                    host.sshd.kill()
                    host.sshd.wait()
            left = host.pids() if host.ns in self.namespaces else set()
            if left:
                problems.append(f"{host.label}: killed leftover processes " +
                                ", ".join(f"{p} ({process_name(p)})"
                                          for p in sorted(left)))
                self.kill_namespace_processes(host)
                wait_for_exit(left, 10)
        for ns in self.namespaces:
            run(["ip", "netns", "del", ns], check_rc=False)
        remaining = run(["ip", "netns", "list"]).stdout
        for ns in self.namespaces:
            if ns in remaining.split():
                problems.append(f"namespace {ns} could not be deleted")
        self.namespaces = []
        return problems

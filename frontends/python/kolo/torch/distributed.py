"""kolo as a torch.distributed backend (docs/torch_distributed.md).

Importing ``kolo.torch`` (or this module) registers the backend "kolo":

    import kolo.torch  # noqa: F401
    import torch.distributed as dist
    dist.init_process_group("kolo")      # under kolorun or torchrun
    model = torch.nn.parallel.DistributedDataParallel(model)

Every collective of a "kolo" group is one of kolo's, negotiated by name:
collectives are named by the group and their position in its sequence
(Note [Collectives named by sequence] in frontends/python/src/process_group.h),
so a rank that issues a different collective, shape, dtype, op or root at
the same position fails on every rank with an error naming the collective's
position and each rank's value. The backend and ``kolo.torch.init()`` share
one runtime: the job kolo joins is the job torch's ranks describe.
"""

import datetime
import os
import secrets
import socket
import time

import torch
import torch.distributed as dist

from kolo import _C
from kolo.torch import mpi_ops

BACKEND = "kolo"
_TORCH_MAJOR = int(torch.__version__.split(".")[0])


def _fill_environment():
    """torch's default init_method (env://) reads RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT; kolorun exports them. Under other
    launchers that set KOLO_RANK/KOLO_SIZE, RANK, WORLD_SIZE, LOCAL_RANK
    and LOCAL_WORLD_SIZE are filled from them here (never overwritten)."""
    for torch_name, kolo_name in (("RANK", "KOLO_RANK"),
                                  ("WORLD_SIZE", "KOLO_SIZE"),
                                  ("LOCAL_RANK", "KOLO_LOCAL_RANK"),
                                  ("LOCAL_WORLD_SIZE", "KOLO_LOCAL_SIZE")):
        if torch_name not in os.environ and kolo_name in os.environ:
            os.environ[torch_name] = os.environ[kolo_name]


def _launched_by_kolo():
    """Whether kolo's own placement describes the job: kolorun (or a user)
    set KOLO_RANK/KOLO_SIZE, or kolo.torch.init() already joined a job."""
    return (mpi_ops.is_initialized() or "KOLO_RANK" in os.environ or
            "KOLO_SIZE" in os.environ)


def _start_timeout():
    value = os.environ.get("KOLO_START_TIMEOUT", "60")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1
    if not seconds > 0:
        raise ValueError("KOLO_START_TIMEOUT=%r: expected a number of seconds "
                         "above 0" % value)
    return seconds


def _store_host(store):
    """The host of the TCPStore under torch's PrefixStores, if it is one."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return getattr(store, "host", None) if isinstance(store, dist.TCPStore) \
        else None


def _routable_address(host):
    """An IPv4 address of this host that other hosts can reach."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET)
    except socket.gaierror:
        infos = []
    for info in infos:
        if not info[4][0].startswith("127."):
            return info[4][0]
    raise RuntimeError(
        "kolo backend: the ranks run on several hosts and this host's name "
        "%r resolves to no address the others can reach: set "
        "KOLO_RENDEZVOUS_ADDR (or MASTER_ADDR) to rank 0's address" % host)


def _host_identity():
    """What makes two ranks local to each other (kolo then joins them
    through shared memory): the host name, and the boot, network and IPC
    namespaces, so that containers or network namespaces that share a
    host name are told apart."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
    except OSError:
        pass
    for ns in ("net", "ipc"):
        try:
            parts.append("%s:%d" % (ns, os.stat("/proc/self/ns/" + ns).st_ino))
        except OSError:
            pass
    return "/".join(parts)


def _free_port(address):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address if not address.startswith("127.") else "127.0.0.1",
                0))
        return s.getsockname()[1]


def _wait_keys(store, keys, seconds, missing):
    """Waits up to `seconds` for `keys` in torch's store; on timeout raises
    naming what `missing(absent keys)` says."""
    deadline = time.monotonic() + seconds
    for i, key in enumerate(keys):
        left = max(0.01, deadline - time.monotonic())
        try:
            store.wait([key], datetime.timedelta(seconds=left))
        except RuntimeError:
            absent = [key]
            try:
                absent += [k for k in keys[i + 1:] if not store.check([k])]
            except (RuntimeError, AttributeError):
                pass  # torch 1.13's store has no check(), nor a socket left
            raise RuntimeError(
                "kolo backend: rendezvous through torch's store timed out "
                "after %g s (KOLO_START_TIMEOUT): %s" % (
                    seconds, missing(absent))) from None


def _join_through_store(store, rank, size):
    """Joins kolo's job through the store torch passed to the default
    group, for processes that no kolo launcher started (torch.multiprocessing
    .spawn, torchrun, a python per rank: docs/torch_distributed.md,
    "Rendezvous through torch's store"). Every rank publishes its host's
    identity; rank 0 chooses kolo's rendezvous address and port (and a job secret
    where none is given) and publishes them; each rank then sets kolo's
    placement variables and joins with kolo's own authenticated rendezvous.
    """
    seconds = _start_timeout()
    host = _host_identity()
    store.set("kolo/host/%d" % rank, host)
    given_secret = any(v in os.environ for v in
                       ("KOLO_SECRET", "KOLO_SECRET_FILE", "KOLO_SECRET_FD"))
    require = os.environ.get("KOLO_REQUIRE_SECRET", "0")
    if require not in ("0", "1"):
        raise ValueError("KOLO_REQUIRE_SECRET=%r: expected 0 or 1" % require)
    if require == "1" and not given_secret and size > 1:
        raise RuntimeError(
            "kolo backend: KOLO_REQUIRE_SECRET=1 and no job secret given: set "
            "KOLO_SECRET_FILE (or KOLO_SECRET) on every rank, or unset "
            "KOLO_REQUIRE_SECRET to let rank 0 pass a secret through torch's "
            "store")
    keys = ["kolo/host/%d" % r for r in range(size)]
    if rank == 0:
        _wait_keys(store, keys, seconds, lambda absent: (
            "rank(s) %s did not reach init_process_group" %
            ", ".join(k.rsplit("/", 1)[1] for k in absent)))
        hosts = [store.get(k).decode() for k in keys]
        address = (os.environ.get("KOLO_RENDEZVOUS_ADDR") or
                   os.environ.get("MASTER_ADDR") or _store_host(store))
        if not address:
            address = ("127.0.0.1" if len(set(hosts)) == 1
                       else _routable_address(socket.gethostname()))
        port = os.environ.get("KOLO_RENDEZVOUS_PORT") or str(
            _free_port(address))
        if not given_secret and size > 1:
            store.set("kolo/secret", secrets.token_hex(32))
        store.set("kolo/rendezvous", "%s:%s" % (address, port))
    else:
        _wait_keys(store, ["kolo/rendezvous"], seconds, lambda absent: (
            "rank 0 did not publish kolo's rendezvous address"))
        hosts = [store.get(k).decode() for k in keys]
    address, port = store.get("kolo/rendezvous").decode().rsplit(":", 1)
    distinct = list(dict.fromkeys(hosts))
    placement = {
        "KOLO_RANK": rank, "KOLO_SIZE": size,
        "KOLO_LOCAL_RANK": hosts[:rank].count(host),
        "KOLO_LOCAL_SIZE": hosts.count(host),
        "KOLO_CROSS_RANK": distinct.index(host),
        "KOLO_CROSS_SIZE": len(distinct),
        "KOLO_RENDEZVOUS_ADDR": address, "KOLO_RENDEZVOUS_PORT": port,
        "KOLO_HOST_STORE": int(rank == 0),
    }
    for name, value in placement.items():
        os.environ[name] = str(value)
    if not given_secret and size > 1:
        # Handed to kolo through a descriptor: never in the environment.
        fd = os.memfd_create("kolo-secret")
        os.write(fd, store.get("kolo/secret"))
        os.environ["KOLO_SECRET_FD"] = str(fd)
        try:
            mpi_ops.init()
        finally:
            del os.environ["KOLO_SECRET_FD"]
            os.close(fd)
    else:
        mpi_ops.init()


def _timeout_ms(backend_options):
    """The group's timeout for kolo's requests: the one given to
    init_process_group or new_group, or 0 (KOLO_OP_TIMEOUT) where torch
    passed its default."""
    timeout = getattr(backend_options, "timeout", None)
    if timeout is None or timeout == dist.constants.default_pg_timeout:
        return 0
    return max(1, int(timeout.total_seconds() * 1000))


def _connected(group, backend_options):
    """`group` with its point-to-point connected through the group's store
    (Note [Point-to-point of a process group]): every member runs this."""
    group._connect_point_to_point(backend_options.store)
    return group


def _create_process_group(backend_options, pg_options):
    """torch.distributed's creator of a "kolo" group (extended API): called
    on the group's member ranks only."""
    if pg_options is not None:
        raise ValueError("the kolo backend takes no pg_options")
    if not mpi_ops.is_initialized():
        if _launched_by_kolo() or backend_options.global_ranks_in_group:
            mpi_ops.init()
        else:
            _join_through_store(backend_options.store,
                                backend_options.group_rank,
                                backend_options.group_size)
    timeout_ms = _timeout_ms(backend_options)
    members = sorted(int(r) for r in backend_options.global_ranks_in_group)
    rank, size = backend_options.group_rank, backend_options.group_size
    if not members:  # the default group: torch's world is kolo's job
        if size != _C.size() or rank != _C.rank():
            raise RuntimeError(
                "torch.distributed's world (rank %d of %d) is not the job "
                "kolo joined (rank %d of %d): start every process with the "
                "same launcher (RANK/WORLD_SIZE and KOLO_RANK/KOLO_SIZE "
                "disagree)" % (rank, size, _C.rank(), _C.size()))
        return _connected(_C.ProcessGroupKolo(0, rank, size, "world",
                                              timeout_ms), backend_options)
    if members[rank] != _C.rank() or len(members) != size:
        raise RuntimeError(
            "torch.distributed's group %r (ranks %s) does not hold kolo's "
            "rank %d at position %d" % (backend_options.group_id, members,
                                         _C.rank(), rank))
    # Created by its members alone: torch calls this on members only.
    process_set = _C.add_process_set_of_members(
        members, "c10d/" + backend_options.group_id)
    return _connected(_C.ProcessGroupKolo(process_set, rank, size,
                                          backend_options.group_id,
                                          timeout_ms), backend_options)


def _register():
    if BACKEND.upper() in dist.Backend._plugins:
        return
    if _TORCH_MAJOR >= 2:
        # A c10d::Backend there: torch builds the ProcessGroup around it,
        # for both device types (a list; a string would be split).
        dist.Backend.register_backend(BACKEND, _create_process_group,
                                      extended_api=True,
                                      devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(BACKEND, _create_process_group,
                                      extended_api=True)


_fill_environment()
_register()

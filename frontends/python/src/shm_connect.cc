// ShmPointToPoint::Connect: how a group decides on shared memory for its
// point-to-point and maps its segment (Note [Point-to-point over shared
// memory] in shm_point_to_point.h). The engine: shm_point_to_point.cc.
#include <c10/util/Exception.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "frontends/python/src/shm_point_to_point.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/shared_segment.h"
#include "runtime/os/unique_fd.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture
#endif

namespace kolo {
namespace torch {
namespace {

// The host as kolo's placement tells hosts apart (_host_identity in
// kolo/torch/distributed.py: host name, boot, network and IPC namespaces),
// and the pid namespace, which pidfds need.
std::string HostKey() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::string key = absl::StrCat(name, ":", boot);
  for (const char* ns : {"net", "ipc", "pid"}) {
    struct stat st {};
    if (stat(absl::StrCat("/proc/self/ns/", ns).c_str(), &st) != 0) return "";
    absl::StrAppend(&key, ":", ns, "=", st.st_ino);
  }
  return key;
}

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string Text(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

}  // namespace

std::shared_ptr<ShmPointToPoint> ShmPointToPoint::Connect(
    const std::string& group, int rank, int size,
    const c10::intrusive_ptr<c10d::Store>& store,
    std::chrono::milliseconds timeout, std::string* why_not) {
  // Keys of this connection only: a store can serve a group of the same
  // name again (destroy_process_group, then init_process_group), and old
  // keys must not answer for the new ranks. Every rank adds 1 once per
  // connection, so each computes the same generation.
  const int64_t added = store->add("kolo-point-to-point-shm/connections", 1);
  const std::string prefix =
      absl::StrCat("kolo-point-to-point-shm/", (added - 1) / size, "/");
  const auto key = [&](const std::string& what, int r) {
    return absl::StrCat(prefix, what, "/", r);
  };
  const auto all = [&](const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key(what, r));
    store->wait(keys, timeout);
    std::vector<std::string> values;
    for (const std::string& k : keys) values.push_back(Text(store->get(k)));
    return values;
  };

  // 1. One host (and pid namespace)?
  store->set(key("host", rank), Bytes(absl::StrCat(HostKey(), "|", getpid())));
  std::vector<pid_t> pids(size);
  std::string first_host;
  bool one_host = true;
  const std::vector<std::string> hosts = all("host");
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> parts = absl::StrSplit(hosts[r], '|');
    int pid = 0;
    if (parts.size() != 2 || parts[0].empty() ||
        !absl::SimpleAtoi(parts[1], &pid)) {
      one_host = false;
      continue;
    }
    pids[r] = pid;
    if (r == 0) first_host = parts[0];
    if (parts[0] != first_host) one_host = false;
  }
  if (!one_host) {
    *why_not =
        "its ranks are on more than one host (or network, IPC or pid "
        "namespace)";
    return nullptr;
  }

  // 2. Rank 0 creates the segment; everyone maps it and opens a pidfd of
  //    every peer, and says whether it could.
  std::unique_ptr<os::SharedSegment> segment;
  const size_t bytes = SegmentBytes(size);
  // Rank 0 removes the name on every way out of here, a store error
  // included (Note [Segment lifetime]); the mappings stay.
  std::string created_name;
  struct Unlinker {
    std::string* name;
    ~Unlinker() {
      if (!name->empty()) (void)os::SharedSegment::Unlink(*name);
    }
  } unlinker{&created_name};
  if (rank == 0) {
    const std::string name = os::SharedSegment::RandomName("kolo-p2p");
    absl::StatusOr<std::unique_ptr<os::SharedSegment>> created =
        os::SharedSegment::Create(name, bytes);
    if (created.ok()) {
      segment = std::move(*created);
      created_name = name;
    }
    store->set(
        prefix + "name",
        Bytes(created.ok() ? name
                           : absl::StrCat("!", created.status().ToString())));
  }
  store->wait({prefix + "name"}, timeout);
  const std::string name = Text(store->get(prefix + "name"));
  if (!name.empty() && name[0] == '!') {
    *why_not =
        absl::StrCat("rank 0 could not create its segment: ", name.substr(1));
    return nullptr;
  }
  std::string problem;
  if (rank != 0) {
    absl::StatusOr<std::unique_ptr<os::SharedSegment>> opened =
        os::SharedSegment::Open(name, bytes);
    if (opened.ok()) {
      segment = std::move(*opened);
    } else {
      problem = opened.status().ToString();
    }
  }
  std::vector<os::UniqueFd> pidfds(size);
  for (int r = 0; r < size && problem.empty(); ++r) {
    if (r == rank) continue;
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, pids[r], 0));
    if (fd < 0) {
      problem = absl::StrCat("pidfd_open(rank ", r, "'s pid ", pids[r],
                             "): ", os::ErrnoText(errno));
    }
    pidfds[r] = os::UniqueFd(fd);
  }
  store->set(key("mapped", rank), Bytes(problem));
  const std::vector<std::string> mapped = all("mapped");  // then unlinked
  for (int r = 0; r < size; ++r) {
    if (!mapped[r].empty()) {
      *why_not = absl::StrCat("rank ", r, " could not join: ", mapped[r]);
      return nullptr;
    }
  }
  return Start(group, rank, size, std::move(segment), std::move(pidfds));
}

}  // namespace torch
}  // namespace kolo

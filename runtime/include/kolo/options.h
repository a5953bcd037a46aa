// Options: everything a Runtime needs to start. Every field has a default;
// Runtime::OptionsFromEnvironment() fills them from the KOLO_* variables
// (docs/configuration.md lists each with its default).
//
// Thread safety: a plain value type; Runtime::Create() copies it, so the
// caller may change or destroy its Options afterwards. `store` is shared
// with the Runtime and must be thread-safe (kolo/store.h).
//
// Errors: nothing here fails. Runtime::Create() rejects values out of range
// (a rank outside its world, a negative fusion threshold, a timeout <= 0),
// and settings every rank must share that differ from rank 0's, with
// InvalidArgument saying which and their values; OptionsFromEnvironment()
// rejects a bad variable with InvalidArgument naming it and its value.
#ifndef KOLO_OPTIONS_H_
#define KOLO_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace kolo {

class Store;

enum class LogLevel : int { kTrace, kDebug, kInfo, kWarning, kError, kFatal };

struct Options {
  // --- Placement (KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_*, KOLO_CROSS_*). ---
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;

  // --- Rendezvous. ---
  // If set, ranks rendezvous through this store (tests: one in-memory store
  // shared by N Runtimes in one process) and the fields below are unused.
  std::shared_ptr<Store> store;
  // Otherwise: the TCP store at this address (KOLO_RENDEZVOUS_ADDR/PORT).
  std::string rendezvous_addr = "127.0.0.1";
  int rendezvous_port = 29600;
  // Rank 0 hosts the TCP store itself, at bind_addr:rendezvous_port
  // (KOLO_HOST_STORE; on by default when the placement comes from mpirun,
  // Slurm or torchrun, off under kolorun, which hosts the store).
  bool host_store = false;
  // The store was listening before this process started (kolorun says so
  // with KOLO_LAUNCHER=kolorun): a store that cannot be reached means a
  // wrong address, reported within seconds instead of retried until the
  // start timeout.
  bool store_listening = false;
  // Where the placement came from: "kolo" (KOLO_RANK/KOLO_SIZE, e.g.
  // kolorun), "mpirun", "slurm", "torchrun", or "" (a job of one).
  // Informational, for messages.
  std::string placement_source;
  // The per-job secret that authenticates every connection on kolo's own
  // ports (KOLO_SECRET_FD from kolorun, KOLO_SECRET_FILE or KOLO_SECRET, at
  // least 16 bytes). Never logged.
  std::string secret;
  // KOLO_INSECURE_NO_SECRET=1 and no secret given: `secret` holds a fixed,
  // publicly known value, so anyone who can reach kolo's ports can join the
  // job. The runtime logs a warning when this is set.
  bool insecure_no_secret = false;
  // Numeric IPv4 address that kolo's listeners (control channel, gloo, and
  // the store when host_store) bind to: KOLO_IFACE's address; else, in a
  // job of several ranks, the local address that reaches the rendezvous
  // address; else loopback.
  std::string bind_addr = "127.0.0.1";
  // Interface name as given in KOLO_IFACE ("" = loopback). Informational.
  std::string iface;

  // --- Negotiation and fusion. ---
  int64_t fusion_threshold_bytes = 64 << 20;          // KOLO_FUSION_THRESHOLD
  absl::Duration cycle_time = absl::Milliseconds(1);  // KOLO_CYCLE_TIME
  int cache_capacity = 1024;                          // KOLO_CACHE_CAPACITY
  // How long the background thread and Work::Wait poll before they sleep
  // in the kernel, only while some caller waits for a collective (the
  // background thread also after a pass that followed new submissions).
  // 0: never spin.
  absl::Duration spin_time = absl::Microseconds(50);  // KOLO_SPIN_TIME (us)

  // --- Process sets created at start (ids 1, 2, ... in this order). Every
  // rank must pass the same list. ---
  std::vector<std::vector<int>> process_sets;

  // --- Join. While ranks have joined, Average divides by the number of
  // ranks that contributed data; true divides by the set size instead (as
  // Horovod and DDP do). ---
  bool join_average_over_set_size = false;

  // --- Timeouts. ---
  absl::Duration op_timeout = absl::Seconds(600);       // KOLO_OP_TIMEOUT
  absl::Duration start_timeout = absl::Seconds(60);     // KOLO_START_TIMEOUT
  absl::Duration stall_check_time = absl::Seconds(60);  // KOLO_STALL_CHECK_TIME
  absl::Duration stall_shutdown_time = absl::ZeroDuration();  // 0 = never

  // --- Diagnostics. ---
  std::string timeline_path;          // KOLO_TIMELINE ("" = off)
  bool timeline_mark_cycles = false;  // KOLO_TIMELINE_MARK_CYCLES
  // Time each phase of the background loop into Runtime::Counters() (the
  // "phase.*" counters): a few clock reads per take of requests and per
  // collective, none per tensor.
  bool phase_times = false;                 // KOLO_PHASE_TIMES
  LogLevel log_level = LogLevel::kWarning;  // KOLO_LOG_LEVEL

  // --- Data paths. ---
  bool shm = true;  // KOLO_SHM
  // Steady-state negotiation stays within each host where it can: on one
  // host the ranks agree on the requests they have all made again among
  // themselves, without a message to rank 0; over several hosts each host
  // sends rank 0 one message for all its ranks. false: every rank
  // negotiates with rank 0 directly (for comparison and diagnosis). Rank
  // 0's value decides on one host, each host's first rank's for its host.
  bool negotiate_within_hosts = true;   // KOLO_HIT_BOARD
  bool hierarchical_allreduce = false;  // KOLO_HIERARCHICAL_ALLREDUCE

  // --- Elastic jobs (docs/elastic.md; kolorun sets both). ---
  // The generation this Runtime joins (KOLO_ELASTIC_GENERATION). A
  // generation g > 0 rendezvous under its own store keys ("kolo/g<g>/...")
  // and authenticates its control channel with a key derived from the
  // secret and g, so that a worker of another generation can neither join
  // it nor pass for one of its ranks.
  int64_t generation = 0;
  // How many times this process joined this job before: a frontend's
  // init() after shutdown() joins again as incarnation 1, 2, ... (every
  // rank of the job shuts down and joins as often). An incarnation k > 0
  // keeps its rendezvous keys apart ("kolo/i<k>/...") and derives its
  // control channel's key from the secret and k, as a generation does, so
  // that its rank claims and addresses never meet those of an earlier one.
  int64_t incarnation = 0;
  // This worker's id in an elastic job (KOLO_ELASTIC_ID), stable across
  // generations; -1: not an elastic job.
  int64_t elastic_id = -1;
  // How long a worker waits for the launcher's next generation
  // (KOLO_ELASTIC_TIMEOUT, from kolorun's --elastic-timeout plus slack).
  absl::Duration elastic_timeout = absl::Seconds(660);
};

}  // namespace kolo

#endif  // KOLO_OPTIONS_H_

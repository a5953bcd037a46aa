// kolo_bench's output: the baselines that run as separate programs (MPI,
// torch.distributed), the nccl-tests-style tables with each baseline's
// ratio, the CSV file and the plot.
#ifndef KOLO_TOOLS_BENCH_BENCH_REPORT_H_
#define KOLO_TOOLS_BENCH_BENCH_REPORT_H_

#include <string>
#include <vector>

#include "tools/bench/bench_common.h"

namespace kolo {
namespace bench {

// Runs `argv` to completion (stdin closed) and returns its exit code and
// output (stdout and stderr merged); -1 if it could not start.
int RunProgram(const std::vector<std::string>& argv, std::string* output);

// The arguments that describe the workload to a baseline program (mpi_bench,
// torch_bench.py accept the same).
std::vector<std::string> WorkloadArgs(const Flags& flags);

// "RESULT <impl> <op> <bytes> <p50_us> <p99_us> <mean_us>" lines.
std::vector<Measurement> ParseResults(const std::string& output);

// Runs the MPI and/or torch baselines (rank 0 only, while the other kolo
// ranks wait) and returns their measurements; failures are reported on
// stderr and leave that baseline out.
std::vector<Measurement> RunExternalBaselines(const Flags& flags, int ranks,
                                              const std::string& argv0);

// The tables, one per collective (or the fusion table), to stdout.
void PrintTables(const Flags& flags, int ranks,
                 const std::vector<Measurement>& results);

// The time that stands for a measurement in this mode (p50, or the mean
// in loop mode), and the bandwidths derived from it (GB/s).
double TimeOf(const Flags& flags, const Measurement& m);

void WriteCsv(const std::string& path, const Flags& flags, int ranks,
              const std::vector<Measurement>& results);

// Runs the plot script on a CSV file; false (with a message) on failure.
bool Plot(const Flags& flags, const std::string& csv, const std::string& png,
          const std::string& argv0, int ranks);

}  // namespace bench
}  // namespace kolo

#endif  // KOLO_TOOLS_BENCH_BENCH_REPORT_H_

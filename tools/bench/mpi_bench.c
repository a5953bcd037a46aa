/* mpi_bench: kolo_bench's OpenMPI baseline, a separate program run by
 * mpirun (kolo_bench starts it; see docs/benchmarks.md). It takes the
 * workload flags kolo_bench passes on and prints, from rank 0, one line per
 * measurement:
 *   RESULT mpi <op> <bytes> <p50_us> <p99_us> <mean_us>
 * Sizes, element counts and iteration counts follow kolo_bench's rules
 * (bench_common.cc: CountFor, IterationsFor) so that rows line up. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double percentile(double* v, int n, double p) {
  qsort(v, n, sizeof(double), cmp);
  int i = (int)(p * n);
  return v[i < n ? i : n - 1];
}

static int iterations_for(long long bytes) {
  if (bytes <= (64 << 10)) return 200;
  if (bytes <= (1 << 20)) return 100;
  if (bytes <= (16 << 20)) return 20;
  return 5;
}

struct type_info {
  const char* name;
  MPI_Datatype type;
  int size;
  int reducible;
};

static int lookup_type(const char* name, struct type_info* t) {
  struct type_info known[] = {
      {"float32", MPI_FLOAT, 4, 1},    {"float64", MPI_DOUBLE, 8, 1},
      {"int32", MPI_INT32_T, 4, 1},    {"int64", MPI_INT64_T, 8, 1},
      {"uint8", MPI_UINT8_T, 1, 1},    {"int8", MPI_INT8_T, 1, 1},
      /* No 16-bit float reductions in MPI: moved as bytes only. */
      {"float16", MPI_UINT16_T, 2, 0}, {"bfloat16", MPI_UINT16_T, 2, 0}};
  for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); ++i) {
    if (strcmp(name, known[i].name) == 0) {
      *t = known[i];
      return 1;
    }
  }
  return 0;
}

struct flags {
  char ops[256];
  long long sizes[MAX_SIZES];
  int nsizes;
  char dtype[32];
  MPI_Op op;
  char mode[16];
  int fusion_tensors;
  long long fusion_bytes;
  int iters, warmup;
};

static int parse(int argc, char** argv, struct flags* f) {
  strcpy(f->ops, "allreduce");
  f->nsizes = 0;
  strcpy(f->dtype, "float32");
  f->op = MPI_SUM;
  strcpy(f->mode, "latency");
  f->fusion_tensors = 200;
  f->fusion_bytes = 4096;
  f->iters = 0;
  f->warmup = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* k = argv[i];
    const char* v = argv[i + 1];
    if (!strcmp(k, "--ops")) {
      snprintf(f->ops, sizeof(f->ops), "%s", v);
    } else if (!strcmp(k, "--sizes")) {
      char buf[4096];
      snprintf(buf, sizeof(buf), "%s", v);
      for (char* s = strtok(buf, ","); s && f->nsizes < MAX_SIZES; s = strtok(NULL, ",")) {
        f->sizes[f->nsizes++] = atoll(s);
      }
    } else if (!strcmp(k, "--dtype")) {
      snprintf(f->dtype, sizeof(f->dtype), "%s", v);
    } else if (!strcmp(k, "--op")) {
      f->op = !strcmp(v, "min") ? MPI_MIN : !strcmp(v, "max") ? MPI_MAX
              : !strcmp(v, "prod") ? MPI_PROD : MPI_SUM;
    } else if (!strcmp(k, "--mode")) {
      snprintf(f->mode, sizeof(f->mode), "%s", v);
    } else if (!strcmp(k, "--fusion-tensors")) {
      f->fusion_tensors = atoi(v);
    } else if (!strcmp(k, "--fusion-bytes")) {
      f->fusion_bytes = atoll(v);
    } else if (!strcmp(k, "--iters")) {
      f->iters = atoi(v);
    } else if (!strcmp(k, "--warmup")) {
      f->warmup = atoi(v);
    } else {
      return 0;
    }
  }
  return 1;
}

/* One collective of `count` elements (kolo_bench's CountFor). */
static void run(const char* op, long long count, int n, struct type_info* t,
                MPI_Op redop, char* in, char* out) {
  int share = (int)(count / n);
  if (!strcmp(op, "allreduce")) {
    MPI_Allreduce(MPI_IN_PLACE, in, (int)count, t->type, redop, MPI_COMM_WORLD);
  } else if (!strcmp(op, "broadcast")) {
    MPI_Bcast(in, (int)count, t->type, 0, MPI_COMM_WORLD);
  } else if (!strcmp(op, "allgather")) {
    MPI_Allgather(in, share, t->type, out, share, t->type, MPI_COMM_WORLD);
  } else if (!strcmp(op, "reducescatter")) {
    MPI_Reduce_scatter_block(in, out, share, t->type, redop, MPI_COMM_WORLD);
  } else if (!strcmp(op, "alltoall")) {
    MPI_Alltoall(in, share, t->type, out, share, t->type, MPI_COMM_WORLD);
  }
}

static void report(int rank, const char* op, long long bytes, double* us, int iters,
                   int loop) {
  if (rank != 0) return;
  double sum = 0;
  for (int i = 0; i < iters; ++i) sum += us[i];
  double mean = sum / iters;
  if (loop) {
    printf("RESULT mpi %s %lld %.3f %.3f %.3f\n", op, bytes, mean, mean, mean);
  } else {
    double p50 = percentile(us, iters, 0.5), p99 = percentile(us, iters, 0.99);
    printf("RESULT mpi %s %lld %.3f %.3f %.3f\n", op, bytes, p50, p99, mean);
  }
  fflush(stdout);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  struct flags f;
  struct type_info t;
  if (!parse(argc, argv, &f) || !lookup_type(f.dtype, &t)) {
    if (rank == 0) fprintf(stderr, "mpi_bench: bad arguments or dtype\n");
    MPI_Finalize();
    return 2;
  }
  const int loop = !strcmp(f.mode, "loop");
  if (!strcmp(f.mode, "fusion")) {
    int iters = f.iters ? f.iters : 20;
    long long each = f.fusion_bytes / t.size, total = each * f.fusion_tensors;
    char* bufs = calloc((size_t)total, t.size);
    double* us = malloc(sizeof(double) * iters);
    MPI_Request* reqs = malloc(sizeof(MPI_Request) * f.fusion_tensors);
    const char* names[] = {"fusion_per_tensor", "fusion_async", "fusion_fused"};
    for (int kind = 0; kind < 3 && t.reducible; ++kind) {
      for (int i = -f.warmup; i < iters; ++i) {
        double t0 = MPI_Wtime();
        if (kind == 0) {
          for (int k = 0; k < f.fusion_tensors; ++k) {
            MPI_Allreduce(MPI_IN_PLACE, bufs + k * each * t.size, (int)each, t.type,
                          f.op, MPI_COMM_WORLD);
          }
        } else if (kind == 1) {
          for (int k = 0; k < f.fusion_tensors; ++k) {
            MPI_Iallreduce(MPI_IN_PLACE, bufs + k * each * t.size, (int)each, t.type,
                           f.op, MPI_COMM_WORLD, &reqs[k]);
          }
          MPI_Waitall(f.fusion_tensors, reqs, MPI_STATUSES_IGNORE);
        } else {
          MPI_Allreduce(MPI_IN_PLACE, bufs, (int)total, t.type, f.op, MPI_COMM_WORLD);
        }
        if (i >= 0) us[i] = (MPI_Wtime() - t0) * 1e6;
      }
      report(rank, names[kind], total * t.size, us, iters, 0);
    }
    MPI_Finalize();
    return 0;
  }
  char ops[256];
  snprintf(ops, sizeof(ops), "%s", f.ops);
  for (char* op = strtok(ops, ","); op; op = strtok(NULL, ",")) {
    int reduces = !strcmp(op, "allreduce") || !strcmp(op, "reducescatter");
    if (reduces && !t.reducible) continue;
    int splits = !strcmp(op, "allgather") || !strcmp(op, "reducescatter") ||
                 !strcmp(op, "alltoall");
    for (int s = 0; s < f.nsizes; ++s) {
      long long bytes = f.sizes[s];
      long long count = bytes / t.size;
      if (count < 1) count = 1;
      if (splits) count = count / n * n < n ? n : count / n * n;
      int iters = f.iters ? f.iters : iterations_for(bytes);
      char* in = calloc((size_t)count, t.size);
      char* out = calloc((size_t)count, t.size);
      double* us = malloc(sizeof(double) * iters);
      for (int i = 0; i < f.warmup; ++i) run(op, count, n, &t, f.op, in, out);
      if (loop) {
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) run(op, count, n, &t, f.op, in, out);
        double each = (MPI_Wtime() - t0) * 1e6 / iters;
        for (int i = 0; i < iters; ++i) us[i] = each;
      } else {
        for (int i = 0; i < iters; ++i) {
          double t0 = MPI_Wtime();
          run(op, count, n, &t, f.op, in, out);
          us[i] = (MPI_Wtime() - t0) * 1e6;
        }
      }
      report(rank, op, bytes, us, iters, loop);
      free(in);
      free(out);
      free(us);
    }
  }
  MPI_Finalize();
  return 0;
}

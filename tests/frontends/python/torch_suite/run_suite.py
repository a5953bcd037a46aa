"""Runs PyTorch's own backend suite (suite.py) on the kolo backend.

    python run_suite.py --world-size 2 [--shards 3] [--label L] [-k PATTERN]

The tests are dealt round-robin to --shards worker processes that run side
by side (each test spawns its own --world-size ranks, one test after another
within a shard). Every test's outcome is printed; a test that fails and is
not in KNOWN_FAILURES (each with its reason, as docs/torch_distributed.md
lists them) fails the run, and so does a known failure that now passes
(the list must be kept true). Skipped tests are counted and named with
torch's reason. The last line is one of
    PASSED python/<label>  (P passed, F known failures, S skipped)
    FAILED python/<label>  (...)
which tools/test.sh counts.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

# Tests that pass on gloo and fail on kolo, with the reason. Keep in step
# with docs/torch_distributed.md ("PyTorch's backend suite").
KNOWN_FAILURES = {
    "test_barrier_timeout_full_group":
        "reads gloo's wording: expects \" (Timed out|closed|timeout) \" in "
        "the error; kolo's says 'timed out after 1 s (the request's "
        "timeout) waiting for rank 1 to submit it'",
    "test_ddp_logging_data_cpu":
        "torch logs every plugin backend's name as \"custom\" in DDP's "
        "logging data, and the test expects dist.get_backend() (\"kolo\")",
}


class _Recorder(unittest.TextTestResult):
    """Writes one JSON line per test to `out`."""

    def __init__(self, out, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._out = out
        self._start = 0.0

    def startTest(self, test):
        self._start = time.monotonic()
        super().startTest(test)

    def _write(self, test, outcome, detail=""):
        self._out.write(json.dumps({
            "test": test.id().rsplit(".", 1)[-1], "outcome": outcome,
            "detail": detail[-3000:],
            "seconds": round(time.monotonic() - self._start, 1)}) + "\n")
        self._out.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._write(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._write(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._write(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._write(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._write(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._write(test, "failed", "unexpected success")


def _worker(names, out_path):
    sys.path.insert(0, HERE)
    import suite  # noqa: E402  (BACKEND and WORLD_SIZE are set by now)
    tests = unittest.TestSuite(
        suite.TestKoloBackendWithSpawn(n) for n in names)
    with open(out_path, "a") as out:
        runner = unittest.TextTestRunner(
            stream=sys.stderr, verbosity=1,
            resultclass=lambda *a, **k: _Recorder(out, *a, **k))
        runner.run(tests)


def _all_tests(pattern):
    sys.path.insert(0, HERE)
    import suite  # noqa: E402
    names = unittest.TestLoader().getTestCaseNames(
        suite.TestKoloBackendWithSpawn)
    print("suite.py: gates admitting kolo, rewritten in torch %s's "
          "distributed_test.py: %s" % (
              suite.torch.__version__,
              "; ".join("%r x%d" % kv for kv in suite.GATE_COUNTS.items())))
    return [n for n in names if not pattern or pattern in n]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--label", default="torch-suite")
    parser.add_argument("-k", dest="pattern", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--worker", nargs="*")
    args = parser.parse_args()
    os.environ["BACKEND"] = "kolo"
    # The ranks' forkserver imports suite.py by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                  if p])
    os.environ["WORLD_SIZE"] = str(args.world_size)
    if args.worker is not None:
        _worker(args.worker, args.out)
        return 0

    names = _all_tests(args.pattern)
    out_dir = args.out or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "kolo-torch-suite-%d" % os.getpid())
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    procs = []
    for s in range(args.shards):
        share = names[s::args.shards]
        if not share:
            continue
        path = os.path.join(out_dir, "shard%d.jsonl" % s)
        open(path, "w").close()
        log = open(os.path.join(out_dir, "shard%d.log" % s), "w")
        procs.append((path, subprocess.Popen(
            [sys.executable, __file__, "--world-size", str(args.world_size),
             "--out", path, "--worker"] + share,
            stdout=log, stderr=subprocess.STDOUT)))
    for _, p in procs:
        p.wait()
    results = {}
    for path, _ in procs:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                results[r["test"]] = r
    passed, known, skipped, bad = [], [], [], []
    for name in names:
        r = results.get(name)
        if r is None:
            bad.append((name, "no result (the shard died: see %s)" % out_dir))
        elif r["outcome"] == "passed":
            if name in KNOWN_FAILURES:
                bad.append((name, "passes but is listed in KNOWN_FAILURES"))
            else:
                passed.append(name)
        elif r["outcome"] == "skipped":
            skipped.append((name, r["detail"]))
        elif name in KNOWN_FAILURES:
            known.append(name)
        else:
            bad.append((name, r["detail"]))
        if r is not None:
            print("%-8s %-70s %6.1f s" % (r["outcome"], name, r["seconds"]))
    for name, reason in skipped:
        print("skipped: %s: %s" % (name, reason.strip().splitlines()[0]
                                   if reason.strip() else "(no reason)"))
    for name in known:
        print("known failure: %s: %s" % (name, KNOWN_FAILURES[name]))
    for name, detail in bad:
        print("=== FAILED %s\n%s" % (name, detail))
    if not names:
        bad.append(("(none)", "no test of the suite matched -k %r" %
                    args.pattern))
    counts = "%d passed, %d known failures, %d skipped, %d failed; %d s" % (
        len(passed), len(known), len(skipped), len(bad),
        time.monotonic() - started)
    print("%s python/%s (%s)" % ("FAILED" if bad else "PASSED", args.label,
                                 counts))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

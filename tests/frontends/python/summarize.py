"""Combines the JUnit files of every rank of one pytest session (see
run_ranks.sh): a test passed when it passed on every rank."""

import glob
import os
import sys
import xml.etree.ElementTree as ET


TAIL_LINES = 40


def outcomes(path, reasons):
    """test id -> "passed" | "failed" | "skipped" for one rank's file; the
    failure text of each failed test goes into ``reasons[test_id]``."""
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = "%s::%s" % (case.get("classname"), case.get("name"))
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            result[test_id] = "failed"
            text = failure.text or failure.get("message") or ""
            reasons.setdefault(test_id, "\n".join(
                text.splitlines()[-TAIL_LINES:]))
        elif case.find("skipped") is not None:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


def main():
    out, np = sys.argv[1], int(sys.argv[2])
    label = sys.argv[3] if len(sys.argv) > 3 else "np%d" % np
    files = sorted(glob.glob(os.path.join(out, "np%d-rank*.xml" % np)))
    reasons = {}
    per_rank = [outcomes(f, reasons) for f in files]
    ok = len(files) == np
    if not ok:
        print("FAILED python/%s: %d of %d ranks wrote results" %
              (label, len(files), np))
    ids = sorted(set().union(*per_rank)) if per_rank else []
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for test_id in ids:
        seen = [r.get(test_id, "missing") for r in per_rank]
        if all(s == "passed" for s in seen) and len(seen) == np:
            verdict = "passed"
        elif all(s == "skipped" for s in seen):
            verdict = "skipped"
        else:
            verdict = "failed"
            ok = False
        counts[verdict] += 1
        detail = "" if verdict != "failed" else " (%s)" % ", ".join(
            "rank %d: %s" % (r, s) for r, s in enumerate(seen))
        print("%s python/%s/%s%s" % (verdict.upper(), label, test_id, detail))
        if verdict == "failed" and test_id in reasons:
            # The end of the first failing rank's report, so that a CI log
            # says why (the pytest output itself is cut to its last lines).
            for line in reasons[test_id].splitlines():
                print("    | " + line)
    print("python/%s: %d passed, %d failed, %d skipped" %
          (label, counts["passed"], counts["failed"], counts["skipped"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

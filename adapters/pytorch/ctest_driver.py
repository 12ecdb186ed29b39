"""CTest driver: export -> train with an example -> certify, and check.

    python3 ctest_driver.py --accumcheck BIN --scenario S.toml \
        --example examples/train_x.py --work DIR --expect-exit N \
        [--expect-pitfall ID] [--expect-text TEXT ...]

Passes when certify exits with N and, for a FAIL, its diagnosis line says
"matches ID" (ID first among any ties), and its output holds every TEXT.
Prints the margin line the README reports: "max error X of bound" for a
PASS, the runner-up's ratio for a FAIL.
"""
import argparse
import os
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accumcheck", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--expect-exit", type=int, required=True)
    ap.add_argument("--expect-pitfall")
    ap.add_argument("--expect-text", action="append", default=[])
    args = ap.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    bundle = os.path.join(args.work, "bundle")
    trace = os.path.join(args.work, "trace")
    subprocess.run([args.accumcheck, "export", args.scenario, "--out", bundle, "--quiet"],
                   check=True)
    subprocess.run([sys.executable, args.example, "--bundle", bundle, "--out", trace],
                   check=True)
    cert = subprocess.run([args.accumcheck, "certify", os.path.join(bundle, "scenario.toml"),
                           "--trace", trace, "--junit", os.path.join(args.work, "junit.xml")],
                          capture_output=True, text=True)
    sys.stdout.write(cert.stdout)
    sys.stderr.write(cert.stderr)
    if cert.returncode != args.expect_exit:
        print("driver: certify exited %d, expected %d" % (cert.returncode, args.expect_exit))
        return 1
    if args.expect_pitfall:
        want = "diagnosis: matches %s " % args.expect_pitfall
        want_tie = "diagnosis: matches, tied (all within the bound): %s " % args.expect_pitfall
        if want not in cert.stdout and want_tie not in cert.stdout:
            print("driver: the diagnosis does not name %s first" % args.expect_pitfall)
            return 1
    for text in args.expect_text:
        if text not in cert.stdout:
            print("driver: certify's output does not say: %s" % text)
            return 1
    if not os.path.exists(os.path.join(args.work, "junit.xml")):
        print("driver: no JUnit file")
        return 1
    print("driver: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

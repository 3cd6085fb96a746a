#!/usr/bin/env python3
"""stitch-replay --html opened in a real headless browser.

Writes the page for a trace (with --capacity, so that it has OOM explanations, and --fits), opens
it in headless Chromium (Debian's chromium package; scripts/setup.sh installs it where it can) and
checks that every plot rendered (the page's own script counts the <svg> plots with a non-empty
bounding box into <body data-plots-rendered="N/M">), that the dumped DOM has the sections, and that
the browser's console showed nothing (no "CONSOLE" line on its log). Exits 77 (skipped) with a
message when no Chromium can be found.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def find_browser():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replay", required=True, help="the stitch-replay binary")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--capacity", default="8GiB")
    ap.add_argument("--fits", default="8GiB,16GiB")
    args = ap.parse_args()

    browser = find_browser()
    if browser is None:
        print("SKIPPED: no Chromium found (apt-get install chromium, or run scripts/setup.sh)")
        return SKIP

    with tempfile.TemporaryDirectory(prefix="stitch_html_") as work:
        page = os.path.join(work, "report.html")
        replay = subprocess.run([args.replay, "--no-progress", "--capacity", args.capacity,
                                 "--fits=" + args.fits, "--html", page, args.trace],
                                capture_output=True, text=True, timeout=600)
        if replay.returncode != 0 or not os.path.exists(page):
            print(f"stitch-replay failed ({replay.returncode}):\n{replay.stderr}")
            return 1
        html = open(page, encoding="utf-8").read()
        if re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html):
            print("the page refers to something on the network")
            return 1
        expected = html.count("<div class=\"plot\">")
        run = subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
                              "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                              f"--user-data-dir={os.path.join(work, 'profile')}", "--dump-dom",
                              "file://" + page],
                             capture_output=True, text=True, timeout=240)
        dom, log = run.stdout, run.stderr
        if run.returncode != 0 or "<body" not in dom:
            if "cannot open display" in log or "Missing X server" in log:
                print(f"SKIPPED: {browser} cannot run headless here:\n{log[-2000:]}")
                return SKIP
            print(f"{browser} failed ({run.returncode}):\n{log[-4000:]}")
            return 1
        failures = []
        console = [line for line in log.splitlines() if "CONSOLE" in line]
        if console:
            failures.append("the console showed:\n  " + "\n  ".join(console))
        m = re.search(r'data-plots-rendered="(\d+)/(\d+)"', dom)
        if not m:
            failures.append("the page's check did not run (no data-plots-rendered on <body>)")
        else:
            ok, total = int(m.group(1)), int(m.group(2))
            if total != expected or total == 0 or ok != total:
                failures.append(f"plots rendered: {ok} of {total} (the page has {expected})")
        for section in ("Configurations", "Breakdown at the peak", "Fits on which device",
                        "Out-of-memory explanations"):
            if section not in dom:
                failures.append(f"no '{section}' section in the rendered page")
        if failures:
            print("\n".join(failures))
            return 1
        print(f"{browser}: {m.group(1)} of {m.group(2)} plots rendered, no console message")
        return 0


if __name__ == "__main__":
    sys.exit(main())

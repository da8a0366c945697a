#!/usr/bin/env python3
"""Soak: browser sandboxes stepping for a long time against a running server.

Each sandbox repeats one RL step (click a field, type, click a button that
adds 50 rows; JPEG + set-of-marks observation), navigating afresh every 50
steps. Every 30 s it prints the steps so far, failed steps, and the
server's goroutines, open descriptors and resident memory (from
/metrics); with --cgroups, the memory of each sandbox's cgroup (v1) as
well. Growth in any of them over a long run is a leak.

    python3 bench/soak/soak.py --url http://127.0.0.1:8000 --key KEY \
        --sandboxes 4 --seconds 600 --cgroups
"""
import argparse
import glob
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "sdk", "python"))
from orchard import Client  # noqa: E402

PAGE = ("data:text/html,<title>soak</title><input id=q><button id=b onclick=\""
        "document.getElementById('out').textContent=document.getElementById('q').value;"
        "for(let i=0;i<50;i++){let d=document.createElement('div');d.textContent='row'+i;"
        "document.body.appendChild(d)}\">go</button><p id=out></p>")


def metrics(url, key):
    req = urllib.request.Request(url + "/metrics", headers={"X-API-Key": key})
    out = {}
    for line in urllib.request.urlopen(req).read().decode().splitlines():
        name, _, value = line.partition(" ")
        if name in ("go_goroutines", "process_open_fds", "process_resident_memory_bytes"):
            out[name] = float(value)
    return out


def cgroup_memory():
    out = []
    for d in sorted(glob.glob("/sys/fs/cgroup/memory/orchard/*/memory.stat")):
        with open(d) as f:
            for line in f:
                if line.startswith("total_rss "):
                    out.append("%s=%dM" % (d.split("/")[-2][:8], int(line.split()[1]) >> 20))
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("ORCHARD_URL", "http://127.0.0.1:8000"))
    ap.add_argument("--key", default=os.environ.get("ORCHARD_API_KEY"))
    ap.add_argument("--sandboxes", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--cgroups", action="store_true", help="print each sandbox cgroup's memory (local runtime, cgroup v1)")
    args = ap.parse_args()
    c = Client(base_url=args.url, api_key=args.key)
    steps = [0] * args.sandboxes
    failed = []

    def worker(i):
        try:
            with c.create_sandbox(kind="browser") as sb:
                end = time.time() + args.seconds
                k = 0
                while time.time() < end:
                    if k % 50 == 0:
                        sb.browser.act({"type": "navigate", "url": PAGE})
                    r = sb.browser.act([{"type": "click", "selector": "#q"},
                                        {"type": "type", "text": "hello %d" % k},
                                        {"type": "click", "selector": "#b"}],
                                       observe={"screenshot": "jpeg", "width": 640, "som": True})
                    if not r["ok"]:
                        failed.append((i, k, r["results"]))
                    k += 1
                    steps[i] = k
        except Exception as e:  # a failed rollout is reported, not fatal
            failed.append((i, "exception", repr(e)))

    print("start", metrics(args.url, args.key), flush=True)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.sandboxes)]
    for t in threads:
        t.start()
    t0 = time.time()
    while any(t.is_alive() for t in threads):
        time.sleep(30)
        m = metrics(args.url, args.key)
        print("t=%4.0fs steps=%6d failed=%d goroutines=%d fds=%d rss=%.1fMB %s" % (
            time.time() - t0, sum(steps), len(failed), m["go_goroutines"], m["process_open_fds"],
            m["process_resident_memory_bytes"] / 1e6, cgroup_memory() if args.cgroups else ""), flush=True)
    print("total steps", sum(steps), "failed", len(failed))
    for f in failed[:10]:
        print(f)
    print("end", metrics(args.url, args.key))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

"""The live dashboard's cost on a large cluster: one command, printed figures.

    python bench/dashboard.py [--nodes 5000] [--gpus 8] [--repeat 5]

On a seeded synthetic snapshot (kubecell.scheduler.observe.web.synthetic: ~85 % of GPUs taken, a third of them by
fractions): the time to build and serialise the payload, its size raw and gzipped, the size and cost of one
stream event; then, in headless chromium (skipped without it), the page load until the map is drawn (first
visit, and again with plotly.js cached) and one update: a new snapshot published until the page has drawn it.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

from starlette.applications import Starlette

from kubecell.cli.serving import serve
from kubecell.scheduler.observe.web.browser import chromium, missing, wait_until
from kubecell.scheduler.observe.web.dashboard import Dashboard
from kubecell.scheduler.observe.web.payload import build_payload, build_summary, encode
from kubecell.scheduler.observe.web.synthetic import synthetic_snapshot


def timed(action: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` runs, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def _drawn(driver: Any, cycle: int) -> bool:
    return bool(driver.execute_script("return document.getElementById('map').dataset.cycle") == str(cycle))


def server_side(snapshot: Any, repeat: int) -> None:
    build, payload = timed(lambda: build_payload(snapshot), repeat)
    dump, body = timed(lambda: encode(payload), repeat)
    squeeze, packed = timed(lambda: gzip.compress(body, compresslevel=6, mtime=0), repeat)
    event_time, event = timed(lambda: encode(build_summary(snapshot)), repeat)
    print(f"payload build        {1000 * build:8.1f} ms")
    print(f"payload serialise    {1000 * dump:8.1f} ms")
    print(f"payload gzip (lvl 6) {1000 * squeeze:8.1f} ms   (once per snapshot, shared by all pages)")
    print(f"payload size raw     {len(body) / 1e6:8.2f} MB")
    print(f"payload size gzip    {len(packed) / 1e6:8.2f} MB")
    print(f"stream event         {1000 * event_time:8.1f} ms, {len(event):,} bytes (summary + VCs, per page)")


def browser_side(snapshot: Any, nodes: int, gpus: int, repeat: int) -> None:
    source = SimpleNamespace(snapshot=snapshot)
    server = serve(Starlette(routes=Dashboard(source, min_interval=0.05).routes()), "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"{server.url}/api/snapshot", timeout=60):  # warm the payload cache
            pass
        with chromium() as driver:
            loads = []
            for _ in range(repeat):
                driver.get(f"{server.url}/")
                drawn = wait_until(driver, "the map drawn",
                                   lambda d: d.execute_script("return document.body.dataset.drawnMs"), timeout=120)
                loads.append(float(drawn))
            print(f"page load, map drawn {loads[0]:8.0f} ms   first visit (fetches plotly.js)")
            print(f"page load, map drawn {statistics.median(loads[1:] or loads):8.0f} ms   "
                  "plotly.js cached (median of the reloads)")
            updates, draws = [], []
            for cycle in range(2, 2 + repeat):
                fresh = synthetic_snapshot(nodes, gpus, seed=cycle, cycle=cycle)
                started = time.perf_counter()
                source.snapshot = fresh
                wait_until(driver, f"cycle {cycle} drawn", partial(_drawn, cycle=cycle), timeout=60)
                updates.append(time.perf_counter() - started)
                draws.append(float(driver.execute_script("return window.kubecell.drawMs")))
            print(f"one update           {1000 * statistics.median(updates):8.0f} ms   published -> drawn "
                  "(event, payload built + gzipped, fetched, parsed, drawn; median)")
            print(f"  of which map draw  {statistics.median(draws):8.0f} ms   (one page of 50 nodes)")
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    snapshot = synthetic_snapshot(args.nodes, args.gpus)
    print(f"dashboard cost: {args.nodes:,} nodes x {args.gpus} GPUs = {args.nodes * args.gpus:,} cells, "
          f"{snapshot.allocated_gpus:,.0f} GPUs allocated")
    server_side(snapshot, args.repeat)
    reason = missing()
    if reason is not None:
        print(f"browser figures skipped: {reason}")
        return 0
    browser_side(snapshot, args.nodes, args.gpus, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The dashboard screenshot of the docs (docs/images/dashboard.png), made again with one command.

    python bench/dashboard_screenshot.py [--out docs/images/dashboard.png] [--nodes 160]

Serves the dashboard on 127.0.0.1 over a seeded synthetic cluster (kubecell.scheduler.observe.web.synthetic),
publishes a series of snapshots a minute apart in the cluster's clock so the VC history has a shape, and
photographs the whole page in headless chromium. Checks the picture before writing it: a map drawn in many colours.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from starlette.applications import Starlette

from kubecell.cli.serving import serve
from kubecell.scheduler.observe.snapshot import Snapshot
from kubecell.scheduler.observe.web.browser import chromium, distinct_colours, element_box, missing, wait_until
from kubecell.scheduler.observe.web.dashboard import Dashboard
from kubecell.scheduler.observe.web.synthetic import synthetic_snapshot

ROOT = Path(__file__).resolve().parents[1]


def _drawn(driver: Any, cycle: int) -> bool:
    return bool(driver.execute_script("return document.getElementById('map').dataset.cycle") == str(cycle))


def _with_faults(snapshot: Snapshot) -> Snapshot:
    """Two unhealthy GPUs and a cordoned node on the first page, so the picture shows how they look."""
    gpus = list(snapshot.gpus)
    for g in (3, 21):
        gpus[g] = dataclasses.replace(gpus[g], healthy=False)
    nodes = list(snapshot.nodes)
    nodes[5] = dataclasses.replace(nodes[5], excluded="cordoned")
    gpus[40:48] = [dataclasses.replace(gpu, milli_allocated=0, owners=(), pods=()) for gpu in gpus[40:48]]
    return dataclasses.replace(snapshot, gpus=tuple(gpus), nodes=tuple(nodes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    parser.add_argument("--nodes", type=int, default=160)
    parser.add_argument("--rows", type=int, default=24, help="nodes per map page")
    parser.add_argument("--steps", type=int, default=14, help="snapshots published for the history chart")
    args = parser.parse_args()
    if (reason := missing()) is not None:
        print(f"no browser: {reason}", file=sys.stderr)
        return 2
    source = SimpleNamespace(snapshot=None)
    app = Starlette(routes=Dashboard(source, min_interval=0.05).routes())
    server = serve(app, "127.0.0.1", 0)
    try:
        with chromium(1400, 1000) as driver:
            start = time.time() - 60 * args.steps
            for step in range(args.steps):
                snapshot = synthetic_snapshot(args.nodes, fill=0.55 + 0.3 * step / max(1, args.steps - 1), seed=7,
                                              cycle=step + 1, taken_at=start + 60 * step, pending=8, decisions=8)
                source.snapshot = _with_faults(snapshot)
                if step == 0:
                    driver.get(f"{server.url}/?rows={args.rows}")
                wait_until(driver, f"cycle {step + 1} drawn", partial(_drawn, cycle=step + 1))
            height = int(driver.execute_script("return document.documentElement.scrollHeight"))
            driver.set_window_size(1400, min(height + 40, 4000))
            time.sleep(0.5)  # plotly's responsive layout redraws after the resize
            with tempfile.TemporaryDirectory() as tmp:
                shot = Path(tmp) / "dashboard.png"
                driver.save_screenshot(str(shot))
                colours = distinct_colours(shot, element_box(driver, "map"))
                if colours < 20:
                    (args.out.parent / "dashboard-rejected.png").write_bytes(shot.read_bytes())
                    print(f"the map looks blank ({colours} colours in {element_box(driver, 'map')}); nothing written "
                          f"(the picture: {args.out.parent / 'dashboard-rejected.png'})", file=sys.stderr)
                    return 1
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_bytes(shot.read_bytes())
            print(f"wrote {args.out} ({colours} distinct colours in the map, page {height} px tall)")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

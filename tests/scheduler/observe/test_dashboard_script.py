"""The dashboard's script, run under Node.js with a stub DOM and a stub plotly.js: what it hands plotly.

plotly.js reads trace names, legend entries and hover text as its own small HTML (``<a href>``, ``<span
style>``, ``<b>``...), so a name someone else wrote must reach it escaped, or a VC named
``<a href="https://...">`` in the tenants ConfigMap (whose keys no API server checks) puts a link of its
author's choosing on the operator's dashboard. Tables and the legend strip use ``textContent``, which is inert
whatever the text; this checks the part only plotly renders, without a browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kubecell.scheduler.observe.snapshot import NodeCell, VcState
from kubecell.scheduler.observe.web.payload import build_payload
from tests.scheduler.observe.test_dashboard_payload import gpu, small

SCRIPT = (Path(__file__).resolve().parents[3] / "src" / "kubecell" / "scheduler" / "observe" / "web" / "static"
          / "dashboard.js")
NODE = shutil.which("node") or shutil.which("nodejs")
HOSTILE = '<a href="https://attacker.example/">x</a><span style="font-size:99px">'

# Just enough of the DOM and of plotly.js for dashboard.js to draw one payload; every Plotly.react call is kept.
HARNESS = r"""
const payload = JSON.parse(process.argv[2]);
const calls = [];
function element(id) {
  return {id, dataset: {}, style: {}, hidden: false, textContent: "", className: "", children: [],
          tBodies: [{replaceWith() {}}], addEventListener() {}, on() {}, appendChild(c) { this.children.push(c); },
          append(...c) { this.children.push(...c); }, replaceChildren(...c) { this.children = c; }};
}
const elements = new Map();
globalThis.document = {
  hidden: false, body: element("body"), addEventListener() {},
  getElementById(id) { if (!elements.has(id)) elements.set(id, element(id)); return elements.get(id); },
  createElement(tag) { return element(tag); },
};
globalThis.location = {search: ""};
globalThis.window = globalThis;
globalThis.Plotly = {react(el, traces, layout) { calls.push({id: el.id, traces, layout}); }};
globalThis.fetch = async () => ({ok: true, json: async () => payload});
globalThis.EventSource = class { addEventListener() {} };
require(process.argv[1]);
setTimeout(() => process.stdout.write(JSON.stringify(calls)), 50);
"""


def plotly_calls(payload: dict[str, Any]) -> list[dict[str, Any]]:
    assert NODE is not None
    done = subprocess.run([NODE, "-e", HARNESS, str(SCRIPT), json.dumps(payload)], capture_output=True,
                          text=True, timeout=60, check=True)
    calls: list[dict[str, Any]] = json.loads(done.stdout)
    return calls


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
def test_names_others_wrote_reach_plotly_escaped() -> None:
    base = small()
    snapshot = replace(
        base,
        nodes=(*base.nodes, NodeCell("n3", f"not Ready: {HOSTILE}")),
        gpus=(*base.gpus, gpu("n3", 0, 500, (HOSTILE,), (f"ns/{HOSTILE}",), model=(HOSTILE, 1024))),
        vcs=(*base.vcs, VcState(HOSTILE, 1, 0.5, 0, 0, 0, 1)))
    calls = plotly_calls(build_payload(snapshot))
    drawn = {call["id"] for call in calls}
    assert {"map", "vc-history"} <= drawn, drawn
    history = next(call for call in calls if call["id"] == "vc-history")
    names = [trace["name"] for trace in history["traces"]]
    assert any("&lt;a href" in name for name in names), names
    for call in calls:  # a legend group is a key that groups traces, never shown
        for trace in call["traces"]:
            trace.pop("legendgroup", None)
    shown = json.dumps(calls)
    assert "<a href" not in shown, "a name reached plotly as markup"
    assert "<span" not in shown, "a name reached plotly as markup"
    assert shown.count("&lt;a href") >= 5, "hover text, excluded marks and legend all still name it"

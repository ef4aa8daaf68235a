"""Overuse detection: is every pod on this node's GPUs within the share its allocation record grants?

In ``accounting`` isolation nothing stops a pod from taking more GPU memory or more SM time than the
scheduler granted; in ``mps`` the driver caps memory and active threads, but a container can bypass MPS
(unset the pipe directory). So the agent checks, from the outside, what the pods actually use:

1. per GPU process, its memory and SM utilisation from the :class:`~kubecell.node.nvml.GpuBackend`;
2. the process's pod, from its cgroup (``/proc/<pid>/cgroup``, cgroup v1 or v2, systemd or cgroupfs
   driver): the kubelet puts every container under a ``pod<uid>`` directory, so the path names the pod's UID
   and no container runtime needs to be asked. Processes outside ``kubepods`` (the host, the driver's own
   daemons) are ignored, and so are those of the agent's own pod (the MPS servers its control daemons start);
   a utilisation no GPU can report (a driver's sentinel, NaN) counts as unsampled;
3. each pod's sum per GPU against its record (:mod:`kubecell.kube.records`): a **whole GPU is never over**;
   a share is over on **memory** as soon as it holds more than its ``memoryMiB`` (plus a tolerance: NVML
   counts the CUDA context), and over on **utilisation** only when the mean of its last ``window`` samples
   exceeds its ``milli`` share (plus a tolerance), since SM time is bursty and one hot sample means little.
   A share granted no memory (``memoryMiB`` 0, compute only) is not checked on memory: there is no number
   to hold it to. A pod using a GPU its record does not name holds nothing there, so any memory it takes is
   over. A pod without a (valid) record is **unaccounted**: it uses GPUs kubecell did not grant.

A record is written by whoever can write the pod, and can be rewritten after the pod started. So for a pod served
by kubecell's device plugin, the record counts only where the kubelet's own devices cover it (its PodResources,
``handed``), as the allocator checked before the pod started: a GPU on which the kubelet gave the pod no device
grants nothing, and a share no more milli-GPU than its slots (a whole GPU only where that GPU's device was given).
A pod using DRA claims that this node's plugin prepared is held to what the plugin prepared for them (its
checkpoint, ``Claimed``) the same way; before, such a pod that rewrote its 250 milli-GPU record to a whole GPU was
never over. A pod the agent served nothing (a share asked by labels, another device plugin's GPUs) is held to its
record as written: this agent handed it nothing to hold it to. Either way, memory is bounded by what the pod's spec
asks (``kubecell.io/gpu-memory`` or another dialect's memory resource, summed as the kubelet sums it; a pod's
resources cannot change once it exists):
a share is held to the smaller of its record's ``memoryMiB`` and that ask, and where the spec asks memory, a record
rewritten to no memory or to a whole GPU (not one whose device the kubelet gave) is held to the ask all the same
(``spec_memory_mib``).

What it reports, per pod and kind of overuse, once per *episode* (from the first sample over until
``calm_samples`` consecutive samples within the share): a Warning Event on the pod (reason ``GPUOveruse``,
with the numbers and the isolation mode, so ``kubectl describe pod`` says what happened and what was
enforced), the count ``kubecell_node_gpu_overuse_total{kind}``, and on every sample the gauges
``kubecell_node_gpu_pod_memory_bytes``, ``kubecell_node_gpu_pod_utilization_ratio`` and
``kubecell_node_gpu_pod_memory_utilization_ratio`` (the memory controller's busy share) per pod and GPU
(labels ``pod``, ``namespace``, ``node``, ``gpu``: the node names where a GPU UUID is, for the profiler and
for a Prometheus that scrapes the agents without relabelling).
With ``evict_after_seconds`` set (off by default: a detector that kills work must be opted into), a pod
still over that long after its episode began is evicted through the Eviction API, so PodDisruptionBudgets
are honoured; unaccounted pods are never evicted (kubecell does not know what they were promised).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

from kubecell.core.errors import KubecellError
from kubecell.core.model import MILLI_PER_GPU
from kubecell.kube import pods
from kubecell.kube.actions import Actions, eviction, pod_path
from kubecell.kube.records import AllocationRecord, RecordError
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.cgroups import ProcCgroups, pod_uid_of_cgroup
from kubecell.node.grants import PLUGIN_RESOURCES, Holdings, claim_names, claimed, covered, spec_memory_mib
from kubecell.node.nvml import MIB, GpuBackend

log = logging.getLogger("kubecell.node.overuse")

__all__ = ["OveruseMonitor", "ProcCgroups", "api_pods", "pod_uid_of_cgroup"]

Kind = Literal["memory", "utilization", "unaccounted"]
KINDS: Final[tuple[Kind, ...]] = ("memory", "utilization", "unaccounted")
REASON: Final = "GPUOveruse"
REASON_EVICTED: Final = "GPUOveruseEvicted"
COMPONENT: Final = "kubecell-node-agent"

DEFAULT_INTERVAL = 5.0
"""Seconds between samples: NVML's per-process utilisation covers the last few seconds anyway."""
DEFAULT_WINDOW = 6
"""Samples whose mean utilisation must exceed the share (30 s at the default interval)."""
DEFAULT_MEMORY_TOLERANCE_MIB = 256
"""MiB a share may exceed its grant by before it counts: allocator rounding and per-context overhead."""
DEFAULT_UTILIZATION_TOLERANCE = 10.0
"""Percentage points of SM utilisation above the share that are still within it."""
DEFAULT_CALM_SAMPLES = 3
"""Consecutive samples within the share that end an episode (a pod hovering at its limit is told once)."""
MAX_BACKOFF = 30.0

def _percent(value: float | None) -> float | None:
    """A per-process utilisation in percent, or None (unsampled) for one no GPU can report: negative, above
    100, or not a number. A driver's sentinel must read as "no sample", not as a pod using millions of
    percent of its GPU (which would poison the window's mean and could get the pod evicted)."""
    if value is None or not math.isfinite(value) or not 0 <= value <= 100:
        return None
    return float(value)


@dataclass(slots=True)
class Usage:
    """What one pod uses of one GPU in one sample (the sum over its processes there)."""

    gpu_index: int
    gpu_uuid: str
    memory_mib: int = 0
    utilization: float = 0.0
    """SM utilisation in percent (a process NVML did not sample in its window was idle: 0)."""
    memory_utilization: float = 0.0
    """Memory-controller utilisation in percent, as ``utilization``."""
    controller_unknown: bool = False
    """A process was sampled without a usable memory-controller reading: the pod's sum would read low."""
    pids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Episode:
    """A pod over its share in one way, from the first sample over until it calmed down."""

    kind: Kind
    started: float
    message: str = ""
    reported: bool = False
    evicted: bool = False
    calm: int = 0


@dataclass(frozen=True, slots=True)
class Finding:
    """One overuse seen in a sample: which pod, which GPU, and the message its Event carries."""

    uid: str
    kind: Kind
    gpu_uuid: str
    message: str


PodsSource = Callable[[], Iterable[Mapping[str, Any]]]
Handed = Callable[[], Mapping[tuple[str, str], Collection[str]]]
Claimed = Callable[[], Mapping[tuple[str, str], Holdings | None]]
"""(namespace, claim name) -> what the node's prepared claim takes of each GPU (the DRA plugin's checkpoint; None:
not known)."""
"""(namespace, pod name) -> the device IDs of kubecell's device plugin the kubelet gave that pod (PodResources)."""
def api_pods(kube: Kube, node: str) -> PodsSource:
    """The pods bound to ``node``, listed from the API server at each sample."""
    return lambda: kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]


def _enforced(isolation: str, kind: Kind) -> str:
    """What the pod's isolation mode promised, for the Event: the reader must know whether a limit failed
    or none existed."""
    if isolation == "mps":
        return ("isolation mps: the driver should have capped its memory (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); "
                "it may have bypassed the MPS daemon" if kind == "memory" else
                "isolation mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps its SMs per kernel, not its time share")
    return f"isolation {isolation}: not enforced, detected by the node agent"


class OveruseMonitor:
    """Samples the GPUs' processes, maps them to pods, compares with their records, and reports.

    ``sample()`` is one pass (what tests drive, with an injectable ``clock``); ``run(stop)`` samples every
    ``interval`` seconds until ``stop`` is set, backing off on errors and never dying of one."""

    def __init__(self, kube: Kube, node: str, backend: GpuBackend, pods_source: PodsSource | None,
                 registry: CollectorRegistry | None, *, proc_root: Path = Path("/proc"),
                 interval: float = DEFAULT_INTERVAL, window: int = DEFAULT_WINDOW,
                 memory_tolerance_mib: int = DEFAULT_MEMORY_TOLERANCE_MIB,
                 utilization_tolerance: float = DEFAULT_UTILIZATION_TOLERANCE,
                 calm_samples: int = DEFAULT_CALM_SAMPLES, evict_after_seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic, handed: Handed | None = None,
                 claimed: Claimed | None = None) -> None:
        if window < 1 or calm_samples < 1 or interval <= 0:
            raise KubecellError(f"overuse monitor: window ({window}) and calm_samples ({calm_samples}) must be >= 1 "
                                f"and interval ({interval}) > 0")
        if evict_after_seconds is not None and evict_after_seconds < 0:
            raise KubecellError(f"overuse monitor: evict_after_seconds is {evict_after_seconds}; "
                                "accepted: a number of seconds >= 0, or None (never evict)")
        self.kube = kube
        self.node = node
        self.backend = backend
        self.pods_source = pods_source or api_pods(kube, node)
        self.handed = handed
        """What the kubelet gave the pods kubecell's device plugin serves, which bounds their records (``covered``);
        None: every record is taken as written."""
        self.claimed = claimed
        """What this node's DRA plugin prepared for each claim, which bounds the records of the pods using them
        (``grants.claimed``); None: no DRA plugin here."""
        self.cgroups = ProcCgroups(proc_root)
        self.own_pod_uid = self.cgroups.own_pod_uid()
        """The agent's own pod: the MPS control daemons it runs start ``nvidia-cuda-mps-server`` in its cgroup,
        and NVML lists that server as a compute process; it is the driver's daemon, not a pod's use."""
        self.interval = interval
        self.window = window
        self.memory_tolerance_mib = memory_tolerance_mib
        self.utilization_tolerance = utilization_tolerance
        self.calm_samples = calm_samples
        self.evict_after_seconds = evict_after_seconds
        self.clock = clock
        self.actions = Actions(kube, COMPONENT, host=node)
        self.memory_bytes = Gauge("kubecell_node_gpu_pod_memory_bytes", "GPU memory a pod's processes hold on a GPU",
                                  ["pod", "namespace", "node", "gpu"], registry=registry)
        self.utilization = Gauge("kubecell_node_gpu_pod_utilization_ratio", "SM utilisation of a pod's processes on "
                                 "a GPU in the last sample (0..1 of the GPU)", ["pod", "namespace", "node", "gpu"],
                                 registry=registry)
        self.memory_utilization = Gauge("kubecell_node_gpu_pod_memory_utilization_ratio", "Memory-controller "
                                        "utilisation of a pod's processes on a GPU in the last sample (0..1)",
                                        ["pod", "namespace", "node", "gpu"], registry=registry)
        self.overuse_total = Counter("kubecell_node_gpu_overuse", "Overuse episodes begun, by kind: memory (above "
                                     "the grant), utilization (sustained above the share), unaccounted (a pod "
                                     "without an allocation record using a GPU)", ["kind"], registry=registry)
        self.evictions_total = Counter("kubecell_node_gpu_overuse_evictions", "Pods evicted for sustained overuse",
                                       registry=registry)
        for kind in KINDS:
            self.overuse_total.labels(kind=kind)  # every kind is exported from the start, at 0
        self.windows: dict[tuple[str, str], deque[float]] = {}
        """(pod UID, GPU UUID) -> the last ``window`` utilisation samples."""
        self.parent_of: dict[str, str] = {}
        """MIG instance UUID -> its GPU's UUID: NVML lists a MIG pod's processes on the GPU, not the instance."""
        self.memory_of: dict[str, int] = {}
        """GPU UUID -> its MiB, as the last sample read them (what HAMi's memory percentage is of)."""
        self.episodes: dict[tuple[str, Kind], Episode] = {}
        self._series: set[tuple[str, str, str, str]] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ one pass
    def sample(self) -> list[Finding]:
        """Read the GPUs and the pods once; update metrics and episodes; send Events and evictions.
        Returns what is over in this sample (for tests and logs)."""
        with self._lock:
            usage = self._usage()
            # no GPU process in any pod: nothing to compare, and no API call on an idle node
            listed = {pods.uid(pod): pod for pod in self.pods_source()} if usage else {}
            self._export(usage, listed)
            findings = self._compare(usage, listed, self._handed(usage, listed), self._claimed(usage, listed))
            self._track(findings, listed)
            return findings

    def _usage(self) -> dict[str, dict[str, Usage]]:
        """Pod UID -> GPU UUID -> usage, over every GPU's processes; host processes left out."""
        found: dict[str, dict[str, Usage]] = {}
        devices = self.backend.devices()
        self.parent_of = {m.uuid: device.uuid for device in devices for m in device.mig_instances}
        self.memory_of = {device.uuid: device.memory_mib for device in devices}
        for device in devices:
            for process in self.backend.processes(device.index):
                uid = self.cgroups.pod_uid(process.pid)
                if uid is None or uid == self.own_pod_uid:
                    continue  # the host's, or the MPS servers the agent's own control daemons started
                usage = found.setdefault(uid, {}).setdefault(device.uuid, Usage(device.index, device.uuid))
                usage.memory_mib += process.memory_mib
                sm, controller = _percent(process.utilization_percent), _percent(process.memory_utilization_percent)
                usage.utilization += sm or 0
                usage.memory_utilization += controller or 0
                if sm is not None and controller is None:
                    usage.controller_unknown = True
                usage.pids.append(process.pid)
        return found

    def _export(self, usage: Mapping[str, Mapping[str, Usage]], listed: Mapping[str, Mapping[str, Any]]) -> None:
        """Set the per-pod gauges; drop the series of pods and GPUs no longer in use."""
        series: set[tuple[str, str, str, str]] = set()
        for uid, gpus in usage.items():
            pod = listed.get(uid)
            name, namespace = (pod["metadata"]["name"], pod["metadata"].get("namespace", "default")) if pod \
                else (f"uid:{uid}", "")
            for gpu, used in gpus.items():
                labels = (name, namespace, self.node, gpu)
                series.add(labels)
                self.memory_bytes.labels(*labels).set(used.memory_mib * MIB)
                self.utilization.labels(*labels).set(min(used.utilization, 100.0) / 100.0)
                if used.controller_unknown:  # no series rather than one that reads low
                    with contextlib.suppress(KeyError):
                        self.memory_utilization.remove(*labels)
                else:
                    self.memory_utilization.labels(*labels).set(min(used.memory_utilization, 100.0) / 100.0)
        for labels in self._series - series:
            for gauge in (self.memory_bytes, self.utilization, self.memory_utilization):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
        self._series = series

    def _handed(self, usage: Mapping[str, Mapping[str, Usage]],
                listed: Mapping[str, Mapping[str, Any]]) -> Mapping[tuple[str, str], Collection[str]] | None:
        """The kubelet's devices of the pods using GPUs, read only where one of them is served by kubecell's device
        plugin; None where unknown (no source, or the kubelet does not answer: records as written, this sample)."""
        if self.handed is None or not any(uid in listed and pods.asks_for_any(listed[uid], PLUGIN_RESOURCES)
                                          for uid in usage):
            return None
        try:
            return self.handed()
        except (KubecellError, OSError) as error:
            log.warning("the kubelet's PodResources cannot be read (%s): the records of pods kubecell's device "
                        "plugin served are taken as written in this sample", error)
            return None

    def _claimed(self, usage: Mapping[str, Mapping[str, Usage]], listed: Mapping[str, Mapping[str, Any]]
                 ) -> Mapping[tuple[str, str], Holdings | None] | None:
        """The node's prepared claims, read only where a pod using GPUs uses a claim; None where there is no DRA
        plugin here (or none of them does)."""
        if self.claimed is None or not any(uid in listed and claim_names(listed[uid]) for uid in usage):
            return None
        return self.claimed()

    def _compare(self, usage: Mapping[str, Mapping[str, Usage]], listed: Mapping[str, Mapping[str, Any]],
                 handed: Mapping[tuple[str, str], Collection[str]] | None = None,
                 prepared: Mapping[tuple[str, str], Holdings | None] | None = None) -> list[Finding]:
        findings: list[Finding] = []
        seen_windows: set[tuple[str, str]] = set()
        for uid, gpus in usage.items():
            pod = listed.get(uid)
            record, problem = self._record(pod) if pod is not None else (None, "no pod bound to this node has that UID")
            if record is None:
                total = sum(u.memory_mib for u in gpus.values())
                where = ", ".join(f"GPU {u.gpu_index} ({u.gpu_uuid})" for u in gpus.values())
                findings.append(Finding(uid, "unaccounted", next(iter(gpus)),
                                        f"uses {total} MiB on {where} but {problem}: its GPU use is unaccounted "
                                        "(kubecell granted it nothing)"))
                continue
            assert pod is not None
            named = {self.parent_of.get(gpu.uuid, gpu.uuid): gpu for gpu in record.gpus}
            held = record.gpus
            served = handed is not None and pods.asks_for_any(pod, PLUGIN_RESOURCES)  # by the device plugin
            if handed is not None and served:
                held = covered(record, handed.get((pod["metadata"].get("namespace", "default"),
                                                   pod["metadata"]["name"]), ()))
            namespace = str(pod["metadata"].get("namespace", "default"))
            mine = [prepared[(namespace, c)] for c in claim_names(pod) if (namespace, c) in prepared] \
                if prepared is not None else []
            if mine and all(part is not None for part in mine):  # what this agent prepared bounds the record
                held, served = claimed(record, _summed(part for part in mine if part is not None),
                                       self.parent_of), True
            # a MIG instance is the pod's own (the hardware bounds it): its processes on the GPU are never over
            grants = {self.parent_of.get(gpu.uuid, gpu.uuid): gpu for gpu in held}
            # what is left of it: the spec's ask bounds all the pod's shares together
            asked = spec_memory_mib(pod, max(self.memory_of.get(gpu, 0) for gpu in gpus))
            for gpu_uuid, used in gpus.items():
                grant = grants.get(gpu_uuid)
                if grant is not None and grant.milli >= MILLI_PER_GPU and (asked is None or served):
                    continue  # a whole GPU is the pod's own: it cannot be over (one its record alone names, while
                    # its spec asks memory, is a share rewritten: held to the ask)
                milli = grant.milli if grant else 0
                memory = grant.memory_mib if grant else 0
                bound = ""
                if asked is not None and grant is not None:
                    if not memory or memory > asked:
                        bound = (f" (its record says {memory} MiB, but its spec asks {asked} MiB)" if memory
                                 else f" (its record grants no MiB; its spec asks {asked} MiB)")
                        memory = asked
                    asked -= memory
                on = f"GPU {used.gpu_index} ({gpu_uuid})"
                if grant is None:
                    on += (", which its record names but on which the kubelet gave it no device" if gpu_uuid in named
                           else ", which its record does not name")
                elif grant.milli != named[gpu_uuid].milli:
                    on += (f", of which its record names {named[gpu_uuid].milli} milli-GPU but the kubelet gave it "
                           f"{grant.milli} slots")
                checked = memory or grant is None or bound
                if checked and used.memory_mib > memory + self.memory_tolerance_mib:
                    findings.append(Finding(uid, "memory", gpu_uuid,
                                            f"uses {used.memory_mib} MiB of {on}; its allocation "
                                            f"{record.allocation_id} grants {memory} MiB{bound} "
                                            f"(+{self.memory_tolerance_mib} MiB tolerance); "
                                            f"{_enforced(record.isolation, 'memory')}"))
                key = (uid, gpu_uuid)
                seen_windows.add(key)
                samples = self.windows.setdefault(key, deque(maxlen=self.window))
                samples.append(used.utilization)
                share = milli / 10
                if len(samples) == self.window:
                    mean = sum(samples) / len(samples)
                    if mean > share + self.utilization_tolerance:
                        findings.append(Finding(
                            uid, "utilization", gpu_uuid,
                            f"used {mean:.0f}% of {on}'s SMs on average over the last {self.window} samples "
                            f"({self.window * self.interval:.0f} s); its allocation {record.allocation_id} grants "
                            f"{share:.0f}% (+{self.utilization_tolerance:.0f} points tolerance); "
                            f"{_enforced(record.isolation, 'utilization')}"))
        for key in set(self.windows) - seen_windows:
            del self.windows[key]  # its processes are gone: a later return starts a fresh window
        return findings

    @staticmethod
    def _record(pod: Mapping[str, Any]) -> tuple[AllocationRecord | None, str]:
        try:
            record = pods.record_of(pod)
        except RecordError as error:
            return None, f"its allocation record cannot be trusted ({error})"
        return (record, "") if record is not None else (None, "it has no kubecell allocation record")

    # ------------------------------------------------------------------ episodes, Events, evictions
    def _track(self, findings: list[Finding], listed: Mapping[str, Mapping[str, Any]]) -> None:
        now = self.clock()
        current: dict[tuple[str, Kind], Finding] = {}
        for finding in findings:
            current.setdefault((finding.uid, finding.kind), finding)
        for key, finding in current.items():
            episode = self.episodes.get(key)
            if episode is None:
                episode = self.episodes[key] = Episode(finding.kind, now)
                self.overuse_total.labels(kind=finding.kind).inc()
                log.warning("pod %s on %s: %s overuse: %s", self._name(finding.uid, listed), self.node,
                            finding.kind, finding.message)
            episode.calm = 0
            episode.message = finding.message
            pod = listed.get(finding.uid)
            if pod is None:
                continue  # a pod the API does not list here (just deleted, a static pod): logged and counted only
            if not episode.reported:
                episode.reported = self._event(pod, "Warning", REASON, f"GPU overuse ({finding.kind}): "
                                               f"{finding.message}")
            if (self.evict_after_seconds is not None and finding.kind != "unaccounted" and not episode.evicted
                    and now - episode.started >= self.evict_after_seconds):
                episode.evicted = self._evict(pod, finding, now - episode.started)
        for key in [k for k in self.episodes if k not in current]:
            episode = self.episodes[key]
            episode.calm += 1
            if episode.calm >= self.calm_samples:
                del self.episodes[key]
                log.info("pod %s: %s overuse ended", self._name(key[0], listed), episode.kind)

    @staticmethod
    def _name(uid: str, listed: Mapping[str, Mapping[str, Any]]) -> str:
        pod = listed.get(uid)
        return pods.key(pod) if pod is not None else f"with UID {uid}"

    def _event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> bool:
        """Send an Event; ``Actions.event`` logs and swallows API errors (an Event is advice), so an episode
        counts as reported once it was tried: at most one Event per pod and kind per episode."""
        self.actions.event(pod, kind, reason, message, counted=False)
        return True

    def _evict(self, pod: Mapping[str, Any], finding: Finding, lasted: float) -> bool:
        """Evict through the Eviction API (the body ``Actions.evict`` uses: PDBs honoured, the UID
        precondition keeps a pod recreated under the name safe). True once the pod is evicted or gone;
        False when a PodDisruptionBudget refused (429) or the API failed, so the next sample tries again."""
        try:
            self.kube.create(f"{pod_path(pod)}/eviction", eviction(pod))
        except ApiError as error:
            if error.not_found:
                return True
            log.warning("eviction of %s for GPU overuse refused (%s); retrying at the next sample",
                        pods.key(pod), error)
            return False
        self.evictions_total.inc()
        log.warning("evicted %s: GPU %s overuse for %.0f s", pods.key(pod), finding.kind, lasted)
        self._event(pod, "Warning", REASON_EVICTED, f"evicted after {lasted:.0f} s of GPU overuse "
                                                    f"({finding.kind}; evict_after_seconds "
                                                    f"{self.evict_after_seconds:g}): {finding.message}")
        return True

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event) -> None:
        """Sample every ``interval`` seconds until ``stop``; errors back off (bounded) and never end the loop."""
        backoff = 0.0
        while not stop.is_set():
            try:
                self.sample()
                backoff, pause = 0.0, self.interval
            except (KubecellError, OSError) as error:
                backoff = min(MAX_BACKOFF, backoff * 2 or 0.5)
                pause = max(backoff, 0.0)
                log.warning("overuse sample on %s failed (%s); retrying in %.1f s", self.node, error, pause)
            except Exception:  # a bug must not end detection for the node's lifetime
                backoff = min(MAX_BACKOFF, backoff * 2 or 0.5)
                pause = backoff
                log.exception("overuse sample on %s: unexpected error", self.node)
            stop.wait(pause)


def _summed(parts: Iterable[Holdings]) -> dict[str, tuple[int, int]]:
    """What several claims of one pod take of each GPU together."""
    total: dict[str, tuple[int, int]] = {}
    for part in parts:
        for gpu, (milli, memory) in part.items():
            before = total.get(gpu, (0, 0))
            total[gpu] = (min(MILLI_PER_GPU, before[0] + milli), before[1] + memory)
    return total

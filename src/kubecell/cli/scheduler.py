"""``kubecell scheduler``: place the pods whose ``schedulerName`` is kubecell's, on a real cluster."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from kubecell.cli.output import configure_logging
from kubecell.cli.service import default_identity, run
from kubecell.core.digits import decimal_digits
from kubecell.core.engine.options import PRESETS, QUEUE_ORDERS
from kubecell.core.errors import InvalidInputError
from kubecell.core.interference.admission import RULE_SYNTAX, parse_rule
from kubecell.core.interference.history import MEASURED_FLOOR, informed_by_pairs
from kubecell.core.placement.registry import DEFAULT_POLICY, canonical_policy_name
from kubecell.kube.leader_label import PodRef
from kubecell.kube.rest import Kube
from kubecell.scheduler.options import SchedulerOptions


def listen_address(text: str) -> tuple[str, int] | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    if not decimal_digits(port) or not 0 < int(port) < 65536:
        raise InvalidInputError(f"--listen {text!r}", field="listen", accepted="HOST:PORT, e.g. 127.0.0.1:10259, "
                                "or '' for no HTTP server")
    return host or "0.0.0.0", int(port)


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""Where a pod's service account names its namespace (used when ``POD_NAMESPACE`` is not set)."""


def own_pod(name: str, namespace: str, *, fallback: Path = SERVICE_ACCOUNT_NAMESPACE) -> PodRef | None:
    """This replica's Pod, when the Downward API names it; ``None`` outside a pod (nothing is labelled)."""
    if not name:
        return None
    if not namespace and fallback.is_file():
        namespace = fallback.read_text().strip()
    if not namespace:
        logging.getLogger("kubecell.leader").warning(
            "POD_NAME is %r but the namespace is unknown (set POD_NAMESPACE from metadata.namespace): the "
            "leader will not label its Pod", name)
        return None
    return PodRef(namespace, name)


Kubeconfig = Annotated[Path | None, typer.Option(help="Kubeconfig (default: the pod's service account).")]
Tenancy = Annotated[str, typer.Option(help="Tenancy preset: " + ", ".join(PRESETS) + ".")]
Placement = Annotated[str, typer.Option(help="Placement policy (see 'kubecell policies').")]
TenantsNamespace = Annotated[str, typer.Option(help="Namespace of the tenants ConfigMap and the Lease.")]
LeaderElect = Annotated[bool, typer.Option("--leader-elect/--no-leader-elect",
                                           help="Elect a leader through a Lease (run several replicas).")]
Identity = Annotated[str, typer.Option(help="Leader-election identity (default: the pod name, else host name and "
                                            "pid).")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Log every decision.")]
ReleaseTerminating = Annotated[bool, typer.Option(
    "--release-terminating", help=("Give a pod's GPUs to others as soon as its deletion starts. By default a "
                                   "terminating pod holds them until it is gone, as kube-scheduler counts it, so "
                                   "work that checkpoints on SIGTERM never shares its GPUs with its successor."))]
PodName = Annotated[str, typer.Option(envvar="POD_NAME", help=(
    "This replica's Pod (Downward API; '' outside a pod): the leader labels it kubecell.io/leader=true, "
    "which the Service kubecell-extender selects."))]
PodNamespace = Annotated[str, typer.Option(envvar="POD_NAMESPACE", help=(
    "The namespace of --pod-name (Downward API; default: the service account's namespace)."))]


History = Annotated[str, typer.Option(help=(
    "The profiler's job history (a SQLAlchemy URL, as 'kubecell profile --db'): each job's family run time and "
    "solo use, for --queue-order shortest-expected and --colocation. Needs the profiler extra. '' for none."))]
QueueOrder = Annotated[str, typer.Option(help="Inside a VC: 'age' or 'shortest-expected' (from --history).")]
PlaceByUse = Annotated[bool, typer.Option("--place-by-use", help=(
    "Place a GPU share at the share its family needed (from --history), when less than it asked; the allocation "
    "record, and so MPS's limit, grants that smaller share. Only shares asked by labels (KubeShare's): one asked "
    "as an extended resource or a ResourceClaim is counted by Kubernetes as asked, and keeps it."))]
Colocation = Annotated[str, typer.Option(help="Which shares may share a GPU: " + RULE_SYNTAX + "; '' packs by "
                                         "capacity alone.")]
DEFAULT_PAIR_FLOOR = MEASURED_FLOOR
PairFloor = Annotated[float, typer.Option(help=(
    "With --history and --colocation: two families the history saw share a GPU (time-sliced, each observed for "
    "5 minutes or more) share again when each ran at this fraction of its solo speed or faster beside the other, "
    "and never otherwise; other pairs follow --colocation (under an IDLE/BUSY rule, only while nothing waits). "
    "0: the history's pairs are not asked."))]
BackfillMargin = Annotated[float, typer.Option(help=(
    "With --history: a job may start on nodes held for a starving job when now + this x its family's expected "
    "run time is no later than the expected end of every job running there (EASY backfill by history; a job "
    "or a runner without history waits). At least 1 (3 measured safest, with --queue-order shortest-expected: "
    "docs/profiler.md); 0 (the default): reserved nodes take no other work."))]


def learned(history: str, queue_order: str, colocation: str, place_by_use: bool = False,
            pair_floor: float = DEFAULT_PAIR_FLOOR, backfill_margin: float = 0.0) -> dict[str, Any]:
    """The SchedulerOptions fields of the knowledge options, checked before the cluster is touched."""
    if place_by_use and not history:
        raise InvalidInputError("--place-by-use needs --history", field="place-by-use",
                                accepted="--history URL --place-by-use")
    if not (backfill_margin == 0 or (math.isfinite(backfill_margin) and backfill_margin >= 1)):
        raise InvalidInputError(f"--backfill-margin {backfill_margin}", field="backfill-margin",
                                accepted="0 (no backfill) or a finite number >= 1, e.g. 3")
    if backfill_margin and not history:
        raise InvalidInputError("--backfill-margin needs --history (run times come from it)",
                                field="backfill-margin", accepted="--history URL --backfill-margin 3")
    if not (pair_floor == 0 or 0 < pair_floor <= 1):
        raise InvalidInputError(f"--pair-floor {pair_floor}", field="pair-floor",
                                accepted="a fraction of solo speed in (0, 1], e.g. 0.95; 0 for none")
    if queue_order not in QUEUE_ORDERS:
        raise InvalidInputError(f"--queue-order {queue_order!r}", field="queue-order", accepted=", ".join(QUEUE_ORDERS))
    fields: dict[str, Any] = {"queue_order": queue_order, "place_by_use": place_by_use,
                              "backfill_margin": backfill_margin or None,
                              "colocation": parse_rule(colocation, field="colocation") if colocation else None}
    if history:
        try:
            from kubecell.profiler.history import JobHistory
            from kubecell.profiler.knowledge import HistoryKnowledge
        except ImportError as error:
            raise InvalidInputError(f"--history needs the profiler extra ({error})", field="history",
                                    accepted="pip install 'kubecell[profiler]'") from None
        knowledge = fields["knowledge"] = HistoryKnowledge(JobHistory.open(history))
        if fields["colocation"] is not None and pair_floor > 0:
            fields["colocation"] = informed_by_pairs(fields["colocation"], knowledge, pair_floor)
    return fields


def _prepare(tenancy: str, verbose: bool) -> None:
    """What both modes check and set up before they talk to the cluster."""
    if tenancy not in PRESETS:
        raise InvalidInputError(f"unknown tenancy preset {tenancy!r}", field="tenancy", accepted=", ".join(PRESETS))
    configure_logging(verbose)


def scheduler(
    kubeconfig: Kubeconfig = None,
    name: Annotated[str, typer.Option(help="The schedulerName of the pods to place.")] = "kubecell",
    tenancy: Tenancy = "kubecell",
    placement: Placement = DEFAULT_POLICY,
    tenants_namespace: TenantsNamespace = "kubecell-system",
    listen: Annotated[str, typer.Option(help="HOST:PORT of /healthz, /readyz and /metrics ('' for none).")] = (
        "0.0.0.0:10259"),
    leader_elect: LeaderElect = True,
    identity: Identity = "",
    pod_name: PodName = "",
    pod_namespace: PodNamespace = "",
    release_terminating: ReleaseTerminating = False,
    history: History = "",
    queue_order: QueueOrder = "age",
    colocation: Colocation = "",
    pair_floor: PairFloor = DEFAULT_PAIR_FLOOR,
    place_by_use: PlaceByUse = False,
    backfill_margin: BackfillMargin = 0.0,
    verbose: Verbose = False,
) -> None:
    """Run kubecell's scheduler against a cluster (standalone mode, its own schedulerName)."""
    _prepare(tenancy, verbose)
    options = SchedulerOptions(name=name, tenancy=tenancy, placement=canonical_policy_name(placement),
                               tenants_namespace=tenants_namespace, release_terminating=release_terminating,
                               **learned(history, queue_order, colocation, place_by_use, pair_floor,
                                         backfill_margin))
    kube = Kube.from_kubeconfig(kubeconfig)
    run(kube, options, listen=listen_address(listen), leader_elect=leader_elect,
        identity=identity or pod_name or default_identity(), pod=own_pod(pod_name, pod_namespace))


def extender(
    kubeconfig: Kubeconfig = None,
    scheduler_names: Annotated[str, typer.Option(
        help="Comma list of the schedulerNames (kube-scheduler profiles) whose GPU pods kubecell places.")] = (
        "kubecell"),
    tenancy: Tenancy = "kubecell",
    placement: Placement = DEFAULT_POLICY,
    tenants_namespace: TenantsNamespace = "kubecell-system",
    listen: Annotated[str, typer.Option(help="HOST:PORT of /extender/<verb>, /healthz, /readyz, /metrics and "
                                             "the dashboard.")] = "0.0.0.0:10259",
    leader_elect: LeaderElect = True,
    identity: Identity = "",
    pod_name: PodName = "",
    pod_namespace: PodNamespace = "",
    release_terminating: ReleaseTerminating = False,
    history: History = "",
    queue_order: QueueOrder = "age",
    colocation: Colocation = "",
    pair_floor: PairFloor = DEFAULT_PAIR_FLOOR,
    place_by_use: PlaceByUse = False,
    backfill_margin: BackfillMargin = 0.0,
    verbose: Verbose = False,
) -> None:
    """Serve kube-scheduler as its HTTP extender (filter, prioritize, bind, preempt): the same engine and
    allocation records as 'kubecell scheduler', for clusters that keep kube-scheduler. Configure
    kube-scheduler with deploy/extender/kube-scheduler-config.yaml."""
    names = [name.strip() for name in scheduler_names.split(",") if name.strip()]
    if not names:
        raise InvalidInputError("--scheduler-names is empty", field="scheduler-names", accepted="e.g. kubecell")
    address = listen_address(listen)
    if address is None:
        raise InvalidInputError("the extender needs an HTTP port", field="listen", accepted="HOST:PORT")
    _prepare(tenancy, verbose)
    options = SchedulerOptions(name=names[0], extra_names=tuple(names[1:]), tenancy=tenancy,
                               placement=canonical_policy_name(placement), tenants_namespace=tenants_namespace,
                               extender=True, release_terminating=release_terminating,
                               **learned(history, queue_order, colocation, place_by_use, pair_floor,
                                         backfill_margin))
    kube = Kube.from_kubeconfig(kubeconfig)
    run(kube, options, listen=address, leader_elect=leader_elect, identity=identity or pod_name or default_identity(),
        pod=own_pod(pod_name, pod_namespace))

"""``NodePrepareResources`` and ``NodeUnprepareResources`` of ``gpu.kubecell.io`` (checkpoint: :mod:`.checkpoint`).

Preparing a claim means: GET the ResourceClaim (the kubelet sends namespace, name and UID only), check that
it is the object the kubelet means (same UID) and that it is allocated; take the results of this driver,
which must all be in this node's pool; look each device up in the current inventory (a device the node
does not have, or one of an unhealthy GPU, fails the claim); give each request of the claim what the device
plugin path gives a container holding the same GPUs (:func:`kubecell.node.isolation.container_allocation`
on an allocation record built from the claim, so the environment cannot drift between the two paths);
write the CDI spec (:mod:`.cdi`); remember the claim in the checkpoint; answer each device with its CDI id.

How a claim becomes a record, per request:

* a MIG instance: isolation ``mig``, the instance's UUID (a request of several instances is refused,
  as on the device plugin path: CUDA sees one MIG device per process);
* a GPU whose consumed ``compute`` is 1000 (or that has no consumed capacity: a scheduler without
  consumable capacity allocates it whole): a whole GPU, its memory the GPU's;
* otherwise a share: ``milli`` = the consumed compute, ``memoryMiB`` = the consumed memory (MiB, rounded
  up), in ``mps`` isolation when the node runs MPS and the request is one GPU (``CUDA_MPS_*`` limits from
  the consumed capacity, the agent's MPS daemon for that GPU held by the claim until it is unprepared),
  else ``accounting``.

Every problem is that claim's error string in the answer, never an exception out of the RPC: the kubelet
retries a failed claim and fails only that pod's start. That holds for a bug too (``internal error: ...``
for that claim; the others of the call are prepared), and for an allocation no scheduler should write: a
device (or share) named twice (a device may be named more than once only as shares of it, none taking it
whole), a negative consumed capacity. A restarted agent reads the checkpoint (JSON,
written with a rename), so a repeated Prepare answers as before without the API, and Unprepare removes what
an earlier process wrote. Unpreparing an unknown claim succeeds (the kubelet may repeat it); an Unprepare
that fails (the checkpoint cannot be written) keeps the claim, so the kubelet's retry still releases its
MPS daemon.

The claim is read from the API server without the preparer's lock (the checkpoint, the CDI files and the
MPS holds are under it): a slow or unreachable API server delays that claim only, not other pods' claims,
Unprepare or the MPS housekeeping. Concurrent Prepares of one claim prepare it once; an Unprepare that
arrives while a Prepare of the same claim reads it makes that Prepare fail rather than leave a spec behind.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubecell.core.errors import KubecellError
from kubecell.kube import dra_names as names
from kubecell.kube.dialects.resources import parse_quantity
from kubecell.kube.inventory_schema import NodeInventory
from kubecell.kube.records import AllocationRecord, GpuGrant
from kubecell.kube.rest import ApiError, Kube
from kubecell.node.dra import cdi
from kubecell.node.dra.checkpoint import Checkpoint, ClaimRef, PreparedClaim, PreparedDevice
from kubecell.node.dra.exclusive import Holding, held_elsewhere, holding
from kubecell.node.dra.slices import MILLI_PER_GPU, NodeDevice, all_devices
from kubecell.node.isolation import NodeIsolation, container_allocation

log = logging.getLogger("kubecell.node.dra")

MIB = 1 << 20


class PrepareError(KubecellError):
    """Why one claim cannot be prepared; its message is the claim's error in the kubelet's answer."""


@dataclass(frozen=True, slots=True)
class Allocated:
    """One allocation result of this driver and the device it names."""

    request: str
    device: NodeDevice
    share_id: str | None
    consumed: dict[str, Any]


def _ceil(value: Any, unit: int, what: str) -> int:
    try:
        amount = parse_quantity(value)
    except ValueError as error:
        raise PrepareError(f"consumed {what} {value!r}: {error}") from None
    if amount < 0:  # no scheduler consumes less than nothing: refused here, not as a record that cannot be built
        raise PrepareError(f"consumed {what} {value!r} is negative")
    return math.ceil(amount / unit)


def _consumed(consumed: Mapping[str, Any], name: str) -> Any:
    """A consumed capacity by its name or the same name qualified by the driver's domain (the API's two spellings
    of one capacity, as the scheduler reads them: a qualified ``compute`` left the share read as a whole GPU)."""
    return consumed.get(name, consumed.get(f"{names.DRIVER}/{name}"))


def grant_of(allocated: Allocated) -> GpuGrant:
    """The GPU (or MIG instance) one result holds, with its share (see the module docstring)."""
    device = allocated.device
    if device.is_mig:
        return GpuGrant(index=device.gpu.index, uuid=device.uuid, milli=MILLI_PER_GPU, memory_mib=device.memory_mib)
    consumed = allocated.consumed
    compute = _consumed(consumed, names.CAPACITY_COMPUTE)
    milli = MILLI_PER_GPU if compute is None else min(MILLI_PER_GPU, max(1, _ceil(compute, 1, "compute")))
    if milli >= MILLI_PER_GPU:
        return GpuGrant(index=device.gpu.index, uuid=device.uuid, milli=MILLI_PER_GPU, memory_mib=device.memory_mib)
    memory = _consumed(consumed, names.CAPACITY_MEMORY)
    memory_mib = 0 if memory is None else min(device.memory_mib, _ceil(memory, MIB, "memory"))
    return GpuGrant(index=device.gpu.index, uuid=device.uuid, milli=milli, memory_mib=memory_mib)


def request_record(claim: ClaimRef, node: str, members: Sequence[Allocated], modes: Iterable[str]) -> AllocationRecord:
    """The allocation record of one request of a claim: what the device plugin path would serve."""
    if len({m.device.is_mig for m in members}) > 1:
        raise PrepareError(f"request {members[0].request} holds both MIG instances and whole GPUs")
    grants: dict[str, GpuGrant] = {}
    for member in members:  # a share allocated twice on one GPU (count > 1) is one grant of the sum
        grant = grant_of(member)
        before = grants.get(grant.uuid)
        if before is not None:
            grant = grant.model_copy(update={"milli": min(MILLI_PER_GPU, before.milli + grant.milli),
                                             "memory_mib": min(member.device.memory_mib,
                                                               before.memory_mib + grant.memory_mib)})
        grants[grant.uuid] = grant
    gpus = list(grants.values())
    if members[0].device.is_mig:
        isolation = "mig"
    elif gpus[0].milli < MILLI_PER_GPU and len(gpus) == 1 and "mps" in modes:
        isolation = "mps"
    else:
        isolation = "accounting"
    return AllocationRecord(
        allocation_id=claim.uid, pod_uid=claim.uid, attempt=0, node=node, gpus=gpus, cpu_milli=0, memory_mib=0,
        isolation=isolation, job=f"{claim.namespace}/{claim.name}", vc=claim.namespace, job_class="guaranteed",
        member=0, batch=1, scheduler=f"{names.DRIVER} (DRA)", created_at=datetime.now(UTC))


def memory_by_uuid(inventory: NodeInventory) -> dict[str, int]:
    memory = {gpu.uuid: gpu.memory_mib for gpu in inventory.gpus}
    memory.update({m.uuid: m.memory_mib for gpu in inventory.gpus for m in gpu.mig_instances})
    return memory


class ClaimPreparer:
    """Prepares and unprepares this node's claims (thread-safe: the kubelet may call concurrently).

    ``inventory`` returns the agent's latest inventory (None before discovery); ``modes`` the isolation modes
    the agent gives whole GPUs and shares (``mig`` is added for instances); ``acquire`` is called with an
    ``mps`` record before it is answered (the MPS daemon must run), ``release`` with (GPU UUID, holder) when
    a claim holding it is unprepared."""

    def __init__(self, kube: Kube, node: str, *, cdi_dir: Path, checkpoint: Checkpoint,
                 inventory: Callable[[], NodeInventory | None], isolation: Callable[[], NodeIsolation],
                 acquire: Callable[[AllocationRecord], None] | None = None,
                 release: Callable[[str, str], None] | None = None) -> None:
        self.kube = kube
        self.node = node
        self.cdi_dir = cdi_dir
        self.checkpoint = checkpoint
        self.inventory = inventory
        self.isolation = isolation
        self.acquire = acquire
        self.release = release
        self.lock = threading.Lock()
        """Held for the checkpoint, the CDI files and the MPS holds; never while waiting on the API server."""
        self._reading: dict[str, int] = {}
        """Claim UID -> prepares of it reading the claim from the API server (outside the lock)."""
        self._unprepared: set[str] = set()
        """Claims unprepared while a prepare of theirs read the claim: that prepare must not complete."""
        cdi.remove_partials(cdi_dir)

    # ------------------------------------------------------------------ the two calls
    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Claim UID -> its prepared devices, or the error string for that claim. An unexpected error (a bug)
        is that claim's error too: the kubelet batches a pod's claims, and the others are prepared."""
        answers: dict[str, PreparedClaim | str] = {}
        for ref in claims:
            try:
                answers[ref.uid] = self._prepare(ref)
            except (KubecellError, OSError) as error:
                log.warning("prepare %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, error)
                answers[ref.uid] = str(error)
            except Exception as error:  # a bug: this claim's error, not the whole call's
                log.exception("prepare %s/%s (%s)", ref.namespace, ref.name, ref.uid)
                answers[ref.uid] = f"internal error: {type(error).__name__}: {error}"
        return answers

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> "" (done, also for a claim never prepared here) or the error string."""
        answers: dict[str, str] = {}
        with self.lock:
            for ref in claims:
                if ref.uid in self._reading:
                    self._unprepared.add(ref.uid)
                try:
                    self._unprepare(ref)
                    answers[ref.uid] = ""
                except (KubecellError, OSError) as error:
                    log.warning("unprepare %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, error)
                    answers[ref.uid] = str(error)
        return answers

    def mps_holders(self) -> dict[str, set[str]]:
        """GPU UUID -> the claims holding its MPS daemon (merged into the agent's MPS housekeeping)."""
        holders: dict[str, set[str]] = {}
        with self.lock:
            for uid, claim in self.checkpoint.claims.items():
                for uuid in claim.mps_gpus:
                    holders.setdefault(uuid, set()).add(uid)
        return holders

    def claim_holdings(self) -> dict[tuple[str, str], dict[str, tuple[int, int]] | None]:
        """(namespace, claim name) -> what each prepared claim takes of each physical GPU, (milli-GPU, MiB; MiB 0
        where its shares state none), for the overuse monitor; None for a claim a checkpoint of an older agent
        kept without its GPUs (unknown: its pods' records are taken as written)."""
        found: dict[tuple[str, str], dict[str, tuple[int, int]] | None] = {}
        with self.lock:
            for claim in self.checkpoint.claims.values():
                taken: dict[str, tuple[int, int]] | None = {}
                for device in claim.devices:
                    whole = device.share_id is None if device.exclusive is None else device.exclusive
                    if device.gpu is None or taken is None or not (whole or device.milli):
                        taken = None  # (a share whose compute was not kept: unknown too)
                        continue
                    milli, memory = (MILLI_PER_GPU, 0) if whole else (device.milli, device.memory_mib)
                    before = taken.get(device.gpu, (0, 0))
                    taken[device.gpu] = (min(MILLI_PER_GPU, before[0] + milli), before[1] + memory)
                found[(claim.ref.namespace, claim.ref.name)] = taken
        return found

    def prepared_claims(self) -> list[ClaimRef]:
        """The claims this node holds prepared (a snapshot)."""
        with self.lock:
            return [claim.ref for claim in self.checkpoint.claims.values()]

    def release_unused(self, ref: ClaimRef) -> bool:
        """Unprepare a claim the kubelet never unprepared (see :mod:`.sweep`); False, and nothing done, while a
        prepare of it is reading it (the kubelet means it again) or where it is prepared no more."""
        with self.lock:
            if ref.uid in self._reading or ref.uid not in self.checkpoint.claims:
                return False
            self._unprepare(ref)
            return True

    # ------------------------------------------------------------------ one claim
    def _known(self, ref: ClaimRef) -> PreparedClaim | None:
        """The claim as prepared before (maybe by an earlier agent), while its spec is there (under the lock)."""
        known = self.checkpoint.claims.get(ref.uid)
        return known if known is not None and cdi.spec_path(self.cdi_dir, ref.uid).is_file() else None

    def _prepare(self, ref: ClaimRef) -> PreparedClaim:
        """The claim is read from the API server outside the lock: a slow or unreachable server (a GET may
        take the client's whole timeout) holds up this claim only, not the other pods' prepares, every
        unprepare and the MPS housekeeping. An unprepare meanwhile wins: this prepare then fails."""
        with self.lock:
            known = self._known(ref)
            if known is not None:
                return known
            self._reading[ref.uid] = self._reading.get(ref.uid, 0) + 1
        try:
            claim = self._claim(ref)
            with self.lock:
                if ref.uid in self._unprepared:
                    raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} ({ref.uid}) was unprepared while "
                                       "it was being prepared")
                known = self._known(ref)  # a concurrent call for the same claim prepared it meanwhile
                return known if known is not None else self._prepare_claim(ref, claim)
        finally:
            with self.lock:
                left = self._reading.pop(ref.uid) - 1
                if left:
                    self._reading[ref.uid] = left
                else:
                    self._unprepared.discard(ref.uid)

    def _prepare_claim(self, ref: ClaimRef, claim: dict[str, Any]) -> PreparedClaim:
        inventory = self.inventory()
        if inventory is None:
            raise PrepareError(f"node {self.node}: the GPU inventory is not discovered yet")
        table = {device.name: device for device in all_devices(inventory)}
        by_request: dict[str, list[Allocated]] = {}
        for allocated in self._allocated(claim, table):
            by_request.setdefault(allocated.request, []).append(allocated)
        wanted = {(m.device.name, m.share_id): holding(m.device, m.share_id, grant.milli, grant.memory_mib)
                  for members in by_request.values() for m in members for grant in (grant_of(m),)}
        self._refuse_held(ref, list(wanted.values()), table)
        isolation = self.isolation()
        node_isolation = NodeIsolation((*isolation.modes, "mig"), isolation.mps_root)
        memory = memory_by_uuid(inventory)
        devices: list[cdi.CdiDevice] = []
        answers: list[PreparedDevice] = []
        mps: list[tuple[str, str]] = []
        before = self.checkpoint.claims.get(ref.uid)
        try:
            for request, members in by_request.items():
                record = request_record(ref, self.node, members, isolation.modes)
                edits = container_allocation(record, node_isolation, memory)
                if record.isolation == "mps" and self.acquire is not None:
                    self.acquire(record)
                    mps += [(gpu.uuid, ref.uid) for gpu in record.gpus]
                for member in members:
                    name = base = cdi.device_name(ref.uid, request, member.device.name)
                    k = 1
                    while any(d.name == name for d in devices):
                        name, k = f"{base}-{k}", k + 1
                    device = cdi.CdiDevice(name, edits)
                    devices.append(device)
                    held = wanted[member.device.name, member.share_id]
                    answers.append(PreparedDevice((request.split("/", 1)[0],), self.node, member.device.name,
                                                  (device.qualified,), member.share_id, held.gpu, held.exclusive,
                                                  0 if held.exclusive else held.milli,
                                                  0 if held.exclusive else held.memory_mib))
            cdi.write_spec(self.cdi_dir, ref.uid, cdi.claim_spec(devices))
            prepared = PreparedClaim(ref, tuple(answers), tuple(sorted({uuid for uuid, _ in mps})))
            self.checkpoint.claims[ref.uid] = prepared
            self.checkpoint.save()
        except BaseException:  # nothing half-done stays: no spec, no entry, no MPS hold
            # but a claim prepared before (its spec since removed) keeps its entry and holds: its pod may still
            # run on them, and without the entry another claim could be prepared on its GPU
            if before is None:
                self.checkpoint.claims.pop(ref.uid, None)
            else:
                self.checkpoint.claims[ref.uid] = before
            cdi.remove_spec(self.cdi_dir, ref.uid)
            kept = set(before.mps_gpus) if before is not None else set()
            self._release(held for held in mps if held[0] not in kept)
            raise
        log.info("prepared %s/%s (%s): %s", ref.namespace, ref.name, ref.uid,
                 ", ".join(f"{d.device}{' share ' + d.share_id if d.share_id else ''}" for d in answers))
        return prepared

    def _refuse_held(self, ref: ClaimRef, wanted: Sequence[Holding], table: Mapping[str, NodeDevice]) -> None:
        """Refuse a claim whose devices another prepared claim holds, or whose shares do not fit
        (:mod:`.exclusive`); ``table``: the node's devices by name."""
        others = {f"{c.ref.namespace}/{c.ref.name} ({uid})": [h for d in c.devices if (h := d.holding(table))]
                  for uid, c in self.checkpoint.claims.items() if uid != ref.uid}
        why = held_elsewhere(wanted, others, {name: device.memory_mib for name, device in table.items()})
        if why is not None:
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name}: {why}")

    def _claim(self, ref: ClaimRef) -> dict[str, Any]:
        try:
            claim = self.kube.get(names.claim_path(ref.namespace, ref.name))
        except ApiError as error:
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name}: {error}") from None
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid} (deleted and "
                               "created again?)")
        return claim

    def _allocated(self, claim: dict[str, Any], table: Mapping[str, NodeDevice]) -> list[Allocated]:
        where = f"ResourceClaim {claim['metadata'].get('namespace')}/{claim['metadata'].get('name')}"
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"{where} is not allocated")
        results = [r for r in ((allocation.get("devices") or {}).get("results") or [])
                   if r.get("driver") == names.DRIVER]
        if not results:
            raise PrepareError(f"{where} holds no device of {names.DRIVER}")
        elsewhere = sorted({str(r.get("pool")) for r in results if r.get("pool") != self.node})
        if elsewhere:
            raise PrepareError(f"{where} holds {names.DRIVER} devices of pool(s) {', '.join(elsewhere)}, not of "
                               f"this node's pool {self.node}")
        out = []
        seen: set[tuple[str, Any]] = set()
        for result in results:
            key = (str(result.get("device")), result.get("shareID"))
            if key in seen:  # a scheduler's bug: taken as written, the records would add the GPU to itself
                raise PrepareError(f"{where} names device {key[0]}{'' if key[1] is None else ' share ' + str(key[1])} "
                                   "more than once")
            seen.add(key)
            device = table.get(str(result.get("device")))
            if device is None:
                raise PrepareError(f"{where}: node {self.node} has no device {result.get('device')} (the GPUs or "
                                   "their MIG layout changed since it was allocated)")
            if not device.healthy:
                raise PrepareError(f"{where}: device {device.name} (GPU {device.gpu.index}, {device.gpu.uuid}) is "
                                   "unhealthy")
            share = result.get("shareID")
            out.append(Allocated(str(result.get("request", "")), device, None if share is None else str(share),
                                 dict(result.get("consumedCapacity") or {})))
        self._refuse_whole_twice(where, out)
        return out

    @staticmethod
    def _refuse_whole_twice(where: str, out: Sequence[Allocated]) -> None:
        """A device named more than once (under other share IDs) where one of those results takes it whole (a
        GPU without consumed compute, or all of it, or a MIG instance): each would be read as the whole device
        and the container told it has the device's memory as many times over. Shares of one GPU, each a part of
        it, may be named together (their sum is checked against the GPU, :mod:`.exclusive`)."""
        named: dict[str, list[Allocated]] = {}
        for allocated in out:
            named.setdefault(allocated.device.name, []).append(allocated)
        for name, results in named.items():
            if len(results) > 1 and any(r.device.is_mig or grant_of(r).milli >= MILLI_PER_GPU for r in results):
                shares = ", ".join(str(r.share_id) for r in results)
                raise PrepareError(f"{where} names device {name} more than once (share IDs {shares}), taking it whole "
                                   "in at least one: a device taken whole is named once")

    def _unprepare(self, ref: ClaimRef) -> None:
        known = self.checkpoint.claims.pop(ref.uid, None)
        try:
            cdi.remove_spec(self.cdi_dir, ref.uid)
            if known is not None:
                self.checkpoint.save()
        except BaseException:  # the kubelet retries: the retry must still find the claim and release its MPS hold
            if known is not None:
                self.checkpoint.claims[ref.uid] = known
            raise
        if known is None:
            return
        self._release([(uuid, ref.uid) for uuid in known.mps_gpus])
        log.info("unprepared %s/%s (%s)", ref.namespace, ref.name, ref.uid)

    def _release(self, held: Iterable[tuple[str, str]]) -> None:
        if self.release is None:
            return
        for uuid, holder in held:
            try:
                self.release(uuid, holder)
            except KubecellError as error:  # the housekeeping stops a daemon nobody holds anyway
                log.warning("releasing the MPS daemon of %s for %s: %s", uuid, holder, error)

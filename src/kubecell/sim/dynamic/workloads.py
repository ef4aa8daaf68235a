"""Trace loaders for the dynamic simulator: job lists in public formats -> ``list[JobSpec]``.

The public multi-tenant traces we have are not raw cluster logs but job lists other research groups
derived from them (see ``shared/data/*/SOURCE.md``), each with its own columns and units. This module
maps each format onto the engine's jobs (gangs of identical members with a topology constraint and
an amount of work), states every assumption as a named constant, and validates each row, because a
bad row in a 50,000-row file must be reported with its ``file:line`` and column, not crash a run.

Formats (detected from the header, so files can be mixed in one run):

* **Philly, PCS per-VC lists** (``pcs_osdi24_per_vc_traces/trace_<vc>.csv``, columns
  ``app_id,submit_time,service,num_jobs,sleep_time,model_name``): one job per row in VC ``<vc>``;
  ``num_jobs`` GPUs; ``service`` GPU-seconds of work. ``submit_time`` counts from the first job *of
  that VC*, so all VCs are aligned at their first job (time 0); the real Philly offsets between VCs
  are not in these files.
* **Sia workloads** (``name,time,application,num_replicas,batch_size``): the Philly, Helios-Saturn
  and newTrace job lists behind Sia's Table 3; one 1-GPU member per replica. Their durations are not
  in the files (see ``SIA_GPU_HOURS``), so results are not comparable with Sia's numbers.

The column-to-job mapping is also written up in ``docs/dynamic.md``.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubecell.core.engine.job import JobSpec
from kubecell.core.errors import InvalidInputError
from kubecell.core.model import MILLI_PER_GPU, Request, TopologyLevel

SECONDS_PER_DAY = 86_400.0

CPU_MILLI_PER_GPU = 5_000
"""Host CPU a job asks for per GPU (5 vCPU). Neither trace records CPU; Philly's 8-GPU servers have
about 48 vCPU, so 5 per GPU lets an 8-GPU member fit one server with room for system daemons."""

MEMORY_MIB_PER_GPU = 40_000
"""Host memory a job asks for per GPU (MiB). Not in the traces; 8 x 40,000 MiB fits a 384 GiB server."""

GPUS_PER_MACHINE = 8
"""Largest gang member (GPUs on one Philly server). Jobs wider than this become several members."""

PCS_COLUMNS = ("app_id", "submit_time", "service", "num_jobs")
SIA_COLUMNS = ("name", "time", "application", "num_replicas")

SIA_GPU_HOURS: Mapping[str, tuple[str, float]] = {
    "cifar10": ("Small (0-1 GPU h)", 0.5),
    "bert": ("Medium (1-10 GPU h)", 3.0),
    "deepspeech2": ("Medium (1-10 GPU h)", 3.0),
    "yolov3": ("Large (10-100 GPU h)", 30.0),
    "imagenet": ("XL (> 100 GPU h)", 300.0),
}
"""Total work of a Sia job, in GPU-hours, by application. ASSUMPTION, not data: Sia replaced each
trace job by a model of its GPU-time bucket (Small 0-1 h: ResNet18/CIFAR-10; Medium 1-10 h: BERT or
DeepSpeech2; Large 10-100 h: YOLOv3; XL > 100 h: ResNet50/ImageNet) and ran it until it reached its
target accuracy under Pollux/Sia's goodput model (throughput and statistical-efficiency curves per
model), which is not available here. We use one representative value per bucket: the arithmetic
midpoint of Small, the geometric (decade) midpoints of Medium and Large, and 3x the bound for XL.
On the Philly workloads this averages ~8 GPU-hours per job, the same order as Sia's Gavel+TunedJobs
figure (9.0 +- 6.3), but job completion times from these files are NOT comparable with Sia's Table 3."""

SIA_APPLICATION_COUNTS = "cifar10, bert, deepspeech2, yolov3, imagenet"


# ---------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class RejectedRow:
    """A trace row that could not become a job, and why (kept, not raised, with ``skip_bad_rows``)."""

    location: str
    field: str | None
    reason: str

    def __str__(self) -> str:
        column = f": field '{self.field}'" if self.field else ""
        return f"{self.location}{column}: {self.reason}"


@dataclass(slots=True)
class WorkloadFile:
    """What one file contributed."""

    path: Path
    format: str
    vc: str
    rows: int = 0
    jobs: int = 0
    rejected: int = 0
    outside_window: int = 0


@dataclass(slots=True)
class Workload:
    jobs: list[JobSpec] = field(default_factory=list)
    rejected: list[RejectedRow] = field(default_factory=list)
    files: list[WorkloadFile] = field(default_factory=list)

    @property
    def vcs(self) -> list[str]:
        return sorted({job.vc for job in self.jobs})


# ---------------------------------------------------------------------- reading rows
def _read_header(path: Path) -> list[str]:
    if not path.is_file():
        raise InvalidInputError("file not found", location=str(path))
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            header = next(csv.reader(handle), [])
    except OSError as error:
        raise InvalidInputError(f"cannot read file: {error.strerror}", location=str(path)) from None
    except UnicodeDecodeError:
        raise InvalidInputError("not a UTF-8 text file", location=str(path)) from None
    except csv.Error as error:
        raise InvalidInputError(f"malformed CSV header: {error}", location=f"{path}:1") from None
    return [column.strip() for column in header]


def _rows(path: Path) -> Iterator[tuple[str, dict[str, str] | InvalidInputError]]:
    """Yield (``file:line``, row) per data row; a row with the wrong number of fields is an error value."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        try:
            header = [column.strip() for column in next(reader, [])]
            for fields in reader:
                where = f"{path}:{reader.line_num}"
                if not fields or all(not f.strip() for f in fields):
                    continue
                if len(fields) != len(header):
                    yield where, InvalidInputError(
                        f"has {len(fields)} fields, header has {len(header)}", location=where,
                        field=header[len(fields)] if len(fields) < len(header) else None,
                        accepted=f"{len(header)} comma-separated fields per row ({','.join(header)})")
                    continue
                yield where, dict(zip(header, fields, strict=True))
        except UnicodeDecodeError:
            raise InvalidInputError("not a UTF-8 text file", location=str(path)) from None
        except csv.Error as error:
            raise InvalidInputError(f"malformed CSV: {error}", location=f"{path}:{reader.line_num}") from None


def _number(row: Mapping[str, str], name: str, where: str, *, positive: bool = False) -> float:
    text = row[name].strip()
    try:
        value = float(text)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not a number", location=where, field=name,
                                accepted="a finite decimal number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InvalidInputError(f"{text!r} is out of range", location=where, field=name,
                                accepted="a finite number > 0" if positive else "a finite number >= 0")
    return value


def _count(row: Mapping[str, str], name: str, where: str) -> int:
    """A GPU count: a whole number >= 1 (``4.0`` is read as 4)."""
    text = row[name].strip()
    try:
        value = float(text)
    except ValueError:
        raise InvalidInputError(f"{text!r} is not a number", location=where, field=name,
                                accepted="a whole number of GPUs >= 1") from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise InvalidInputError(f"{text!r} GPUs", location=where, field=name, accepted="a whole number of GPUs >= 1")
    return int(value)


def _text(row: Mapping[str, str], name: str, where: str) -> str:
    text = row[name].strip()
    if not text:
        raise InvalidInputError("is empty", location=where, field=name, accepted="a non-empty value")
    return text


# ---------------------------------------------------------------------- gang shapes
def gang_shape(gpus: int) -> tuple[int, int, TopologyLevel | None]:
    """(members, GPUs per member, topology) of a rigid job asking for ``gpus`` GPUs.

    Up to one machine's worth: one member holding all its GPUs (one node by construction). Wider jobs
    span machines: 8-GPU members when the count is a multiple of 8 (Philly's data-parallel jobs used
    whole servers), else 4-GPU members when a multiple of 4, else 1-GPU members; all inside one rack,
    because multi-server jobs on Philly were placed rack-locally (InfiniBand within a rack).
    """
    if gpus <= GPUS_PER_MACHINE:
        return 1, gpus, None
    for per_member in (GPUS_PER_MACHINE, 4):
        if gpus % per_member == 0:
            return gpus // per_member, per_member, TopologyLevel.RACK
    return gpus, 1, TopologyLevel.RACK


@dataclass(frozen=True, slots=True)
class HostDefaults:
    """Host resources per GPU given to every job (the traces do not record them)."""

    cpu_milli_per_gpu: int = CPU_MILLI_PER_GPU
    memory_mib_per_gpu: int = MEMORY_MIB_PER_GPU

    def member(self, name: str, gpus: int) -> Request:
        return Request(name=name, cpu_milli=gpus * self.cpu_milli_per_gpu, memory_mib=gpus * self.memory_mib_per_gpu,
                       gpu_count=gpus, gpu_milli=MILLI_PER_GPU)


# ---------------------------------------------------------------------- formats
@dataclass(frozen=True, slots=True)
class _Row:
    """One parsed row, before the time window and the duplicate check."""

    name: str
    submit: float
    spec: Callable[[], JobSpec]


def _pcs_vc(path: Path) -> str:
    match = re.fullmatch(r"trace_(.+)", path.stem)
    return match.group(1) if match else path.stem


def _pcs_row(path: Path, vc: str, where: str, row: Mapping[str, str], host: HostDefaults) -> _Row:
    app_id = _text(row, "app_id", where)
    submit = _number(row, "submit_time", where)
    service = _number(row, "service", where)
    gpus = _count(row, "num_jobs", where)
    members, per_member, topology = gang_shape(gpus)
    name = f"{vc}-{app_id}"
    labels: tuple[tuple[str, str], ...] = (("trace", "philly-pcs"),)
    model = (row.get("model_name") or "").strip()
    if model:
        labels += (("model", model),)

    def spec() -> JobSpec:
        return JobSpec(name=name, vc=vc, member=host.member(name, per_member), members=members, topology=topology,
                       submit_time=submit, work=service / gpus, labels=labels)

    return _Row(name, submit, spec)


def _sia_vc(path: Path) -> str:
    match = re.fullmatch(r"workload-(\d+)", path.stem)
    suffix = f"w{match.group(1)}" if match else path.stem
    return f"{path.parent.name}-{suffix}" if path.parent.name else suffix


def _sia_row(path: Path, vc: str, where: str, row: Mapping[str, str], host: HostDefaults) -> _Row:
    job = _text(row, "name", where)
    submit = _number(row, "time", where)
    application = _text(row, "application", where).lower()
    if application not in SIA_GPU_HOURS:
        raise InvalidInputError(f"unknown application {application!r}", location=where, field="application",
                                accepted=SIA_APPLICATION_COUNTS)
    replicas = _count(row, "num_replicas", where)
    topology = TopologyLevel.NODE if replicas <= GPUS_PER_MACHINE else TopologyLevel.RACK
    work = SIA_GPU_HOURS[application][1] * 3600.0 / replicas
    name = f"{vc}-{job}"
    labels: tuple[tuple[str, str], ...] = (("trace", "sia"), ("application", application))
    batch = (row.get("batch_size") or "").strip()
    if batch:
        labels += (("batch_size", batch),)

    def spec() -> JobSpec:
        return JobSpec(name=name, vc=vc, member=host.member(name, 1), members=replicas,
                       topology=topology if replicas > 1 else None, submit_time=submit, work=work, labels=labels)

    return _Row(name, submit, spec)


@dataclass(frozen=True, slots=True)
class TraceFormat:
    name: str
    columns: tuple[str, ...]
    vc_of: Callable[[Path], str]
    row: Callable[[Path, str, str, Mapping[str, str], HostDefaults], _Row]


FORMATS: tuple[TraceFormat, ...] = (
    TraceFormat("philly-pcs", PCS_COLUMNS, _pcs_vc, _pcs_row),
    TraceFormat("sia", SIA_COLUMNS, _sia_vc, _sia_row),
)


def detect_format(path: Path) -> TraceFormat:
    header = _read_header(path)
    for trace_format in FORMATS:
        if all(column in header for column in trace_format.columns):
            return trace_format
    accepted = "; ".join(f"{f.name}: {','.join(f.columns)}" for f in FORMATS)
    raise InvalidInputError(f"unrecognised header {header}", location=f"{path}:1",
                            accepted=f"a header with the columns of one format ({accepted})")


# ---------------------------------------------------------------------- the dispatcher
def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; a directory stands for its ``*.csv`` files (sorted). Repeats are dropped."""
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.csv"))
            if not found:
                raise InvalidInputError("directory holds no *.csv files", location=str(path),
                                        accepted="a trace CSV file or a directory of them")
        else:
            found = [path]
        for item in found:
            key = item.resolve()
            if key not in seen:
                seen.add(key)
                out.append(item)
    if not out:
        raise InvalidInputError("no workload files given", field="workload", accepted="one or more trace CSV files")
    return out


def load_workloads(
    paths: Sequence[str | Path] | str | Path,
    *,
    days: float | None = None,
    start_day: float = 0.0,
    skip_bad_rows: bool = False,
    cpu_milli_per_gpu: int = CPU_MILLI_PER_GPU,
    memory_mib_per_gpu: int = MEMORY_MIB_PER_GPU,
) -> Workload:
    """Load trace files of any supported format into jobs, sorted by submission time.

    ``start_day`` and ``days`` keep the jobs submitted in [start_day, start_day + days) days after time 0
    (each file's own origin: the first job of a PCS VC, the window start of a Sia workload), shifted so
    the window starts at 0; the cluster starts empty at the window's start. A bad row raises ``InvalidInputError``
    with ``file:line`` and column, unless ``skip_bad_rows``: then it is collected in ``rejected`` and
    the rest loads, so one bad job never stops a long run (the report counts them).
    """
    if days is not None and (not math.isfinite(days) or days <= 0):
        raise InvalidInputError(f"days {days}", field="days", accepted="a number of days > 0")
    if not math.isfinite(start_day) or start_day < 0:
        raise InvalidInputError(f"start day {start_day}", field="start-day", accepted="a number of days >= 0")
    offset = start_day * SECONDS_PER_DAY
    limit = offset + days * SECONDS_PER_DAY if days is not None else math.inf
    host = HostDefaults(cpu_milli_per_gpu, memory_mib_per_gpu)
    workload = Workload()
    first_line: dict[str, str] = {}
    for path in expand_paths([paths] if isinstance(paths, str | Path) else paths):
        trace_format = detect_format(path)
        vc = trace_format.vc_of(path)
        info = WorkloadFile(path, trace_format.name, vc)
        workload.files.append(info)
        for where, row in _rows(path):
            info.rows += 1
            try:
                if isinstance(row, InvalidInputError):
                    raise row
                parsed = trace_format.row(path, vc, where, row, host)
                if parsed.submit >= limit or parsed.submit < offset:
                    info.outside_window += 1
                    continue
                if parsed.name in first_line:
                    raise InvalidInputError(f"duplicate job {parsed.name!r} (first at {first_line[parsed.name]})",
                                            location=where, accepted="unique job ids per virtual cluster")
                spec = parsed.spec()
                if offset:
                    spec = replace(spec, submit_time=spec.submit_time - offset)
            except InvalidInputError as error:
                if not skip_bad_rows:
                    if error.location is None or not error.location.startswith(str(path)):
                        raise InvalidInputError(error.message, location=where, field=error.field,
                                                accepted=error.accepted) from None
                    raise
                info.rejected += 1
                workload.rejected.append(RejectedRow(where, error.field, error.message))
                continue
            first_line[parsed.name] = where
            workload.jobs.append(spec)
            info.jobs += 1
    workload.jobs.sort(key=lambda job: (job.submit_time, job.vc, job.name))
    return workload

"""Issue 11, case 10: one name for one thing.

``--policy kubecell`` meant a placement policy in ``sim packing`` and a tenancy preset in ``sim dynamic``.
Placement policies are now ``--placement`` everywhere, tenancy presets ``--tenancy``; ``--policy`` is gone
and says which of the two the user means; ``kubecell policies`` lists both kinds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kubecell.cli.main import app
from kubecell.cli.scheduler import learned
from kubecell.core.engine.options import PRESETS
from kubecell.core.errors import InvalidInputError
from kubecell.core.interference import BlindSharing, HistoryInformed, PressureAdaptive, SummedUtilThreshold
from kubecell.core.placement.registry import policy_names
from kubecell.profiler.knowledge import HistoryKnowledge
from kubecell.scheduler.options import SchedulerOptions, engine_options
from tests.cli.support import assert_one_line_error, run_main


def test_policies_lists_both_kinds_in_titled_tables() -> None:
    result = CliRunner().invoke(app, ["policies"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    placement_at = out.index("placement policies")
    tenancy_at = out.index("tenancy presets")
    assert placement_at < tenancy_at
    assert "--placement in sim packing, simulate, sim dynamic" in out
    assert "--tenancy in sim dynamic" in out
    placement_rows = {line.split("│")[1].strip() for line in out[placement_at:tenancy_at].splitlines()
                      if line.count("│") >= 3}
    tenancy_rows = {line.split("│")[1].strip() for line in out[tenancy_at:].splitlines() if line.count("│") >= 3}
    assert placement_rows == {f"{name} (default)" if name == "kubecell" else name for name in policy_names()}
    assert tenancy_rows == set(PRESETS) == {"quota", "hived", "kubecell"}
    for line in out[tenancy_at:].splitlines():
        if line.count("│") >= 3:
            assert len(line.split("│")[2].strip()) > 20  # a one-line summary each


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["simulate", "--policy", "fgd"], "--policy was renamed --placement"),
        (["sim", "dynamic", "--workload", "w.csv", "--policy", "hived"], "--policy was renamed --tenancy"),
    ],
)
def test_the_old_flag_says_what_replaced_it(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(monkeypatch, capsys, *argv)
    assert_one_line_error(code, err, says)


def test_packing_placement_flag(tmp_path: Path, bundled: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = bundled
    out = tmp_path / "out"
    code, _, err = run_main(monkeypatch, capsys, "sim", "packing", "--nodes", nodes, "--pods", pods, "--out", out,
                            "--seeds", "1", "--placement", "FGD")
    assert code == 0, err
    assert [entry["policy"] for entry in json.loads((out / "summary.json").read_text())] == ["fgd"]
    code, _, err = run_main(monkeypatch, capsys, "sim", "packing", "--nodes", nodes, "--pods", pods, "--out", out,
                            "--placement", "hived")
    assert_one_line_error(code, err, "field 'placement'", "unknown placement policy 'hived'")


def test_dynamic_tenancy_and_placement_flags(tmp_path: Path, tiny_dynamic: dict[str, Path],
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    base: list[str | Path] = ["sim", "dynamic", "--cluster", tiny_dynamic["cluster"],
                              "--tenants", tiny_dynamic["tenants"], "--workload", tiny_dynamic["a"]]
    out = tmp_path / "out"
    code, stdout, err = run_main(monkeypatch, capsys, *base, "--out", out, "--tenancy", "HiveD",
                                 "--placement", "fgd")
    assert code == 0, err
    assert "per tenancy preset" in stdout
    run = json.loads((out / "run.json").read_text())
    assert (run["tenancy"], run["placement"]) == (["hived"], "fgd")
    code, _, err = run_main(monkeypatch, capsys, *base, "--out", out, "--tenancy", "fgd")
    assert_one_line_error(code, err, "field 'tenancy'", "unknown tenancy preset 'fgd'",
                          "placement policies go to --placement")


def test_the_schedulers_knowledge_flags_are_checked_before_the_cluster_is_touched(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="queue-order"):
        learned("", "sjf", "")
    with pytest.raises(InvalidInputError, match="colocation"):
        learned("", "age", "sometimes")
    with pytest.raises(InvalidInputError, match="--place-by-use needs --history"):
        learned("", "age", "", place_by_use=True)
    for floor in (-0.1, 1.5, math.nan):
        with pytest.raises(InvalidInputError, match="pair-floor"):
            learned("", "age", "", pair_floor=floor)
    fields = learned(f"sqlite:///{tmp_path}/h.db", "shortest-expected", "summed-util:100", place_by_use=True,
                     pair_floor=0)
    assert fields["queue_order"] == "shortest-expected"
    assert fields["colocation"] == SummedUtilThreshold(100.0)
    assert fields["place_by_use"] is True
    assert isinstance(fields["knowledge"], HistoryKnowledge)
    fields["knowledge"].history.close()
    # by default the history's pairs are asked first, by the rule's idle part where it has one
    fields = learned(f"sqlite:///{tmp_path}/h.db", "age", "summed-util:70/blind")
    rule = fields["colocation"]
    assert isinstance(rule, PressureAdaptive)
    assert isinstance(rule.idle, HistoryInformed)
    assert (rule.idle.rule, rule.idle.floor) == (SummedUtilThreshold(70.0), 0.95)
    knowledge: HistoryKnowledge = fields["knowledge"]
    assert rule.idle.history is knowledge
    assert rule.busy == BlindSharing()
    knowledge.history.close()
    assert learned("", "age", "blind")["colocation"] == BlindSharing(), "without a history nothing to ask"


def test_backfill_by_history_reaches_the_engine_and_only_with_a_history(tmp_path: Path) -> None:
    for margin in (0.5, -1.0, math.inf, math.nan):
        with pytest.raises(InvalidInputError, match="backfill-margin"):
            learned(f"sqlite:///{tmp_path}/h.db", "age", "", backfill_margin=margin)
    with pytest.raises(InvalidInputError, match="--backfill-margin needs --history"):
        learned("", "age", "", backfill_margin=2.0)
    assert learned("", "age", "")["backfill_margin"] is None, "off by default"
    fields = learned(f"sqlite:///{tmp_path}/h.db", "shortest-expected", "", backfill_margin=2.0)
    fields["knowledge"].history.close()
    options = engine_options(SchedulerOptions(resize_interval_seconds=30.0, **fields))
    assert (options.backfill_margin, options.queue_order, options.resize_min_interval_seconds) == (
        2.0, "shortest-expected", 30.0)
    assert engine_options(SchedulerOptions()).backfill_margin is None


@pytest.mark.parametrize(("args", "says"), [
    (["--tls-cert", "/nonexistent.crt", "--tls-key", "/nonexistent.key"], "not a certificate and its key"),
    (["--listen", "127.0.0.1:99999"], "--listen '127.0.0.1:99999'"),
    (["--listen", ""], "a webhook must listen"),
], ids=["no such certificate", "no such port", "no address"])
def test_the_right_sizing_webhook_checks_its_flags_before_it_serves(args: list[str], says: str,
                                                                     tmp_path: Path) -> None:
    from kubecell.testbed import pki

    files = pki.create(tmp_path / "pki", "https://127.0.0.1:1")
    given = ["--tls-cert", str(files.serving_cert), "--tls-key", str(files.serving_key)]
    result = CliRunner().invoke(app, ["profile", "webhook", "--db", f"sqlite:///{tmp_path / 'h.db'}",
                                      *given, *args])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())


@pytest.mark.parametrize("command", [["recommend"], ["pairs"], ["report", "--out", "OUT"]])
def test_a_command_that_only_reads_the_history_never_makes_one(command: list[str], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --db must be an error, not an empty history that looks like no data (nor a file left behind)."""
    argv = [part.replace("OUT", str(tmp_path / "out")) for part in command]
    missing = tmp_path / "typo.db"
    code, _, err = run_main(monkeypatch, capsys, "profile", *argv, "--db", f"sqlite:///{missing}")
    assert_one_line_error(code, err, "no job history at", "kubecell profile collect")
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    code, _, err = run_main(monkeypatch, capsys, "profile", *argv, "--db", f"sqlite:///{empty}")
    assert_one_line_error(code, err, "holds no job history")
    assert empty.stat().st_size == 0, "left as it was"


@pytest.mark.parametrize(("args", "says"), [
    (["--every", "nan"], "--every nan"),
    (["--every", "inf"], "--every inf"),
    (["--every", "1e308"], "at most 604800"),
    (["--every", "60", "--passes", "0"], "--passes 0: give at least 1"),
    (["--passes", "3"], "--passes needs --every"),
    (["--prometheus", "not a url"], "give Prometheus' base URL"),
    (["--prometheus", "ftp://x"], "give Prometheus' base URL"),
], ids=["every nan", "every inf", "every huge", "no passes", "passes alone", "no url", "not http"])
def test_collect_checks_its_flags_before_it_reads_anything(args: list[str], says: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    given = ["--prometheus", "http://127.0.0.1:9"] if "--prometheus" not in args else []
    code, _, err = run_main(monkeypatch, capsys, "profile", "collect", *given, *args,
                            "--db", f"sqlite:///{tmp_path / 'h.db'}", "--kubeconfig", str(tmp_path / "absent"))
    assert_one_line_error(code, err, says)
    assert not (tmp_path / "h.db").exists()


def test_report_refuses_an_out_that_is_a_file_before_reading_the_history(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "afile"
    taken.write_text("x")
    code, _, err = run_main(monkeypatch, capsys, "profile", "report", "--out", str(taken),
                            "--db", f"sqlite:///{tmp_path / 'h.db'}")
    assert_one_line_error(code, err, "is an existing file, not a directory")


@pytest.mark.parametrize(("content", "says"), [
    (b"\xd0\xcf\x11\xe0 binary", "not a kubeconfig: UnicodeDecodeError"),
    (b"foo: [unclosed", "not a kubeconfig: ParserError"),
    (b"- 1\n- 2\n", "not a kubeconfig: TypeError"),
    (b"[" * 5000, "nests deeper than"),  # a RecursionError and its traceback before
    (b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        b"%c: &%c [%s]\n" % (c, c, b",".join([b"*" + bytes([c - 1])] * 9)) for c in range(ord("b"), ord("j"))),
     "once its aliases are expanded"),  # 20 s, 1.9 GB and a 226 MB line of error before
], ids=["binary", "broken yaml", "a list", "deep", "alias bomb"])
@pytest.mark.parametrize("command", [["scheduler"], ["profile", "collect", "--prometheus", "http://127.0.0.1:9"]])
def test_a_file_that_is_no_kubeconfig_is_one_line(content: bytes, says: str, command: list[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_bytes(content)
    code, _, err = run_main(monkeypatch, capsys, *command, "--kubeconfig", str(bad),
                            *(["--db", f"sqlite:///{tmp_path / 'h.db'}"] if "profile" in command else []))
    assert_one_line_error(code, err, says)

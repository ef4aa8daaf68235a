"""The ``kubecell`` command line.

``kubecell simulate`` with no arguments is the project's main job on a laptop: it replays the bundled
example workload on the bundled example cluster with every placement policy and writes a report.
User errors (bad files, unknown names, impossible requests, an output directory that cannot be written)
print one line and exit with status 2, before any simulation runs.

Two kinds of policy, two flags: ``--placement`` chooses placement policies (where a pod or job member
goes: ``sim packing``, ``simulate``, ``sim dynamic``), ``--tenancy`` chooses tenancy presets (who is
guaranteed what: ``sim dynamic``). ``kubecell policies`` lists both.
"""

from __future__ import annotations

import os
import sys

import typer
from rich.table import Table
from rich.text import Text

from kubecell import __version__
from kubecell.cli.dynamic import sim_dynamic
from kubecell.cli.elastic import sim_elastic
from kubecell.cli.elastic_controller import elastic_controller
from kubecell.cli.elasticjobs import elasticjobs_command
from kubecell.cli.examples import example_paths, philly_example_paths
from kubecell.cli.inspect import inspect
from kubecell.cli.node_agent import node_agent
from kubecell.cli.output import stderr_console, stdout_console
from kubecell.cli.packing import sim_packing, simulate
from kubecell.cli.profile import profile_app
from kubecell.cli.replay import replay_command
from kubecell.cli.scheduler import extender, scheduler
from kubecell.cli.testbed import testbed_app
from kubecell.core.engine.options import PRESET_SUMMARIES, PRESETS
from kubecell.core.errors import KubecellError
from kubecell.core.placement.registry import DEFAULT_POLICY, policy_summaries
from kubecell.sim.dynamic.runner import DEFAULT_POLICIES

__all__ = ["app", "example_paths", "main", "philly_example_paths"]

app = typer.Typer(
    help="kubecell: GPU-cluster scheduler and trace-driven simulator.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
sim_app = typer.Typer(help="Trace-driven experiments on an embedded cluster.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
sim_app.command("packing")(sim_packing)
sim_app.command("dynamic")(sim_dynamic)
sim_app.command("elastic")(sim_elastic)
app.command("simulate")(simulate)
app.add_typer(testbed_app, name="testbed")
app.command("scheduler")(scheduler)
app.command("extender")(extender)
app.command("node-agent")(node_agent)
app.command("replay")(replay_command)
app.command("inspect")(inspect)
app.command("elastic-controller")(elastic_controller)
app.command("elasticjobs")(elasticjobs_command)
app.add_typer(profile_app, name="profile")


@app.command()
def policies() -> None:
    """List the placement policies (--placement) and the tenancy presets (--tenancy)."""
    placement = Table(title="placement policies: where each pod or job member goes "
                      "(--placement in sim packing, simulate, sim dynamic)")
    placement.add_column("name", no_wrap=True)
    placement.add_column("what it does")
    for name, summary in policy_summaries().items():
        placement.add_row(f"{name} (default)" if name == DEFAULT_POLICY else name, summary)
    tenancy = Table(title="tenancy presets: who is guaranteed what, who borrows, who is preempted "
                    f"(--tenancy in sim dynamic; default: {','.join(DEFAULT_POLICIES)})")
    tenancy.add_column("name", no_wrap=True)
    tenancy.add_column("what it does")
    for name in PRESETS:
        tenancy.add_row(name, PRESET_SUMMARIES[name])
    console = stdout_console()
    console.print(placement)
    console.print(tenancy)


@app.command()
def version() -> None:
    """Print the version."""
    stdout_console().print(__version__)


def main() -> None:
    """The installed ``kubecell`` script: a KubecellError is the user's to fix, so it is one line, not a
    traceback."""
    try:
        app()
    except KubecellError as error:
        stderr_console().print(Text.assemble(("error:", "bold red"), f" {error}"), highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        stderr_console().print("interrupted")
        sys.exit(130)
    except BrokenPipeError:
        os._exit(1)


if __name__ == "__main__":
    main()

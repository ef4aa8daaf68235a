"""Conformance scenarios: small YAML stories that drive the engine step by step and check outcomes.

The file format (and the list of steps) is documented in ``format.py``; a scenario's ``cluster:`` is the
dynamic simulator's cluster description and its ``tenants:`` the simulator's tenant configuration.
``parse.py`` reads and validates a file, ``runner.py`` performs its events and ``expectations.py`` its
checks, both over the run state of ``context.py``::

    from kubecell.testing.scenarios import run_scenario
    run_scenario("tests/core/engine/scenarios/volcano_3373_gang_deadlock.yaml")   # raises ScenarioFailure if it fails
"""

from kubecell.testing.scenarios.format import Scenario, ScenarioFailure, ScenarioInputError, Step, TenantSection
from kubecell.testing.scenarios.parse import discover, load_scenario, parse_scenario
from kubecell.testing.scenarios.runner import ScenarioResult, ScenarioRunner, run_scenario

__all__ = [
    "Scenario",
    "ScenarioFailure",
    "ScenarioInputError",
    "ScenarioResult",
    "ScenarioRunner",
    "Step",
    "TenantSection",
    "discover",
    "load_scenario",
    "parse_scenario",
    "run_scenario",
]

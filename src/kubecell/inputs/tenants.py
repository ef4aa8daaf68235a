"""Tenant configurations read from YAML: virtual clusters validated against a cluster, with lines.

The rules live in the core (``kubecell.core.tenancy.config``), which takes parsed data and never reads
files; this reader gives it the document's data and a locator, so every tenant error (unknown key, bad
count, unknown cell type, infeasible guarantees, pinned conflicts) reads ``file:line: key.path``, and a
VC or a field written twice is refused with both lines instead of the last one silently winning.
"""

from __future__ import annotations

from pathlib import Path

from kubecell.core.tenancy.config import Tenants, resolve_tenants
from kubecell.core.topology import CellForest
from kubecell.core.validation import KeyPath
from kubecell.inputs.yaml_document import YamlDocument


def parse_tenants(doc: YamlDocument, forest: CellForest, at: KeyPath = ()) -> Tenants:
    """Validate the tenant configuration at key path ``at`` of a document (the whole document by
    default) against the cluster's cell forest."""
    section = doc.section(*at)
    return resolve_tenants(section.data, forest, source=str(doc.path), locate=section.where)


def load_tenants(path: str | Path, forest: CellForest) -> Tenants:
    """Read a tenant configuration YAML file and validate it against the cluster's cell forest."""
    return parse_tenants(YamlDocument.read(path), forest)

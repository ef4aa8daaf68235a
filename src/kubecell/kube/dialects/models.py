"""GPU model filters written in each dialect's spelling, matched against the models nodes report.

Nodes report catalog names (``A100-80G``, ``V100M32``) or, for GPUs the catalog does not know, the
product name. Users write what their old scheduler matched against: HAMi and HiveD users write part of
a product name (``A100``, HAMi matches it as a case-insensitive substring), KubeShare users write the
whole product name with dashes (``NVIDIA-GeForce-GTX-1080``), kubecell users write catalog names. Each
dialect names its matching rule (``Matching``) and builds its filter with ``model_filter``; a filter that
matches no known model is refused, because a pod waiting for a GPU model that does not exist would wait
forever. The filters of several dialects are intersected by the entry point (``pod``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from kubecell.kube.dialects.demand import PodMeta
from kubecell.kube.dialects.statement import Stated
from kubecell.kube.mig import is_mig_model

Matching = Literal["exact", "product", "substring"]

MAX_MODEL_FILTER_CHARS = 1024
"""The longest GPU model filter read (``kubecell.io/gpu-models``, HAMi's ``use-gputype``...): real ones name a
few models; each name is matched against every model the cluster has, so the length bounds a pod's cost (a
quarter-megabyte list of distinct names took seconds)."""


def _key(name: str) -> str:
    """A model or product name reduced to its letters and digits, vendor prefixes dropped."""
    upper = name.upper()
    for prefix in ("NVIDIA", "TESLA", "GEFORCE"):
        upper = upper.replace(prefix, "")
    return re.sub(r"[^A-Z0-9]", "", upper)


def split_list(text: str) -> list[str]:
    """A comma list as annotations write it: items trimmed, empty items dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def match_models(names: Iterable[str], known: frozenset[str], how: Matching) -> frozenset[str]:
    """The known models any of ``names`` selects.

    ``exact``: the name itself (kubecell's own annotation). ``product``: the same model written as a
    product name (``NVIDIA-A100-SXM4-80GB`` is ``A100-80G``; ``Tesla-T4`` is ``T4``). ``substring``:
    also every model whose name contains it, as HAMi matches ``use-gputype`` (``A100`` selects
    ``A100`` and ``A100-80G``)."""
    # Imported here: the node readers (advertised, gfd, inventory) read quantities through this package, so an
    # import of gfd at the top would be a cycle whichever of them is imported first.
    from kubecell.kube.gfd import catalog_model

    keyed = {model: _key(model) for model in known}
    chosen: set[str] = set()
    for name in names:
        if name in known:
            chosen.add(name)
            continue
        if how == "exact":
            continue
        key = _key(name)
        mapped = catalog_model(name)
        chosen.update(model for model, model_key in keyed.items()
                      if model == mapped or (key and model_key == key))
        if how == "substring" and key:
            chosen.update(model for model, model_key in keyed.items() if key in model_key)
    return frozenset(chosen)


def known_list(known: frozenset[str]) -> str:
    """The known models for an ``accepted`` text."""
    return ", ".join(sorted(known))


def bounded(pod: PodMeta, field: str, subject: str, text: str) -> str:
    """A model filter's text; its length bounds the matching work (per name, against every model)."""
    if len(text) > MAX_MODEL_FILTER_CHARS:
        raise pod.error(subject, f"is {len(text)} characters long", field=field,
                        accepted=f"GPU models in at most {MAX_MODEL_FILTER_CHARS} characters")
    return text


def model_filter(pod: PodMeta, known: frozenset[str], dialect: str, field: str, subject: str, wanted: list[str],
                 how: Matching, *, exclude: bool = False) -> Stated[frozenset[str]]:
    """The known models ``wanted`` selects (``exclude``: the known models it does not select), as one
    dialect's filter; a filter that selects nothing is refused. MIG profiles differ by GPU and driver, so a
    MIG model is taken as written (``kubecell.kube.mig``)."""
    chosen = match_models(wanted, known, how) | frozenset(name for name in wanted if is_mig_model(name))
    if exclude:
        chosen = known - chosen
    if not wanted or not chosen:
        raise pod.error(subject, "excludes every GPU model" if exclude else "matches no GPU model the cluster "
                        "has", field=field, accepted=known_list(known))
    return Stated(dialect, field, subject, chosen)

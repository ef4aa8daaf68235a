"""GPU model filters written in each dialect's spelling, matched against the models nodes report.

Nodes report catalog names (``A100-80G``, ``V100M32``) or, for GPUs the catalog does not know, the
product name. Users write what their old scheduler matched against: HAMi and HiveD users write part of
a product name (``A100``, HAMi matches it as a case-insensitive substring), KubeShare users write the
whole product name with dashes (``NVIDIA-GeForce-GTX-1080``), kubecell users write catalog names. Each
dialect keeps its own matching rule here; a filter that matches no known model is refused, because a
pod waiting for a GPU model that does not exist would wait forever.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

# The module, not the function: the inventory reads quantities through this package, so whichever of the
# two is imported first, the other is still being imported when this line runs.
from kubecell.k8s import inventory

Matching = Literal["exact", "product", "substring"]


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
    keyed = {model: _key(model) for model in known}
    chosen: set[str] = set()
    for name in names:
        if name in known:
            chosen.add(name)
            continue
        if how == "exact":
            continue
        key = _key(name)
        mapped = inventory.catalog_model(name)
        chosen.update(model for model, model_key in keyed.items()
                      if model == mapped or (key and model_key == key))
        if how == "substring" and key:
            chosen.update(model for model, model_key in keyed.items() if key in model_key)
    return frozenset(chosen)


def known_list(known: frozenset[str]) -> str:
    """The known models for an ``accepted`` text."""
    return ", ".join(sorted(known))

"""GPU model matching (``kubecell.kube.dialects.models``), shared by every dialect that filters models: each
dialect's spelling (kubecell's exact names, KubeShare's product names, HAMi's and HiveD's substrings)
against the models nodes report."""

from __future__ import annotations

import pytest

from kubecell.core.model import GPU_MODELS
from kubecell.kube.dialects.models import Matching, match_models, split_list

KNOWN = frozenset(GPU_MODELS) | {"NVIDIA GeForce GTX 1080"}


@pytest.mark.parametrize(("names", "how", "expected"), [
    (["A100"], "exact", {"A100"}),
    (["a100"], "exact", set()),  # exact is exact
    (["A100", "T4"], "exact", {"A100", "T4"}),
    (["NVIDIA-A100-SXM4-80GB"], "product", {"A100-80G"}),
    (["Tesla-T4"], "product", {"T4"}),
    (["NVIDIA-GeForce-GTX-1080"], "product", {"NVIDIA GeForce GTX 1080"}),  # a product the catalog does not know
    (["A100"], "product", {"A100"}),
    (["a100"], "substring", {"A100", "A100-80G"}),
    (["V100"], "substring", {"V100M16", "V100M32"}),
    (["1080"], "substring", {"NVIDIA GeForce GTX 1080"}),
    (["B300"], "substring", set()),
    ([], "substring", set()),
])
def test_match_models(names: list[str], how: Matching, expected: set[str]) -> None:
    assert match_models(names, KNOWN, how) == frozenset(expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("A100, V100M32", ["A100", "V100M32"]), (" A100 ,, ", ["A100"]), ("", []), (" , ", []),
])
def test_split_list(text: str, expected: list[str]) -> None:
    assert split_list(text) == expected

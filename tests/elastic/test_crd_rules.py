"""What the ElasticJob CRD itself refuses, on the real API server: the fields every running worker and the
rendezvous were made with (torchrun's --nnodes MIN:MAX, processes per worker, the store's port and image) cannot
change under them, while the target (/scale) still can."""

from __future__ import annotations

from typing import Any

import pytest

from kubecell.kube import elasticjobs as ej
from kubecell.kube.rest import ApiError, Kube
from tests.elastic.support import create_job, get_job, scale

pytestmark = pytest.mark.usefixtures("elastic_crd")


@pytest.mark.parametrize(("change", "says"), [
    ({"maxReplicas": 4}, "minReplicas and maxReplicas cannot be changed"),
    ({"minReplicas": 2}, "minReplicas and maxReplicas cannot be changed"),
    ({"rendezvousPort": 29500}, "rendezvousPort cannot be changed"),
    ({"nprocPerNode": 2}, "nprocPerNode cannot be changed"),
    ({"rendezvousImage": "python:3.12"}, "rendezvousImage cannot be changed"),
])
def test_what_the_workers_were_made_with_cannot_change(kube: Kube, namespace: str, change: dict[str, Any],
                                                       says: str) -> None:
    create_job(kube, namespace, "fixed", minReplicas=1, maxReplicas=3, replicas=1)
    with pytest.raises(ApiError) as refused:
        kube.patch(ej.job_path(namespace, "fixed"), {"spec": change})
    assert refused.value.status == 422
    assert says in str(refused.value)
    assert scale(kube, namespace, "fixed", 3)["spec"]["replicas"] == 3, "the target still moves"
    assert get_job(kube, namespace, "fixed")["spec"]["maxReplicas"] == 3

"""OneFlow's placements and sbp in project code on 2 ranks (dist_scripts/oneflow_placements.py):
creation with a multi-rank placement gives each rank its share, DTensors redistribute,
the runtime's plain tensors stay as they are."""

from __future__ import annotations

from launch import torchrun


def test_global_tensors_of_project_code_on_two_ranks():
    results = torchrun("oneflow_placements.py", 2, timeout=120)
    failures = [r.get("trace") or r.get("error") for r in results if not r.get("ok")]
    assert not failures, "\n".join(map(str, failures))
    assert sorted(r["rank"] for r in results) == [0, 1]

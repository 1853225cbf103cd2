"""``hf_parity.run_case`` under each given layout (args: case file, HF dir, layouts JSON; a
layout's own ``case`` / ``hf_dir`` replace them, so one launch checks several models)."""

from __future__ import annotations

import json

from common import parse_out_dir, run_checks
from hf_parity import run_case

from libai import dist

out_dir, _, (case_path, hf_dir, layouts_json) = parse_out_dir()


def checks() -> dict:
    results = {}
    for layout in json.loads(layouts_json):
        dist.setup_dist_util(dict(layout["dist"]))
        results[layout["name"]] = run_case(
            layout.get("case", case_path), layout.get("hf_dir", hf_dir), layout
        )
        dist.synchronize()
    return {"layouts": results}


run_checks(out_dir, checks)

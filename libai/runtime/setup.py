"""Setting up a run, the same for every front door: the layout checked before any
collective, the mesh, the output directory, the logger, the door's config saved, the seed."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping

from libai import dist
from libai.runtime.core import seed_all
from libai.utils.logger import setup_logger

logger = logging.getLogger(__name__)


def setup_run(
    dist_cfg: Mapping,
    output_dir: str | None,
    *,
    seed: int,
    save_config: Callable[[], None] | None = None,
) -> dist.DistUtil:
    """In order: ``dist_cfg``'s layout resolved for ``WORLD_SIZE`` (raises on every rank alike,
    before any process can wait in a collective); the mesh; ``output_dir`` created by rank 0;
    the logger (rank 0 to the console and ``output_dir/log.txt``); ``save_config()`` (the
    door writes its own config file, on rank 0); every generator seeded with ``seed`` (the
    weights every rank builds). Returns the mesh."""
    dist.resolve_layout(dist_cfg, int(os.environ.get("WORLD_SIZE", 1)))
    util = dist.setup_dist_util(dist_cfg)
    rank = dist.get_rank()
    if rank == 0 and output_dir:
        os.makedirs(output_dir, exist_ok=True)
    dist.synchronize()
    setup_logger(output_dir, distributed_rank=rank)
    logger.info("Rank %d of %d; command line: %s", rank, dist.get_world_size(), " ".join(sys.argv))
    if save_config is not None:
        save_config()
    seed_all(seed)
    return util

"""Train (or evaluate) the model of a LiBai config on the current mesh.

bash tools/train.sh tools/train_net.py configs/gpt2_pretrain.py 2 [overrides...]
python tools/train_net.py --config-file configs/gpt2_pretrain.py --fast-dev-run
"""

from __future__ import annotations

import logging
import os
import sys

from libai import dist
from libai.config import LazyConfig
from libai.dist.cli import run_cli
from libai.engine import DefaultTrainer, default_argument_parser, default_setup
from libai.evaluation import print_csv_format
from libai.utils.plot import plot_loss_curve

logger = logging.getLogger("libai.train_net")


def _import_roots() -> None:
    """Let configs name the user's own modules under the working directory and
    ``projects.<name>....`` by import path, as LiBai's train_net does: the working directory
    comes first on ``sys.path``, so a user's ``projects/<name>`` wins over this checkout's;
    the checkout root follows it, so our ``projects/`` (a namespace package: no
    ``__init__.py``) still provides the projects the user does not have."""
    repo_root = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
    for root in (repo_root, os.getcwd()):  # each goes to the front: the last one ends up first
        while root in sys.path:
            sys.path.remove(root)
        sys.path.insert(0, root)
    _user_projects_first(os.path.join(os.getcwd(), "projects"), os.path.join(repo_root, "projects"))


def _user_projects_first(user: str, ours: str) -> None:
    """A project under the working directory written without an ``__init__.py`` (LiBai's
    are) is still the one ``projects.<name>`` imports when ours has the same name: Python
    prefers a regular package (ours) to a namespace portion wherever they stand on the path,
    so the user's is registered as ``projects.<name>`` by its directory, before any import."""
    if not os.path.isdir(user) or os.path.realpath(user) == os.path.realpath(ours):
        return
    import importlib.machinery
    import importlib.util

    import projects  # the namespace package over both directories

    for name in sorted(os.listdir(user)):
        path = os.path.join(user, name)
        if f"projects.{name}" in sys.modules or not os.path.isdir(os.path.join(ours, name)):
            continue
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, "__init__.py")):
            spec = importlib.machinery.ModuleSpec(f"projects.{name}", None, is_package=True)
            spec.submodule_search_locations = [path]
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            setattr(projects, name, module)


def main(args) -> int:
    _import_roots()
    cfg = LazyConfig.load(args.config_file)
    cfg = LazyConfig.apply_overrides(cfg, args.opts)
    default_setup(cfg, args)
    trainer = DefaultTrainer(cfg)
    if args.eval_only:
        trainer.resume_or_load(resume=cfg.train.resume)
        results = trainer.evaluate(trainer.test_loader or trainer.valid_loader)
        if dist.is_main_process():
            print_csv_format(results)
        return 0
    trainer.resume_or_load(resume=cfg.train.resume)
    if not trainer.train():  # a resumed run that had already finished: nothing new to plot
        return 0
    metrics = os.path.join(cfg.train.output_dir, "metrics.json")
    if dist.is_main_process() and os.path.exists(metrics):
        png = plot_loss_curve(metrics, os.path.join(cfg.train.output_dir, "loss_curve.png"))
        logger.info("Loss curve written to %s", png)
    return 0


if __name__ == "__main__":
    args = default_argument_parser().parse_args()
    run_cli(lambda: main(args))

"""Sharded, atomic, layout-independent checkpoints on ``torch.distributed.checkpoint`` (DCP).

Every rank writes its own shards (its pipeline stage, its tensor-parallel slices and its
share of the data-parallel replicas); nothing is gathered to rank 0. A checkpoint saved
on one layout loads on any other (dp2 -> tp2, pp2 -> one process, ...): DCP stores global
tensor shapes and chunk offsets and reshards on load. Two things make the *names and shapes*
layout-independent as well:

- **Tied copies.** Under pipeline parallelism the last stage holds a copy of the word
  embedding (``libai_tied_group`` marks both). Only the canonical entry is stored; on load
  the copy is filled from it, optimizer state included. The canonical member of a group is
  the one not marked ``libai_tied_copy`` (``LMLogits`` marks its copy), else the member of
  the first pipeline stage; a model may instead declare ``checkpoint_tied_weights = {copy
  name: canonical name}``.
- **Padding.** A parameter padded for tensor parallelism (vocab rounded up to a multiple of
  tp; ``libai_logical_shape`` holds the real shape) is stored in its logical shape.
- **ZeRO.** Optimizer state is stored under parameter names and global shapes whatever the
  stage: a ZeRO-1/2 rank writes the state of the parameters it owns, a ZeRO-3 rank its dp
  shard of every state (FSDP2 DTensors). A checkpoint of any stage loads into any other
  stage and layout, each rank reading the pieces it holds there.

Directory layout (``save_dir`` is e.g. ``train.output_dir``)::

    save_dir/
      last_checkpoint          one line: the name of the newest complete checkpoint
      model_0000099/
        .metadata              DCP: every tensor's global shape, chunk -> file/offset
        __0_0.distcp           the tensor shards rank 0 wrote (model + optimizer state)
        __1_0.distcp           ... rank 1
        rank_0.pt, rank_1.pt   per-rank small state: extra (iteration, consumed samples),
                               scheduler, grad scaler, other checkpointables, RNG, layout
        meta.json              human-readable summary (layout, extra)
      model_0000199.tmp/       a save in progress or killed midway: never read, removed
                               by the next save

Saving is atomic: all ranks write into ``name.tmp``, then rank 0 renames it to ``name``
and atomically rewrites ``last_checkpoint``. A process killed at any point leaves the
previous checkpoint intact and ``last_checkpoint`` pointing at it.

Usage (detectron2 / LiBai style)::

    checkpointer = Checkpointer(model, cfg.train.output_dir, optimizer=opt, scheduler=sched)
    checkpointer.save("model_0000099", iteration=99, consumed_train_samples=6400)
    extra = checkpointer.resume_or_load(cfg.train.load_weight, resume=args.resume)
    start_iter = extra.get("iteration", -1) + 1
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from libai.utils import distributed as dist

logger = logging.getLogger(__name__)

__all__ = ["CheckpointError", "Checkpointer", "PeriodicCheckpointer"]

FORMAT = "libai-dcp-1"
LAST_CHECKPOINT = "last_checkpoint"
TMP_SUFFIX = ".tmp"
OLD_SUFFIX = ".old"
MODEL_KEY = "model"
RNG_KEY = "rng"
_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
_OPTIM_SECTIONS = ("state.", "param_groups.")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt or does not fit the model."""


def _rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


def _agree(error: BaseException | None, what: str) -> None:
    """Collective: if any rank failed (``error``), raise a :class:`CheckpointError` on all.

    Lets a failure on one rank (a full disk, an unreadable file) stop every rank instead of
    leaving the others waiting in the next collective. Doubles as a barrier.
    """
    message = None
    if error is not None:
        message = str(error) if isinstance(error, CheckpointError) else f"{what} failed: "
        if not isinstance(error, CheckpointError):
            message += f"{type(error).__name__}: {error}"
    messages = [message]
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        messages = [None] * torch_dist.get_world_size()
        torch_dist.all_gather_object(messages, message)
    failed = [(rank, m) for rank, m in enumerate(messages) if m is not None]
    if not failed:
        return
    if error is not None and isinstance(error, CheckpointError):
        raise error
    ranks = [rank for rank, _ in failed]
    raise CheckpointError(f"{failed[0][1]} (on rank(s) {ranks})") from error


def _layout_signature() -> dict:
    """What must match for per-rank state (RNG, per-rank checkpointables) to carry over."""
    layout = dist.get_dist_util().layout
    return {
        "world_size": dist.get_world_size(),
        "pipeline_parallel_size": layout.pipeline_parallel_size,
        "data_parallel_size": layout.data_parallel_size,
        "tensor_parallel_size": layout.tensor_parallel_size,
        "virtual_pipeline_size": layout.virtual_pipeline_size,
        "layer_stage_ids": list(layout.layer_stage_ids),
    }


# ---- RNG ------------------------------------------------------------------------------------
def _rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- layout-independent views of the state dicts ----------------------------------------------
def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))


def _logical_view(t: torch.Tensor, logical_shape, name: str) -> torch.Tensor:
    """``t`` (padded) seen in its logical shape, sharing storage (loads land in place).

    A DTensor becomes an unevenly sharded DTensor whose local tensor is a view of this
    rank's shard without its padding rows; DCP then records the logical global shape.
    """
    logical_shape = tuple(int(s) for s in logical_shape)
    if tuple(t.shape) == logical_shape:
        return t
    if not isinstance(t, DTensor):
        view = t
        for d, size in enumerate(logical_shape):
            view = view.narrow(d, 0, size)
        return view
    local = t.to_local()
    sizes, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    valid = [max(0, min(s, n - o)) for s, o, n in zip(sizes, offsets, logical_shape)]
    want_sizes, want_offsets = compute_local_shape_and_global_offset(
        logical_shape, t.device_mesh, t.placements
    )
    nonempty = all(v > 0 for v in valid)
    if list(want_sizes) != valid or (nonempty and list(want_offsets) != list(offsets)):
        raise NotImplementedError(
            f"{name}: padding of a {tuple(t.shape)} tensor with placements {t.placements} "
            f"does not map onto an even sharding of its logical shape {logical_shape}; "
            "checkpointing this layout is not supported."
        )
    view = local
    for d, size in enumerate(valid):
        if size != view.shape[d]:
            view = view.narrow(d, 0, size)
    return DTensor.from_local(
        view,
        t.device_mesh,
        t.placements,
        run_check=False,
        shape=torch.Size(logical_shape),
        stride=_contiguous_stride(logical_shape),
    )


def _split_optim_key(key: str, fqns) -> tuple[str, str, str]:
    """``"state.a.b.weight.exp_avg"`` -> ``("state.", "a.b.weight", "exp_avg")``.

    ``fqns`` are the parameter names; the state part may itself be nested (``"x.y"``).
    """
    for section in _OPTIM_SECTIONS:
        if key.startswith(section):
            rest = key[len(section) :]
            parts = rest.split(".")
            for i in range(len(parts) - 1, 0, -1):  # the longest parameter name first
                fqn = ".".join(parts[:i])
                if fqn in fqns:
                    return section, fqn, ".".join(parts[i:])
    raise KeyError(f"unexpected key in a flattened optimizer state dict: {key!r}")


def _tied_weights(model: nn.Module) -> dict[str, str]:
    """``{copy name: canonical name}`` for the tied copies this rank holds.

    Collective (one ``all_gather_object``) unless the model declares
    ``checkpoint_tied_weights``: a rank on the last stage does not hold the embedding, so
    the members of each ``libai_tied_group`` are gathered from every rank first.
    """
    names = dict(model.named_parameters())
    declared = getattr(model, "checkpoint_tied_weights", None)
    if callable(declared):
        declared = declared()
    if declared is not None:
        return {copy: canon for copy, canon in dict(declared).items() if copy in names}
    local = []
    for order, (name, p) in enumerate(names.items()):
        group = getattr(p, "libai_tied_group", None)
        if group is not None:
            local.append((group, name, bool(getattr(p, "libai_tied_copy", False)), order))
    stage = dist.get_dist_util().pipeline_rank
    gathered = [(stage, local)]
    if torch_dist.is_initialized() and torch_dist.get_world_size() > 1:
        gathered = [None] * torch_dist.get_world_size()
        torch_dist.all_gather_object(gathered, (stage, local))
    groups: dict[str, dict[str, tuple]] = {}
    for rank_stage, items in gathered:
        for group, name, is_copy, order in items:
            groups.setdefault(group, {})[name] = (is_copy, rank_stage, order)
    mapping = {}
    for members in groups.values():
        sources = [n for n, (is_copy, _, _) in members.items() if not is_copy]
        if len(sources) == 1:
            canon = sources[0]
        else:  # no (or several) unmarked members: the first stage's, first in its order
            canon = min(members, key=lambda n: (members[n][1], members[n][2], n))
        for name in members:
            if name != canon and name in names:
                mapping[name] = canon
    return mapping


class _View:
    """This rank's flat checkpoint dict, and how loaded values map back to the state dicts.

    Keys: ``model.<fqn>``, ``<optimizer>.state.<fqn>.<name>`` (tensors) and
    ``<optimizer>.param_groups.<fqn>`` (the parameter's hyper-parameters, one pickled
    entry per parameter; a key a newer torch adds is then not a missing-key error).
    """

    def __init__(self):
        self.entries: dict[str, Any] = {}  # checkpoint key -> tensor (view) or object
        self.back: dict[str, list[tuple[dict, str, str | None]]] = {}  # -> (dict, key, sub)
        self.groups: dict[str, dict[str, Any]] = {}  # param_groups key -> {name: value}
        self.deferred: list[tuple[dict, str, str]] = []  # (dict, copy key, canonical key)

    def add(self, key: str, value, source: dict, source_key: str) -> None:
        self.entries[key] = value
        self.back[key] = [(source, source_key, None)]

    def add_group_value(self, key: str, sub: str, value, source: dict, source_key: str):
        self.groups.setdefault(key, {})[sub] = value
        self.entries[key] = None  # set by finalize()
        self.back.setdefault(key, []).append((source, source_key, sub))

    def finalize(self) -> _View:
        for key, group in self.groups.items():
            self.entries[key] = pickle.dumps(group)
        return self

    def write_back(self) -> None:
        """After ``dcp.load``: tensors were loaded in place; put the objects back."""
        for key, value in self.entries.items():
            if isinstance(value, torch.Tensor):
                continue
            if isinstance(value, bytes):
                value = pickle.loads(value)
            for source, source_key, sub in self.back[key]:
                if sub is None:
                    source[source_key] = value
                elif sub in value:  # a hyper-parameter the checkpoint lacks keeps its value
                    source[source_key] = value[sub]
        with torch.no_grad():
            for source, copy_key, canon_key in self.deferred:
                if isinstance(source[copy_key], torch.Tensor):
                    source[copy_key].copy_(source[canon_key])
                else:
                    source[copy_key] = source[canon_key]


def _build_view(
    model: nn.Module,
    model_sd: dict,
    optim_sds: Mapping[str, dict],
    tied: Mapping[str, str],
    *,
    for_load: bool,
) -> _View:
    params = dict(model.named_parameters())
    logical = {
        name: (tuple(p.shape), p.libai_logical_shape)
        for name, p in params.items()
        if getattr(p, "libai_logical_shape", None) is not None
    }
    view = _View()

    def convert(fqn: str, value):
        if isinstance(value, torch.Tensor) and fqn in logical:
            padded, shape = logical[fqn]
            if tuple(value.shape) == padded:
                return _logical_view(value, shape, fqn)
        return value

    def target(fqn: str, source: dict, key: str) -> str | None:
        """The name ``fqn``'s entry has in the checkpoint (None: not read/written here)."""
        if fqn not in tied:
            return fqn
        canon = tied[fqn]
        if not for_load:
            return None  # saved once, under the canonical name
        if canon in params:  # both on this rank: copied after loading the canonical one
            view.deferred.append((source, key, key.replace(fqn, canon, 1)))
            return None
        return canon

    for key, value in model_sd.items():
        name = target(key, model_sd, key)
        if name is not None:
            view.add(f"{MODEL_KEY}.{name}", convert(key, value), model_sd, key)
    for opt_name, osd in optim_sds.items():
        for key, value in osd.items():
            section, fqn, sub = _split_optim_key(key, params)
            name = target(fqn, osd, key)
            if name is None:
                continue
            if section == "state.":
                view.add(f"{opt_name}.state.{name}.{sub}", convert(fqn, value), osd, key)
            else:
                view.add_group_value(f"{opt_name}.param_groups.{name}", sub, value, osd, key)
    return view.finalize()


# ---- validation -----------------------------------------------------------------------------
def _check_checkpoint(path: str) -> dict:
    """Fail with a clear :class:`CheckpointError` naming ``path`` unless every file is there.

    Runs no collective (every rank checks the same files), so a bad checkpoint fails all
    ranks the same way before any of them can wait in DCP. Returns rank 0's state file.
    """
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a directory).")
    meta_path = os.path.join(path, ".metadata")
    if not os.path.isfile(meta_path):
        raise CheckpointError(
            f"checkpoint {path} is incomplete or corrupt: {meta_path} is missing."
        )
    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: cannot read {meta_path} ({type(exc).__name__}: {exc})."
        ) from exc
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for rel, end in sorted(needed.items()):
        file = os.path.join(path, rel)
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint {path} is incomplete: shard file {file} is missing.")
        size = os.path.getsize(file)
        if size < end:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: shard file {file} is truncated "
                f"({size} bytes, the metadata needs {end})."
            )
    rank0 = _read_rank_file(path, 0)
    for r in range(int(rank0["layout"]["world_size"])):
        file = os.path.join(path, _rank_file(r))
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint {path} is incomplete: {file} is missing.")
    return rank0


def _read_rank_file(path: str, rank: int) -> dict:
    file = os.path.join(path, _rank_file(rank))
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint {path} is incomplete: {file} is missing.")
    try:
        state = torch.load(file, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: cannot read {file} ({type(exc).__name__}: {exc})."
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: {file} is not a libai checkpoint file.")
    return state


def _is_our_leftover(path: str) -> bool:
    """A ``.tmp`` / ``.old`` directory that only holds checkpoint files (safe to delete)."""
    try:
        entries = os.listdir(path)
    except OSError:
        return False
    pattern = re.compile(r"^(__\d+_\d+\.distcp.*|\.metadata.*|rank_\d+\.pt.*|meta\.json.*)$")
    return all(pattern.match(e) for e in entries)


def _write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Checkpointer:
    """Save and load a model and its training state as a sharded DCP checkpoint.

    Args:
        model: the (pipeline-pruned, tensor-parallel) model of this rank.
        save_dir: directory of the checkpoints and of ``last_checkpoint``.
        save_to_disk: ``False`` makes :meth:`save` a no-op; must agree on all ranks (every
            rank writes its own shards). Default ``True``.
        **checkpointables: objects with ``state_dict`` / ``load_state_dict``. Optimizers
            (``torch.optim.Optimizer``) are sharded through DCP like the model, keyed by
            parameter name: ZeRO 1/2 (each rank writes the state of the parameters it owns)
            and ZeRO 3 (dp-sharded DTensors) included, so every stage reshards; anything
            else (scheduler, grad scaler, ...) is pickled into each rank's ``rank_{r}.pt``.

    All methods that save or load are collective: call them on every rank.
    """

    def __init__(
        self, model: nn.Module, save_dir: str = "", *, save_to_disk=None, **checkpointables
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"Checkpointer needs an nn.Module, got {type(model).__name__}")
        for name, obj in checkpointables.items():
            if name in (MODEL_KEY, RNG_KEY):
                raise ValueError(f"'{name}' is a reserved checkpointable name")
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise TypeError(f"checkpointable '{name}' has no state_dict/load_state_dict")
        self.model = model
        self.save_dir = save_dir
        self.save_to_disk = True if save_to_disk is None else bool(save_to_disk)
        self.checkpointables = dict(checkpointables)

    # ---- bookkeeping ------------------------------------------------------------------------
    def _sharded_names(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if isinstance(self.checkpointables[n], torch.optim.Optimizer)]

    def _dcp_optimizer(self, name: str) -> torch.optim.Optimizer:
        """The optimizer whose state DCP saves for checkpointable ``name``: a ZeRO 1/2
        optimizer's inner one (the state of the parameters this rank owns, keyed by their
        names like any other), else the optimizer itself."""
        optimizer = self.checkpointables[name]
        return getattr(optimizer, "libai_checkpoint_optimizer", optimizer)

    def has_checkpoint(self) -> bool:
        """Whether ``save_dir/last_checkpoint`` exists."""
        return os.path.isfile(os.path.join(self.save_dir, LAST_CHECKPOINT))

    def get_checkpoint_file(self) -> str | None:
        """The newest complete checkpoint (directory) named by ``last_checkpoint``, or None."""
        file = os.path.join(self.save_dir, LAST_CHECKPOINT)
        try:
            with open(file) as f:
                name = f.read().strip()
        except OSError:
            return None
        if not name:
            return None
        return os.path.join(self.save_dir, name)

    def get_all_checkpoint_files(self) -> list[str]:
        """Every complete checkpoint directory in ``save_dir`` (sorted by name)."""
        if not os.path.isdir(self.save_dir):
            return []
        return sorted(
            os.path.join(self.save_dir, d)
            for d in os.listdir(self.save_dir)
            if not d.endswith((TMP_SUFFIX, OLD_SUFFIX))
            and os.path.isfile(os.path.join(self.save_dir, d, ".metadata"))
        )

    # ---- save -------------------------------------------------------------------------------
    def save(self, name: str, **extra) -> None:
        """Write checkpoint ``save_dir/name`` (collective) and point ``last_checkpoint`` at it.

        ``extra`` (e.g. ``iteration=``, ``consumed_train_samples=``) must be picklable; it
        comes back from :meth:`load`.
        """
        if not self.save_to_disk:
            return
        if not name or os.sep in name or name.endswith((TMP_SUFFIX, OLD_SUFFIX)):
            raise ValueError(f"invalid checkpoint name {name!r}")
        final = os.path.join(self.save_dir, name)
        tmp = final + TMP_SUFFIX
        rank = dist.get_rank()
        error = None
        if rank == 0:
            try:
                os.makedirs(self.save_dir, exist_ok=True)
                self._remove_leftovers()
                os.makedirs(tmp)
            except Exception as exc:
                error = exc
        _agree(error, f"creating {tmp}")

        error = None
        tied = _tied_weights(self.model)
        model_sd = get_model_state_dict(self.model)
        optim_sds, empty = {}, {}
        for opt_name in self._sharded_names(self.checkpointables):
            optimizer = self._dcp_optimizer(opt_name)
            empty[opt_name] = not optimizer.state
            osd = get_optimizer_state_dict(self.model, optimizer, options=_OPTIM_OPTIONS)
            if empty[opt_name]:  # DSD initialized the state with a zero-lr step: undo that
                optimizer.state.clear()
                osd = {k: v for k, v in osd.items() if not k.startswith("state.")}
            optim_sds[opt_name] = osd
        view = _build_view(self.model, model_sd, optim_sds, tied, for_load=False)
        small = [n for n in self.checkpointables if n not in optim_sds]
        try:
            # every rank writes its own shards; DCP reports a failure on any rank to all
            dcp.save(view.entries, storage_writer=dcp.FileSystemWriter(tmp, thread_count=1))
            state = {
                "format": FORMAT,
                "rank": rank,
                "layout": _layout_signature(),
                "extra": dict(extra),
                "checkpointables": {n: self.checkpointables[n].state_dict() for n in small},
                "sharded": sorted(optim_sds),
                "optimizer_empty": empty,
                "tied_weights": tied,
                RNG_KEY: _rng_state(),
            }
            torch.save(state, os.path.join(tmp, _rank_file(rank)))
        except (Exception, CheckpointException) as exc:  # DCP's exception is a BaseException
            error = exc
        _agree(
            error,
            f"saving checkpoint {final} (the previous checkpoint and {LAST_CHECKPOINT} are "
            "untouched)",
        )

        error = None
        if rank == 0:
            try:
                summary = {
                    "format": FORMAT,
                    "layout": state["layout"],
                    "extra": state["extra"],
                    "sharded": state["sharded"],
                    "checkpointables": small,
                }
                _write_text_atomic(
                    os.path.join(tmp, "meta.json"), json.dumps(summary, indent=2, default=repr)
                )
                self._commit(tmp, final, name)
                logger.info("Saved checkpoint %s", final)
            except Exception as exc:
                error = exc
        _agree(error, f"committing checkpoint {final}")

    def _commit(self, tmp: str, final: str, name: str) -> None:
        """Rank 0: ``tmp`` -> ``final``, then ``last_checkpoint`` -> ``name`` (both atomic)."""
        old = final + OLD_SUFFIX
        if os.path.exists(final):  # re-saving a name (e.g. model_final): keep it until replaced
            if os.path.exists(old):
                shutil.rmtree(old)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(self.save_dir)
        _write_text_atomic(os.path.join(self.save_dir, LAST_CHECKPOINT), name + "\n")
        _fsync_dir(self.save_dir)
        if os.path.exists(old):
            shutil.rmtree(old, ignore_errors=True)

    def _remove_leftovers(self) -> None:
        """Rank 0: delete ``*.tmp`` dirs of saves that never finished (a killed process),
        and ``*.old`` copies of checkpoints that were replaced after all."""
        for entry in os.listdir(self.save_dir):
            path = os.path.join(self.save_dir, entry)
            if not os.path.isdir(path) or not _is_our_leftover(path):
                continue
            replaced = entry.endswith(OLD_SUFFIX) and os.path.isdir(path[: -len(OLD_SUFFIX)])
            if entry.endswith(TMP_SUFFIX) or replaced:
                logger.info("Removing unfinished or replaced checkpoint %s", path)
                shutil.rmtree(path, ignore_errors=True)

    # ---- load -------------------------------------------------------------------------------
    def _resolve(self, path: str) -> str:
        if os.path.isdir(path) or not os.path.isdir(path + OLD_SUFFIX):
            return path
        # killed while replacing a checkpoint of the same name: the previous one is intact
        logger.warning("checkpoint %s is missing; using %s", path, path + OLD_SUFFIX)
        return path + OLD_SUFFIX

    def load(self, path: str, checkpointables: list[str] | None = None) -> dict:
        """Load checkpoint ``path`` into the model and the named checkpointables (collective).

        Args:
            path: a checkpoint directory written by :meth:`save`, on any layout.
            checkpointables: names to restore besides the model (``"rng"`` for the RNG
                states); ``None`` restores everything, ``[]`` the model weights only.

        Returns the ``extra`` data given to :meth:`save`. Raises :class:`CheckpointError`
        (naming ``path``) for a missing, incomplete or corrupt checkpoint.
        """
        path = self._resolve(path)
        names = list(self.checkpointables) if checkpointables is None else list(checkpointables)
        restore_rng = checkpointables is None or RNG_KEY in names
        names = [n for n in names if n != RNG_KEY]
        unknown = [n for n in names if n not in self.checkpointables]
        if unknown:
            raise KeyError(
                f"unknown checkpointables {unknown}; this Checkpointer has "
                f"{sorted(self.checkpointables)}"
            )
        error = rank0 = state = None
        try:  # no collective before every rank knows that the checkpoint is readable
            rank0 = _check_checkpoint(path)
            same_layout = rank0["layout"] == _layout_signature()
            state = _read_rank_file(path, dist.get_rank()) if same_layout else rank0
        except Exception as exc:
            error = exc
        _agree(error, f"reading checkpoint {path}")
        logger.info("Loading checkpoint from %s", path)

        tied = _tied_weights(self.model)
        model_sd = get_model_state_dict(self.model)
        optim_sds = {}
        sharded = self._sharded_names(names)
        for opt_name in sharded:
            if opt_name not in state["sharded"]:
                logger.warning("'%s' is not in checkpoint %s; not loaded", opt_name, path)
                continue
            optimizer = self._dcp_optimizer(opt_name)
            osd = get_optimizer_state_dict(self.model, optimizer, options=_OPTIM_OPTIONS)
            if state["optimizer_empty"].get(opt_name, False):  # saved before its first step
                optimizer.state.clear()
                osd = {k: v for k, v in osd.items() if not k.startswith("state.")}
            optim_sds[opt_name] = osd
        view = _build_view(self.model, model_sd, optim_sds, tied, for_load=True)
        try:
            dcp.load(view.entries, storage_reader=dcp.FileSystemReader(path))
        except (Exception, CheckpointException) as exc:  # DCP's exception is a BaseException
            raise CheckpointError(
                f"could not load checkpoint {path} into this model: {type(exc).__name__}: {exc}"
            ) from exc
        view.write_back()
        set_model_state_dict(self.model, model_sd)
        for opt_name, osd in optim_sds.items():
            optimizer = self._dcp_optimizer(opt_name)
            if state["optimizer_empty"].get(opt_name, False):
                _load_param_groups(self.model, optimizer, osd)  # DSD would init the state
            else:
                set_optimizer_state_dict(self.model, optimizer, osd, options=_OPTIM_OPTIONS)

        for name in names:
            if name in sharded:
                continue
            saved = state["checkpointables"]
            if name not in saved:
                logger.warning("'%s' is not in checkpoint %s; not loaded", name, path)
                continue
            self.checkpointables[name].load_state_dict(saved[name])
        if restore_rng:
            if same_layout:
                _set_rng_state(state[RNG_KEY])
            else:
                logger.warning(
                    "checkpoint %s was saved on another layout (%s; now %s): RNG states are "
                    "not restored",
                    path,
                    rank0["layout"],
                    _layout_signature(),
                )
        return dict(state["extra"])

    def resume_or_load(self, path: str | None, *, resume: bool = True) -> dict:
        """Resume from ``last_checkpoint`` if ``resume`` and it exists, else load weights.

        - ``resume`` and a ``last_checkpoint``: load everything; returns the saved extra data.
        - ``resume`` and none: logs "no checkpoint found in ..., starting from scratch" (or
          loads the model weights of ``path`` if given) and returns ``{}``.
        - not ``resume``: loads the model weights of ``path`` (if given); returns ``{}``.

        A ``last_checkpoint`` naming a missing or corrupt checkpoint raises
        :class:`CheckpointError`; it never silently starts from scratch.
        """
        if resume and self.has_checkpoint():
            checkpoint = self.get_checkpoint_file()
            if checkpoint is None:
                raise CheckpointError(
                    f"{os.path.join(self.save_dir, LAST_CHECKPOINT)} is empty or unreadable."
                )
            return self.load(checkpoint)
        if resume:
            logger.warning(
                "no checkpoint found in %s, starting from scratch%s",
                os.path.abspath(self.save_dir or "."),
                f" (model weights from {path})" if path else "",
            )
        if path:
            self.load(path, checkpointables=[])
        return {}


def _load_param_groups(model: nn.Module, optimizer, osd: Mapping[str, Any]) -> None:
    """Hyper-parameters only, from a flattened optimizer state dict (state left empty)."""
    names = {p: n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        fqn = names[group["params"][0]]
        for key in group:
            if key != "params" and f"param_groups.{fqn}.{key}" in osd:
                group[key] = osd[f"param_groups.{fqn}.{key}"]
    optimizer.state.clear()


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class PeriodicCheckpointer:
    """Save every ``period`` iterations and at the end; keep the newest ``max_to_keep``.

    ``step(iteration, **extra)`` saves ``{file_prefix}_{iteration:07d}`` when
    ``(iteration + 1) % period == 0`` and ``{file_prefix}_final`` at ``max_iter - 1``
    (detectron2's convention), with ``iteration`` added to ``extra``. With ``max_to_keep``
    the oldest periodic checkpoints beyond that number are deleted by rank 0 after the save
    (``_final`` and the one ``last_checkpoint`` names are never deleted); periodic
    checkpoints already in ``save_dir`` (a resumed run) count as the oldest.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        period: int,
        max_iter: int | None = None,
        max_to_keep: int | None = None,
        file_prefix: str = "model",
    ):
        if int(period) < 1:
            raise ValueError(f"checkpoint period must be >= 1, got {period}")
        if max_to_keep is not None and int(max_to_keep) < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.checkpointer = checkpointer
        self.period = int(period)
        self.max_iter = None if max_iter is None else int(max_iter)
        self.max_to_keep = None if max_to_keep is None else int(max_to_keep)
        self.file_prefix = file_prefix
        self._recent: list[str] | None = None

    def _existing(self) -> list[str]:
        pattern = re.compile(rf"^{re.escape(self.file_prefix)}_\d{{7}}$")
        return [
            os.path.basename(p)
            for p in self.checkpointer.get_all_checkpoint_files()
            if pattern.match(os.path.basename(p))
        ]

    def step(self, iteration: int, **extra) -> None:
        iteration = int(iteration)
        extra = {"iteration": iteration, **extra}
        if (iteration + 1) % self.period == 0:
            name = f"{self.file_prefix}_{iteration:07d}"
            if self._recent is None and self.max_to_keep is not None:
                self._recent = [n for n in self._existing() if n != name]
            self.checkpointer.save(name, **extra)
            if self.max_to_keep is not None:
                self._recent.append(name)
                self._delete_old()
        if self.max_iter is not None and iteration >= self.max_iter - 1:
            self.checkpointer.save(f"{self.file_prefix}_final", **extra)

    def _delete_old(self) -> None:
        latest = self.checkpointer.get_checkpoint_file()
        while len(self._recent) > self.max_to_keep:
            name = self._recent.pop(0)
            path = os.path.join(self.checkpointer.save_dir, name)
            if dist.get_rank() == 0 and path != latest and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
                logger.info("Deleted old checkpoint %s (max_to_keep=%d)", path, self.max_to_keep)

    def save(self, name: str, **extra) -> None:
        """Save now under ``name`` (e.g. from a hook at the end of training)."""
        self.checkpointer.save(name, **extra)

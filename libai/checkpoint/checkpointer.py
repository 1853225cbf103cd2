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
        meta.json              human-readable summary (run id, layout, extra)
        manifest.json          size and xxh3-64 checksum of every other file
      model_0000199.tmp/       a save in progress or killed midway: never read, removed
                               by the next save of the same name

Saving is atomic: all ranks write into ``name.tmp``, then rank 0 renames it to ``name``
and atomically rewrites ``last_checkpoint``. A process killed at any point leaves the
previous checkpoint intact and ``last_checkpoint`` pointing at it.

Loading is safe and checked: every file is verified against ``manifest.json`` (a flipped
byte names the file and the checkpoint to fall back to), and nothing in a checkpoint runs
code (:mod:`libai.checkpoint.safe_load`: weights-only ``torch.load``, an allow-list for DCP's
metadata). Retention deletes only the checkpoints of the run that saves (``run_id``).

Usage (detectron2 / LiBai style)::

    checkpointer = Checkpointer(model, cfg.train.output_dir, optimizer=opt, scheduler=sched)
    checkpointer.save("model_0000099", iteration=99, consumed_train_samples=6400)
    extra = checkpointer.resume_or_load(cfg.train.load_weight, resume=args.resume)
    start_iter = extra.get("iteration", -1) + 1
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import shutil
import uuid
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

from libai import dist
from libai.checkpoint.files import (
    FORMAT,
    LAST_CHECKPOINT,
    META,
    OLD_SUFFIX,
    TMP_SUFFIX,
    CheckpointError,
    aside_path,
    check_checkpoint,
    exception_chain,
    fallback_hint,
    fsync_dir,
    is_disk_full,
    is_our_leftover,
    list_checkpoints,
    one_line,
    rank_file,
    read_last_checkpoint,
    read_rank_file,
    run_id_of,
    write_bytes_durable,
)
from libai.checkpoint.files import write_text_atomic as _write_text_atomic
from libai.checkpoint.lora_base import (
    CHECKPOINT,
    describe,
    fingerprint,
    is_lora_model,
    is_lora_name,
    trained_names,
    weights_source,
)
from libai.checkpoint.manifest import MANIFEST, file_checksums, manifest_text
from libai.checkpoint.messages import (
    get_missing_parameters_message,
    get_unexpected_parameters_message,
)
from libai.checkpoint.safe_load import (
    DataOnlyFileSystemReader,
    DataOnlyLoadPlanner,
    UnsafeDataError,
    read_dcp_metadata,
    torch_load_data,
)
from libai.checkpoint.view import MODEL_KEY, build_view, tied_weights
from libai.models.utils.hf_io import record_weights_source

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "PeriodicCheckpointer",
    "get_missing_parameters_message",
    "get_unexpected_parameters_message",
    "read_checkpoint_metadata",
]

RNG_KEY = "rng"
_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
_PARTIAL = StateDictOptions(strict=False)  # a LoRA run's adapters alone, or its base alone


def read_checkpoint_metadata(path: str):
    """DCP's metadata of checkpoint ``path`` (global shapes and chunks), read as data: a
    :class:`CheckpointError` for a missing, corrupt or unsafe file."""
    try:
        return read_dcp_metadata(path)
    except UnsafeDataError as exc:
        raise CheckpointError(f"refusing to load checkpoint {path}: .metadata {exc}.") from None
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path}: cannot read .metadata: {exc}.") from None


# ---- collectives ------------------------------------------------------------------------------
def _world() -> int:
    initialized = torch_dist.is_initialized()
    return torch_dist.get_world_size() if initialized else 1


def _all_gather(obj) -> list:
    if _world() == 1:
        return [obj]
    gathered = [None] * _world()
    torch_dist.all_gather_object(gathered, obj)
    return gathered


def _from_rank0(obj):
    if _world() == 1:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def _agree(error: BaseException | None, what: str) -> None:
    """Collective: if any rank failed (``error``), raise a :class:`CheckpointError` on all.

    Lets a failure on one rank (a full disk, an unreadable file) stop every rank instead of
    leaving the others waiting in the next collective. Doubles as a barrier. The message is
    one line.
    """
    message = None
    if error is not None:
        message = str(error) if isinstance(error, CheckpointError) else f"{what} failed: "
        if not isinstance(error, CheckpointError):
            message += one_line(error)
    failed = [(rank, m) for rank, m in enumerate(_all_gather(message)) if m is not None]
    if not failed:
        return
    if error is not None and isinstance(error, CheckpointError):
        raise error
    ranks = [rank for rank, _ in failed]
    suffix = f" (on rank(s) {ranks})" if _world() > 1 else ""
    raise CheckpointError(f"{failed[0][1]}{suffix}") from error


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


# ---- RNG: stored as tensors, ints and tuples, which weights-only loading allows ---------------
def _rng_state() -> dict:
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping) -> None:
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, Mapping):
        numpy_state = (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    np.random.set_state(numpy_state)  # older checkpoints: numpy's own tuple
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _data_bytes(obj, what: str, checkpoint: str) -> bytes:
    """``obj`` as a torch archive that loads back weights-only; a :class:`CheckpointError`
    naming ``what`` if it holds anything else (it could only be loaded by running code)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    try:
        torch_load_data(io.BytesIO(buffer.getvalue()))
    except UnsafeDataError as exc:
        raise CheckpointError(
            f"cannot save checkpoint {checkpoint}: {what} holds a {exc.global_name}, which "
            "only code could rebuild on load; checkpoints hold data only (tensors, numbers, "
            "strings and containers of them): make its state_dict return such values."
        ) from None
    return buffer.getvalue()


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
            else (scheduler, grad scaler, ...) goes into each rank's ``rank_{r}.pt``, and
            must be data (tensors, numbers, strings, containers): loading never runs code.

    ``run_id`` names the run whose checkpoints this object writes: a new one for a fresh
    start, the saved run's after a full :meth:`load` (a resume). Retention
    (:class:`PeriodicCheckpointer`) deletes only checkpoints of this run, and a save that
    reuses another run's checkpoint name moves that checkpoint aside instead of replacing it.
    ``resume_hint`` is how a user of this front door resumes (shown when a fresh run finds
    checkpoints of an earlier one).

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
        self.run_id = uuid.uuid4().hex[:12]
        self.resume_hint = "resume it (tools/train_net.py --resume)"
        self._warned_leftovers: set[str] = set()

    # ---- bookkeeping ------------------------------------------------------------------------
    @property
    def state_model(self) -> nn.Module:
        """The module whose state is saved and loaded: the model, or under mixed precision
        O2 its view with the fp32 master weights as parameters (same names)."""
        master_weights = self.model.__dict__.get("libai_master_weights")
        return self.model if master_weights is None else master_weights.checkpoint_model

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
        return read_last_checkpoint(self.save_dir)

    def get_all_checkpoint_files(self) -> list[str]:
        """Every complete checkpoint directory in ``save_dir`` (sorted by name)."""
        return [os.path.join(self.save_dir, d) for d in list_checkpoints(self.save_dir)]

    def warn_about_existing_checkpoints(self) -> list[str]:
        """Before a fresh start: warn if ``save_dir`` holds checkpoints (of an earlier run),
        naming them and how to resume; they are kept. Returns their names."""
        names = list_checkpoints(self.save_dir)
        if names and dist.get_rank() == 0:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            logger.warning(
                "%s already holds checkpoints of an earlier run: %s. They are kept: this run "
                "deletes only its own checkpoints, and moves aside one whose name it saves "
                "again. To continue that run instead, %s.",
                os.path.abspath(self.save_dir),
                shown,
                self.resume_hint,
            )
        return names

    # ---- save -------------------------------------------------------------------------------
    def save(self, name: str, **extra) -> None:
        """Write checkpoint ``save_dir/name`` (collective) and point ``last_checkpoint`` at it.

        ``extra`` (e.g. ``iteration=``, ``consumed_train_samples=``) must be data (numbers,
        strings, tensors, containers); it comes back from :meth:`load`. A failed save (a
        full disk, ...) raises one :class:`CheckpointError` on every rank, removes its
        partial files and leaves the previous checkpoint and ``last_checkpoint`` intact.
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
                self._clear_tmp(tmp)
                os.makedirs(tmp)
            except Exception as exc:
                error = self._save_failure(exc, tmp, tmp)
        _agree(error, f"creating {tmp}")

        state = self._write_shards(final, tmp, extra)
        entries = self._checksum(final, tmp, state)
        error = None
        if rank == 0:
            try:
                _write_text_atomic(os.path.join(tmp, MANIFEST), manifest_text(entries))
                self._commit(tmp, final, name)
                logger.info("Saved checkpoint %s", final)
            except Exception as exc:
                error = self._save_failure(exc, tmp, os.path.join(tmp, MANIFEST))
        _agree(error, f"committing checkpoint {final}")

    def _write_shards(self, final: str, tmp: str, extra: Mapping) -> dict:
        """Every rank writes its tensor shards (DCP) and its ``rank_N.pt`` into ``tmp``."""
        rank = dist.get_rank()
        model = self.state_model
        tied = tied_weights(model)
        model_sd = get_model_state_dict(model)
        lora_base = self._lora_base()
        if lora_base is not None:  # the base is on disk already: the trained parameters only
            trained = trained_names(self.model)
            model_sd = {k: v for k, v in model_sd.items() if k in trained}
        optim_sds, empty = {}, {}
        for opt_name in self._sharded_names(self.checkpointables):
            optimizer = self._dcp_optimizer(opt_name)
            empty[opt_name] = not optimizer.state
            osd = get_optimizer_state_dict(model, optimizer, options=_OPTIM_OPTIONS)
            if empty[opt_name]:  # DSD initialized the state with a zero-lr step: undo that
                optimizer.state.clear()
                osd = {k: v for k, v in osd.items() if not k.startswith("state.")}
            optim_sds[opt_name] = osd
        view = build_view(model, model_sd, optim_sds, tied, for_load=False)
        small = [n for n in self.checkpointables if n not in optim_sds]
        error, state, writing = None, None, tmp
        try:
            # every rank writes its own shards; DCP reports a failure on any rank to all
            dcp.save(view.entries, storage_writer=dcp.FileSystemWriter(tmp, thread_count=1))
            state = {
                "format": FORMAT,
                "rank": rank,
                "run_id": self.run_id,
                "layout": _layout_signature(),
                "extra": dict(extra),
                "checkpointables": {n: self.checkpointables[n].state_dict() for n in small},
                "sharded": sorted(optim_sds),
                "optimizer_empty": empty,
                "tied_weights": tied,
                "lora_base": lora_base,
                RNG_KEY: _rng_state(),
            }
            _data_bytes(state["extra"], "the extra data", final)
            for n in small:
                _data_bytes(state["checkpointables"][n], f"checkpointable '{n}'", final)
            writing = os.path.join(tmp, rank_file(rank))
            write_bytes_durable(writing, _data_bytes(state, "the per-rank state", final))
        except (Exception, CheckpointException) as exc:  # DCP's exception is a BaseException
            if writing == tmp:  # DCP names each rank's shard files __<rank>_<n>.distcp
                listing = os.listdir(tmp) if os.path.isdir(tmp) else []
                shards = [f for f in listing if f.startswith(f"__{rank}_")]
                writing = os.path.join(tmp, max(shards)) if shards else tmp
            error = self._save_failure(exc, tmp, writing)
        self._agree_or_discard(
            error,
            tmp,
            f"saving checkpoint {final} (the previous checkpoint and {LAST_CHECKPOINT} are "
            "untouched)",
        )
        return state

    def _checksum(self, final: str, tmp: str, state: dict) -> dict[str, dict]:
        """Rank 0 writes ``meta.json``; then each rank hashes every world-th file of ``tmp``.
        Returns the manifest entries of all files (on every rank)."""
        rank, world = dist.get_rank(), _world()
        listing = None
        if rank == 0:
            summary = {
                "format": FORMAT,
                "run_id": self.run_id,
                "layout": state["layout"],
                "extra": state["extra"],
                "sharded": state["sharded"],
                "checkpointables": sorted(state["checkpointables"]),
            }
            try:
                text = json.dumps(summary, indent=2, default=repr)
                _write_text_atomic(os.path.join(tmp, META), text)
                listing = sorted(f for f in os.listdir(tmp) if f != MANIFEST)
            except Exception as exc:
                listing = str(self._save_failure(exc, tmp, os.path.join(tmp, META)))
        listing = _from_rank0(listing)
        if isinstance(listing, str):
            self._agree_or_discard(CheckpointError(listing), tmp, "")
        error, mine = None, {}
        try:
            mine = file_checksums(tmp, listing[rank::world])
        except Exception as exc:
            error = exc
        gathered = _all_gather(mine)
        self._agree_or_discard(error, tmp, f"checksumming checkpoint {final}")
        return {name: entry for part in gathered for name, entry in part.items()}

    def _save_failure(self, exc: BaseException, tmp: str, writing: str) -> BaseException:
        """A full disk as the one line users need; any other error unchanged."""
        if isinstance(exc, CheckpointError) or not is_disk_full(exc, os.path.dirname(tmp)):
            return exc
        last = self.get_checkpoint_file()
        intact = (
            f"the last complete checkpoint {last} is intact"
            if last
            else "no earlier checkpoint exists"
        )
        return CheckpointError(f"No space left on device while writing {writing}; {intact}.")

    def _agree_or_discard(self, error, tmp: str, what: str) -> None:
        """:func:`_agree`; on failure rank 0 removes this save's partial ``tmp`` first."""
        try:
            _agree(error, what)
        except CheckpointError:
            if dist.get_rank() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _commit(self, tmp: str, final: str, name: str) -> None:
        """Rank 0: ``tmp`` -> ``final``, then ``last_checkpoint`` -> ``name`` (both atomic).

        A checkpoint of this run already named ``name`` (``model_final``, ``model_best``)
        is replaced; one of another run is moved aside and kept."""
        old = final + OLD_SUFFIX
        if os.path.exists(final):
            if run_id_of(final) == self.run_id:  # keep it until the new one is in place
                if os.path.exists(old):
                    shutil.rmtree(old)
                os.rename(final, old)
            else:
                aside = aside_path(final)
                os.rename(final, aside)
                logger.warning(
                    "%s was saved by another run: moved to %s (kept), saving this run's %s",
                    final,
                    aside,
                    name,
                )
        os.rename(tmp, final)
        fsync_dir(self.save_dir)
        _write_text_atomic(os.path.join(self.save_dir, LAST_CHECKPOINT), name + "\n")
        fsync_dir(self.save_dir)
        if os.path.exists(old):
            shutil.rmtree(old, ignore_errors=True)

    def _clear_tmp(self, tmp: str) -> None:
        """Rank 0, before a save into ``tmp``: remove a ``tmp`` left by an interrupted save of
        the same name (checkpoint files only), and the ``.old`` copy of a checkpoint that was
        replaced after all. Other leftovers are named once, never deleted."""
        final = tmp[: -len(TMP_SUFFIX)]
        if os.path.isdir(tmp):
            if not is_our_leftover(tmp):
                raise CheckpointError(
                    f"{tmp} holds files that are not checkpoint files; move it away to save "
                    f"{os.path.basename(final)}"
                )
            logger.info("Removing %s, an unfinished save of the same checkpoint", tmp)
            shutil.rmtree(tmp)
        if os.path.isdir(final + OLD_SUFFIX) and os.path.isdir(final):
            if is_our_leftover(final + OLD_SUFFIX) and run_id_of(final) == self.run_id:
                shutil.rmtree(final + OLD_SUFFIX, ignore_errors=True)
        for entry in sorted(os.listdir(self.save_dir)):
            path = os.path.join(self.save_dir, entry)
            if entry.endswith(TMP_SUFFIX) and path != tmp and path not in self._warned_leftovers:
                self._warned_leftovers.add(path)
                logger.warning(
                    "%s is an unfinished save (a process was killed while saving): not a "
                    "checkpoint, never loaded; delete it to free its space",
                    path,
                )

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
                states); ``None`` restores everything (a resume: this object then continues
                the saved run, see ``run_id``), ``[]`` the model weights only.

        Every file is checked against the checkpoint's manifest first (each rank checksums
        a share), and nothing in it can run code: pickled data is read weights-only and
        DCP's metadata through an allow-list. Returns the ``extra`` data given to
        :meth:`save`. Raises :class:`CheckpointError` (one line naming ``path``) for a
        missing, incomplete, corrupt or unsafe checkpoint.
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
        verified = False
        try:  # no collective before every rank knows that the checkpoint is readable
            rank0, verified = check_checkpoint(path, dist.get_rank(), _world())
            same_layout = rank0["layout"] == _layout_signature()
            state = read_rank_file(path, dist.get_rank()) if same_layout else rank0
        except Exception as exc:
            error = exc
        _agree(error, f"reading checkpoint {path}")
        lora_base = rank0.get("lora_base")
        if lora_base is not None:
            self._hold_lora_base(path, lora_base)  # may load a checkpoint base first
        logger.info("Loading checkpoint from %s", path)
        if not verified:
            logger.warning(
                "checkpoint %s has no %s (saved by an older libai): its files are not verified",
                path,
                MANIFEST,
            )

        model = self.state_model
        tied = tied_weights(model)
        model_sd = get_model_state_dict(model)
        weights_only = checkpointables is not None and not names
        error = partial = None
        try:  # a pipeline stage may miss adapters the others hold: every rank stops
            partial = self._partial_keys(path, lora_base, model_sd, weights_only)
        except CheckpointError as exc:
            error = exc
        _agree(error, f"loading checkpoint {path}")
        if partial is not None:
            model_sd = {k: v for k, v in model_sd.items() if k in partial}
        optim_sds = {}
        sharded = self._sharded_names(names)
        for opt_name in sharded:
            if opt_name not in state["sharded"]:
                logger.warning("'%s' is not in checkpoint %s; not loaded", opt_name, path)
                continue
            optimizer = self._dcp_optimizer(opt_name)
            osd = get_optimizer_state_dict(model, optimizer, options=_OPTIM_OPTIONS)
            if state["optimizer_empty"].get(opt_name, False):  # saved before its first step
                optimizer.state.clear()
                osd = {k: v for k, v in osd.items() if not k.startswith("state.")}
            optim_sds[opt_name] = osd
        view = build_view(model, model_sd, optim_sds, tied, for_load=True)
        try:
            dcp.load(
                view.entries,
                storage_reader=DataOnlyFileSystemReader(path),
                planner=DataOnlyLoadPlanner(),
            )
            view.write_back()
        except (Exception, CheckpointException) as exc:  # DCP's exception is a BaseException
            unsafe = [e for e in exception_chain(exc) if isinstance(e, UnsafeDataError)]
            if unsafe:
                raise CheckpointError(f"refusing to load checkpoint {path}: {unsafe[0]}.") from None
            raise CheckpointError(
                f"could not load checkpoint {path} into this model: {one_line(exc)}"
                f"{fallback_hint(path) if not verified else ''}"
            ) from None
        set_model_state_dict(model, model_sd, options=_PARTIAL if partial is not None else None)
        if lora_base is None and weights_only and verified:  # the weights are this file's
            record_weights_source(self.model, CHECKPOINT, path)
        if model is not self.model:  # O2: the loaded fp32 masters, rounded into the model
            self.model.libai_master_weights.after_load()
        for opt_name, osd in optim_sds.items():
            optimizer = self._dcp_optimizer(opt_name)
            if state["optimizer_empty"].get(opt_name, False):
                _load_param_groups(model, optimizer, osd)  # DSD would init the state
            else:
                set_optimizer_state_dict(model, optimizer, osd, options=_OPTIM_OPTIONS)

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
        if checkpointables is None and isinstance(rank0.get("run_id"), str):
            self.run_id = rank0["run_id"]  # a resume continues the saved run
        return dict(state["extra"])

    # ---- LoRA runs: adapter-only checkpoints (libai.checkpoint.lora_base) ---------------------
    def _identity(self) -> dict | None:
        """The model's weight source with its hash (collective: rank 0 hashes), or None."""
        source = weights_source(self.model)
        if source is None:
            return None
        identity = error = None
        if dist.get_rank() == 0:
            try:
                identity = {**source, "sha256": fingerprint(source)}
            except Exception as exc:
                error = CheckpointError(
                    f"cannot read the weights this model was loaded from ({source['path']}) "
                    f"to identify them: {one_line(exc)}"
                )
        _agree(error, "identifying the model's weights")
        return _from_rank0(identity)

    def _lora_base(self) -> dict | None:
        """A LoRA run whose base was read from files saves its trained parameters alone with
        this identity of the base; None saves the whole model (collective)."""
        return self._identity() if is_lora_model(self.model) else None

    def _hold_lora_base(self, path: str, base: dict) -> None:
        """Make sure the model holds the base the adapters of checkpoint ``path`` were
        trained on (collective): a libai checkpoint base is loaded from its path; any other
        mismatch raises, naming both."""
        current = self._identity()
        held = current is not None and current["sha256"] == base["sha256"]
        if not held and base["kind"] == CHECKPOINT and os.path.isdir(base["path"]):
            logger.info("Loading the LoRA base of %s: checkpoint %s", path, base["path"])
            self.load(base["path"], checkpointables=[])
            current = self._identity()
        if current is not None and current["sha256"] == base["sha256"]:
            return
        if current is not None and current["path"] == base["path"]:
            raise CheckpointError(
                f"checkpoint {path} holds LoRA adapters trained on {describe(base)}, but the "
                f"weights there changed since (sha256 now {current['sha256'][:12]}): restore "
                "them to load these adapters"
            )
        raise CheckpointError(
            f"checkpoint {path} holds LoRA adapters trained on {describe(base)}, but this "
            f"model holds {describe(current)}: build the model from {base['path']} "
            "(model.path or train.load_weight) to load them"
        )

    def _partial_keys(self, path, lora_base, model_sd, weights_only: bool):
        """The model keys to load when the checkpoint holds a part of a LoRA model (None: all):
        the adapters of an adapter-only checkpoint, or the base of a LoRA model read from a
        checkpoint saved without adapters (``train.load_weight`` of a base)."""
        if not is_lora_model(self.model):
            if lora_base is not None:
                raise CheckpointError(
                    f"checkpoint {path} holds LoRA adapters only: apply the run's LoRA "
                    "settings (train.lora) to the model before loading it"
                )
            return None
        keys = read_checkpoint_metadata(path).state_dict_metadata  # only LoRA models read it
        saved = {k[len(MODEL_KEY) + 1 :] for k in keys if k.startswith(MODEL_KEY + ".")}
        if lora_base is not None:
            trained = trained_names(self.model)
            missing = sorted(trained - saved)
            if missing:
                raise CheckpointError(
                    f"checkpoint {path} has no {missing[0]} (and {len(missing) - 1} more): "
                    "adapters of other train.lora settings (target_modules, modules_to_save)"
                )
            return trained
        if weights_only and not any(map(is_lora_name, saved)):
            logger.info("Loading the base weights of %s into the LoRA model", path)
            return {k for k in model_sd if not is_lora_name(k)}
        return None

    def resume_or_load(self, path: str | None, *, resume: bool = True) -> dict:
        """Resume from ``last_checkpoint`` if ``resume`` and it exists, else load weights.

        - ``resume`` and a ``last_checkpoint``: load everything; returns the saved extra data.
        - ``resume`` and none: logs "no checkpoint found in ..., starting from scratch" (or
          loads the model weights of ``path`` if given) and returns ``{}``.
        - not ``resume``: loads the model weights of ``path`` (if given); returns ``{}``.

        A fresh start in a ``save_dir`` that holds checkpoints keeps them and warns, naming
        them and how to resume (:meth:`warn_about_existing_checkpoints`). A
        ``last_checkpoint`` naming a missing or corrupt checkpoint raises
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
        self.warn_about_existing_checkpoints()
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


class PeriodicCheckpointer:
    """Save every ``period`` iterations and at the end; keep this run's newest ``max_to_keep``.

    ``step(iteration, **extra)`` saves ``{file_prefix}_{iteration:07d}`` when
    ``(iteration + 1) % period == 0`` and ``{file_prefix}_final`` at ``max_iter - 1``
    (detectron2's convention), with ``iteration`` added to ``extra``. With ``max_to_keep``
    rank 0 deletes the oldest periodic checkpoints *of this run* beyond that number after
    each save (fvcore's rule): the ones this process saved and, after a resume, those the
    resumed run saved (the same ``run_id`` in their ``meta.json``). Checkpoints of any
    other run, ``_final`` and the one ``last_checkpoint`` names are never deleted.
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

    def _this_runs(self) -> list[str]:
        """The periodic checkpoints in ``save_dir`` that this run saved (by ``run_id``)."""
        pattern = re.compile(rf"^{re.escape(self.file_prefix)}_\d{{7}}$")
        return [
            os.path.basename(p)
            for p in self.checkpointer.get_all_checkpoint_files()
            if pattern.match(os.path.basename(p)) and run_id_of(p) == self.checkpointer.run_id
        ]

    def step(self, iteration: int, **extra) -> None:
        iteration = int(iteration)
        extra = {"iteration": iteration, **extra}
        if (iteration + 1) % self.period == 0:
            name = f"{self.file_prefix}_{iteration:07d}"
            if self._recent is None and self.max_to_keep is not None:
                self._recent = [n for n in self._this_runs() if n != name]
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
            if (
                dist.get_rank() == 0
                and path != latest
                and os.path.isdir(path)
                and run_id_of(path) == self.checkpointer.run_id
            ):
                shutil.rmtree(path, ignore_errors=True)
                logger.info("Deleted old checkpoint %s (max_to_keep=%d)", path, self.max_to_keep)

    def save(self, name: str, **extra) -> None:
        """Save now under ``name`` (e.g. from a hook at the end of training)."""
        self.checkpointer.save(name, **extra)

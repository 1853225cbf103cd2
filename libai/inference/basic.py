"""``BasePipeline``: build a model on a (dp, tp, pp) layout, then preprocess -> forward ->
postprocess under ``torch.no_grad()`` (LiBai's ``libai/inference/basic.py``).

Every process of the launch builds the same pipeline and calls it with the same inputs (as
in LiBai: ``bash tools/infer.sh my_script.py 4``). Inside a call:

1. the batch of inputs is split over the data-parallel replicas (contiguous chunks, so the
   order is kept);
2. each replica's ranks run :meth:`BasePipeline.preprocess` on its chunk, then
   :meth:`BasePipeline.forward` through the pipeline stages (:class:`StagePipe` moves the
   activations; tensor-parallel peers compute together);
3. the last pipeline stage runs :meth:`BasePipeline.postprocess` and ships the (small,
   picklable) results to the first stage, whose tp-rank-0 process sends them to global
   rank 0, which concatenates the replicas' results in input order.

**Global rank 0 returns the results; every other rank returns ``None``.**

A subclass implements ``_parse_parameters``, ``preprocess``, ``forward`` (usually
``self.run_model(model_inputs)`` plus a gather of vocab-split logits) and ``postprocess``.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.distributed as torch_dist
from omegaconf import OmegaConf
from torch import nn

from libai import dist
from libai.config import LazyConfig, instantiate, locate, try_get_key
from libai.inference.stage_comm import StagePipe
from libai.inference.tokenizer_loading import find_tokenizer_files, load_tokenizer
from libai.models.lora import apply_lora, merge_lora
from libai.models.lora_peft import load_peft_adapter
from libai.models.utils import CheckpointReader, load_huggingface, read_hf_config
from libai.runtime.pipeline_split import pipeline_inputs, pipeline_stage_kwargs, prune_to_stages
from libai.runtime.run_config import model_num_layers
from libai.runtime.spec import as_spec_lora

logger = logging.getLogger(__name__)

MODES = ("libai", "huggingface", "random")
DEVICES = ("cpu", "cuda")


def _get(cfg, *keys: str, default=None):
    """:func:`try_get_key` that also accepts ``cfg=None``."""
    return default if cfg is None else try_get_key(cfg, *keys, default=default)


# ---- layout -------------------------------------------------------------------------------------
def num_layers_from_hf_config(hf_config: Mapping) -> int | None:
    """The pipeline layer count of a Hugging Face ``config.json`` (T5: encoder + decoder)."""
    if hf_config.get("model_type") in ("t5", "mt5"):
        encoder = hf_config.get("num_layers")
        decoder = hf_config.get("num_decoder_layers") or encoder
        return None if encoder is None else int(encoder) + int(decoder)
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if hf_config.get(key) is not None:
            return int(hf_config[key])
    return None


def setup_mesh(dist_cfg: Mapping) -> dist.DistUtil:
    """The mesh of ``dist_cfg``: the current one when it already has this layout (several
    pipelines in one process share it), else a new one. The layout is validated before any
    collective, so a bad layout fails on every rank with the same ``ValueError``."""
    world = (
        torch_dist.get_world_size()
        if torch_dist.is_initialized()
        else int(os.environ.get("WORLD_SIZE", 1))
    )
    layout = dist.resolve_layout(dist_cfg, world)
    current = dist.current_dist_util()  # get_dist_util() would build a single-process one
    if current is not None and current.layout == layout:
        return current
    return dist.setup_dist_util(dict(dist_cfg))


# ---- the pipeline ---------------------------------------------------------------------------------
class BasePipeline(ABC):
    """Model + tokenizer on a parallel layout, called like a ``transformers`` pipeline.

    Args:
        config_file: a LazyConfig ``.py`` / ``.yaml`` with ``model`` (and ``tokenization``
            for text models, ``train`` optional). Needed for ``mode="libai"`` / ``"random"``;
            optional with ``"huggingface"`` (then its ``model`` picks the libai class and
            extra hyper-parameters, the Hugging Face ``config.json`` the rest).
        data_parallel: data-parallel replicas (``None``: derived from the world size).
            The product ``data_parallel x tensor_parallel x pipeline_parallel`` must equal
            the number of launched processes.
        tensor_parallel: ranks that share each layer's weights.
        pipeline_parallel: pipeline stages.
        pipeline_stage_id: one stage id per layer (LiBai's name for
            ``custom_pipeline_stage_id``), non-decreasing; overrides the even split.
        pipeline_num_layers: the model's layer count; derived from ``config.json`` or
            ``model.cfg`` when ``None``.
        model_path: ``"huggingface"``: a Hugging Face directory (``config.json``, weights and
            tokenizer files); ``"libai"``: a checkpoint directory written by the trainer
            (``output_dir/model_final``, or ``output_dir`` itself, whose
            ``last_checkpoint`` is then followed). Unused by ``"random"``.
        mode: ``"libai"``, ``"huggingface"`` or ``"random"`` (random init, for tests/demos).
        device: ``"cpu"`` (gloo) or ``"cuda"`` (nccl).
        lora_adapter: a PEFT adapter directory (``peft``'s, or one libai exported) applied to
            the model and merged into its weights (each rank its shards).
        **kwargs: default call parameters (``top_k=3``, ...), checked by
            ``_parse_parameters``; a call's own parameters override them.

    Attributes a subclass can rely on:
        ``cfg`` (the LazyConfig or ``None``), ``hf_config`` (``config.json`` as a dict, ``{}``
        without one), ``model`` (eval mode, pruned to this rank's pipeline stage),
        ``tokenizer`` (a :class:`libai.tokenizer.BaseTokenizer` or ``None``), ``pipe`` (the
        :class:`StagePipe`), ``dist_util``, ``device``, ``mode``, ``model_path``.

    Raises:
        ValueError: unknown ``mode`` / ``device`` / parameters, a missing ``config_file`` or
            ``model_path``, or a layout that does not fit the launch (before any collective).
        FileNotFoundError: a Hugging Face directory without tokenizer files, or a libai
            checkpoint path that does not exist.
        libai.models.utils.CheckpointError: a Hugging Face directory without (readable)
            weights or ``config.json``.
    """

    #: whether the model directory must hold a tokenizer (``mode="huggingface"``)
    needs_tokenizer: bool = True

    def __init__(
        self,
        config_file: str | None = None,
        data_parallel: int | None = 1,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        pipeline_stage_id: Sequence[int] | None = None,
        pipeline_num_layers: int | None = None,
        model_path: str | None = None,
        mode: str = "libai",
        device: str = "cpu",
        lora_adapter: str | None = None,
        **kwargs,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if device not in DEVICES:
            raise ValueError(f"device must be one of {list(DEVICES)}, got {device!r}")
        if mode == "huggingface" and model_path is None:
            raise ValueError("mode='huggingface' needs model_path (a Hugging Face model dir)")
        if mode == "libai" and (config_file is None or model_path is None):
            raise ValueError(
                "mode='libai' needs config_file (the LazyConfig of the model) and model_path "
                "(a checkpoint directory written by the trainer)"
            )
        if mode == "random" and config_file is None:
            raise ValueError("mode='random' needs config_file (the LazyConfig of the model)")
        self.mode, self.model_path = mode, None if model_path is None else str(model_path)
        # call parameters first: a typo fails at once, on every rank
        self._preprocess_params, self._forward_params, self._postprocess_params = (
            self._parse_parameters(**kwargs)
        )
        self.cfg = LazyConfig.load(config_file) if config_file is not None else None
        self.hf_config: dict = {}
        tokenizer_files = None
        # a LiBai project's pipeline loads its model itself (LiBai's load_pretrain_weight)
        own_loading = type(self).load_pretrain_weight is not BasePipeline.load_pretrain_weight
        if own_loading and self.cfg is None:
            raise ValueError(
                f"{type(self).__name__} loads its model with load_pretrain_weight, which takes "
                "the config's model: give config_file"
            )
        if mode == "huggingface" and not own_loading:
            self.hf_config = read_hf_config(self.model_path)
            CheckpointReader(self.model_path)  # no weights / corrupt index: fail before the mesh
            if self.needs_tokenizer:
                tokenizer_files = find_tokenizer_files(self.model_path, self.hf_config)
        elif mode == "libai" and not os.path.exists(self.model_path):
            raise FileNotFoundError(f"model_path {self.model_path} does not exist")

        if pipeline_num_layers is None and (pipeline_stage_id is not None or pipeline_parallel > 1):
            pipeline_num_layers = (
                num_layers_from_hf_config(self.hf_config)
                if mode == "huggingface"
                else model_num_layers(_get(self.cfg, "model.cfg"))
            )
        dist_cfg = {
            "data_parallel_size": data_parallel,
            "tensor_parallel_size": tensor_parallel,
            "pipeline_parallel_size": pipeline_parallel,
            "pipeline_num_layers": pipeline_num_layers,
            "custom_pipeline_stage_id": None
            if pipeline_stage_id is None
            else [int(s) for s in pipeline_stage_id],
            "device_type": device,
        }
        if _get(self.cfg, "train.dist") is not None:
            self.cfg.train.dist.update(dist_cfg)  # the config shows the layout it ran on
        self.dist_util = setup_mesh(dist_cfg)
        self.device = self.dist_util.device
        self.pipe = StagePipe(self.dist_util)

        if own_loading:  # LiBai's order: the model, then the config's tokenizer
            self.model = self.prune(
                self.load_pretrain_weight(self.cfg.model, self.model_path, mode)
            )
            self.tokenizer = self.build_tokenizer(self.cfg)
        elif mode == "huggingface":
            self.tokenizer = None if tokenizer_files is None else load_tokenizer(tokenizer_files)
            self.model = self.load_huggingface_model()
        else:
            self.tokenizer = self.build_tokenizer(self.cfg)
            self.model = self.build_model(self.cfg)
            if mode == "libai":
                lora = as_spec_lora(self.cfg)  # a LoRA run's checkpoint holds its adapters
                if lora is not None:
                    apply_lora(self.model, lora)
                self.load_checkpoint(self.model, self.model_path)
                if lora is not None:
                    merge_lora(self.model)
        if lora_adapter is not None:  # a PEFT adapter directory, folded into the weights
            load_peft_adapter(self.model, str(lora_adapter))
            merge_lora(self.model)
        self.model.eval()
        logger.info(
            "%s ready (mode=%s, stage %d of %d)",
            type(self).__name__,
            mode,
            self.pipe.stage,
            self.pipe.num_stages,
        )

    # ---- building -----------------------------------------------------------------------------
    def prune(self, model: nn.Module) -> nn.Module:
        """Drop the other pipeline stages' modules; every parameter left must be real."""
        if self.pipe.num_stages > 1:
            prune_to_stages(model, {self.pipe.stage})
        leftover = [n for n, p in model.named_parameters() if p.is_meta]
        if leftover:
            raise RuntimeError(
                f"parameters of other pipeline stages were not pruned: {leftover[:5]}"
            )
        return model

    def load_pretrain_weight(self, libai_cfg_model, model_path, mode="huggingface") -> nn.Module:
        """LiBai's hook: a pipeline subclass that overrides it builds and loads its model itself
        (a LiBai project's pipeline, with its own loader); the tokenizer then comes from the
        config. The pipelines here load through :meth:`load_huggingface_model` /
        :meth:`build_model` instead, so this one is never called."""
        raise NotImplementedError(f"{type(self).__name__} does not override load_pretrain_weight")

    def load_huggingface_model(self) -> nn.Module:
        """``load_huggingface(model_path)`` (this rank's shards only), pruned to its stage.

        With a ``config_file``, its ``model`` gives the libai class and its ``model.cfg``
        extra hyper-parameters."""
        model_cls, libai_cfg = None, None
        if _get(self.cfg, "model") is not None:
            target = _get(self.cfg, "model._target_")
            model_cls = locate(target) if isinstance(target, str) else target
            model_cfg = _get(self.cfg, "model.cfg")
            libai_cfg = (
                None if model_cfg is None else OmegaConf.to_container(model_cfg, resolve=True)
            )
        return self.prune(load_huggingface(self.model_path, model=model_cls, libai_cfg=libai_cfg))

    @classmethod
    def build_tokenizer(cls, cfg):
        """The config's tokenizer (as the trainer builds it, vocab padding included), or
        ``None`` when the config has no ``tokenization.tokenizer``."""
        if _get(cfg, "tokenization.tokenizer") is None:
            return None
        from libai.runtime.run_config import build_run_tokenizer

        return build_run_tokenizer(cfg)

    def build_model(self, cfg) -> nn.Module:
        """``instantiate(cfg.model)`` after seeding with ``train.seed`` (default 0), so the
        random weights are the same on every layout; pruned to this rank's stage."""
        if _get(cfg, "model") is None:
            raise ValueError("the config has no `model` entry")
        torch.manual_seed(int(_get(cfg, "train.seed", default=0) or 0))
        return self.prune(instantiate(cfg.model))

    @staticmethod
    def load_checkpoint(model: nn.Module, path: str) -> None:
        """Load the weights of a trainer checkpoint (any layout) into ``model`` (collective).

        ``path`` is a checkpoint directory, or an output directory whose ``last_checkpoint``
        names one."""
        from libai.checkpoint.checkpointer import Checkpointer

        checkpointer = Checkpointer(model, path)
        if checkpointer.has_checkpoint():
            path = checkpointer.get_checkpoint_file()
        checkpointer.load(path, checkpointables=[])

    # ---- parameters ---------------------------------------------------------------------------
    @abstractmethod
    def _parse_parameters(self, **pipeline_parameters) -> tuple[dict, dict, dict]:
        """Split call parameters into ``(preprocess, forward, postprocess)`` dicts; raise
        ``ValueError`` naming unknown ones (see :meth:`split_parameters`)."""

    @staticmethod
    def split_parameters(
        params: Mapping,
        preprocess: Iterable[str] = (),
        forward: Iterable[str] = (),
        postprocess: Iterable[str] = (),
    ) -> tuple[dict, dict, dict]:
        """``params`` sorted into the three groups by name; unknown names raise
        ``ValueError`` listing them and the accepted ones."""
        groups = (set(preprocess), set(forward), set(postprocess))
        known = set().union(*groups)
        unknown = sorted(k for k in params if k not in known)
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown}; accepted: {sorted(known) or 'none'}")
        return tuple({k: v for k, v in params.items() if k in g} for g in groups)

    # ---- the three steps ------------------------------------------------------------------------
    @abstractmethod
    def preprocess(self, inputs: list, **params) -> dict:
        """This replica's inputs -> the model inputs (tensors on ``self.device``); runs on
        every rank of the replica."""

    @abstractmethod
    def forward(self, model_inputs: dict, **params):
        """Run the model (collective over the replica's ranks). The return value is used on
        the last pipeline stage (``self.pipe.is_last``); return ``None`` elsewhere."""

    @abstractmethod
    def postprocess(self, model_outputs, **params) -> list:
        """The last stage's model outputs -> one picklable result per input."""

    # ---- helpers for subclasses -------------------------------------------------------------------
    def run_model(self, model_inputs: Mapping[str, torch.Tensor]):
        """One forward of the whole model through the pipeline stages; the model's
        ``pipeline_inputs`` picks the first stage's tensors from ``model_inputs``, and every
        stage reads its ``pipeline_stage_kwargs`` (padding masks) from its own copy. Returns
        the last stage's output there (tp-split logits stay split), ``None`` elsewhere."""
        first = pipeline_inputs(self.model, model_inputs)
        stage_kwargs = pipeline_stage_kwargs(self.model, model_inputs)
        return self.pipe.run(self.model.pipeline_forward, *first, **stage_kwargs)

    def dp_split(self, items: Sequence) -> list:
        """This data-parallel replica's contiguous chunk of ``items`` (maybe empty)."""
        n, dp = len(items), self.dist_util.layout.data_parallel_size
        rank = self.dist_util.data_parallel_rank
        start, stop = rank * n // dp, (rank + 1) * n // dp
        return list(items[start:stop])

    def dp_gather(self, results: list | None) -> list | None:
        """The replicas' result lists, concatenated in replica order, on global rank 0
        (called with each replica's list on its first stage); ``None`` on other ranks."""
        util = self.dist_util
        if util.pipeline_rank != 0 or util.tensor_parallel_rank != 0:
            return None
        if util.dp_group is not None:
            parts = [None] * util.layout.data_parallel_size if util.rank == 0 else None
            torch_dist.gather_object(results, parts, dst=0, group=util.dp_group)
            results = None if parts is None else [r for part in parts for r in part]
        return results if util.rank == 0 else None

    def to_device(self, tensors: Mapping[str, torch.Tensor]) -> dict:
        return {k: v.to(self.device) for k, v in tensors.items()}

    def _as_batch(self, inputs) -> tuple[list, bool]:
        """``(list of inputs, whether a single input was given)``."""
        if isinstance(inputs, (list, tuple)):
            return list(inputs), False
        return [inputs], True

    def _unbatch(self, results: list, single: bool, **call_params):
        """The value returned to the caller from the list of per-input results."""
        return results[0] if single else results

    # ---- call ----------------------------------------------------------------------------------
    def __call__(self, inputs, **kwargs):
        """Run the pipeline on ``inputs`` (one input or a list of them); ``kwargs`` override
        the parameters given at construction. Collective: call it on every rank with the
        same inputs. Returns the results on global rank 0, ``None`` on the other ranks."""
        pre, fwd, post = self._parse_parameters(**kwargs)
        pre = {**self._preprocess_params, **pre}
        fwd = {**self._forward_params, **fwd}
        post = {**self._postprocess_params, **post}
        items, single = self._as_batch(inputs)
        if not items:
            raise ValueError("no inputs given")
        local = self.dp_split(items)
        results = []
        if local:  # every rank of a replica has the same chunk: no rank waits alone
            with torch.no_grad():
                model_inputs = self.preprocess(local, **pre)
                model_outputs = self.forward(model_inputs, **fwd)
                results = self.postprocess(model_outputs, **post) if self.pipe.is_last else None
            results = self.pipe.broadcast_object_from_last(results)
        results = self.dp_gather(results)
        if results is None:
            return None
        return self._unbatch(results, single, **kwargs)

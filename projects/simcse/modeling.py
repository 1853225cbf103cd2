"""SimCSE (Gao et al., 2021) on libai's BERT encoder.

A sentence embedding is the encoder's ``[CLS]`` hidden state (or the mean over the real
tokens), optionally passed through an MLP (``dense -> tanh``) as in the paper. Training
pulls two embeddings of the same meaning together and pushes the rest of the batch away
(:func:`projects.simcse.loss.contrastive_loss`):

* **unsupervised**: a batch of single sentences ``input_ids [B, S]``; the model encodes each
  sentence twice in one forward, so that the two copies see different dropout masks, and the
  second copy is the first one's positive;
* **supervised**: ``input_ids [B, 3, S]`` -- (premise, entailment, contradiction) -- where the
  entailment is the positive and the contradiction a hard negative (``[B, 2, S]``: positive
  pairs without hard negatives).

The encoder's layers are libai's, so the model runs on any data x tensor parallel layout;
under data parallelism the in-batch negatives of all ranks are gathered (``gather_negatives``).
Pipeline parallelism is refused: the loss needs every embedding of the batch on one stage.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from libai import dist
from libai.layers import Linear, init_method_normal
from libai.models import BertModel
from libai.models.utils import load_huggingface
from libai.models.utils.hf_io import read_hf_config
from libai.models.utils.hf_kwargs import accepts_hf_keywords
from projects.simcse.loss import contrastive_loss

#: SimCSE's own options in ``model.cfg`` (next to the BERT hyper-parameters), with defaults
SIMCSE_DEFAULTS = dict(
    pooling="cls",  # "cls": the [CLS] hidden state; "mean": mean over the real tokens
    mlp="train_only",  # "train_only" (unsup. SimCSE), "always" (sup. SimCSE) or "none"
    temperature=0.05,
    hard_negative_weight=0.0,
    gather_negatives=True,  # in-batch negatives from every data-parallel rank
    pretrained_model_path=None,  # a Hugging Face BERT directory to start from
)
POOLINGS = ("cls", "mean")
MLP_MODES = ("train_only", "always", "none")


def _check_options(options: dict) -> None:
    """Raise a ``ValueError`` naming the ``model.cfg`` key of a bad option."""
    if options["pooling"] not in POOLINGS:
        raise ValueError(f"model.cfg.pooling must be one of {POOLINGS}, got {options['pooling']!r}")
    if options["mlp"] not in MLP_MODES:
        raise ValueError(f"model.cfg.mlp must be one of {MLP_MODES}, got {options['mlp']!r}")
    if not float(options["temperature"]) > 0:
        raise ValueError(f"model.cfg.temperature must be > 0, got {options['temperature']!r}")
    if dist.get_pipeline_parallel_size() > 1:
        raise ValueError(
            "SimCSE does not run with train.dist.pipeline_parallel_size > 1: its contrastive "
            "loss compares every sentence of the batch with every other one, so all embeddings "
            "must be on one stage. Use data and/or tensor parallelism instead."
        )


def load_bert_encoder(path: str, cfg: dict) -> BertModel:
    """The ``BertModel`` of the Hugging Face directory ``path`` (``BertModel`` or
    ``BertForPreTraining`` weights; the pretraining heads and BERT's pooler are left out).
    ``config.json`` decides the shapes; ``cfg`` supplies the rest (``add_pooling_layer``)."""
    model_type = read_hf_config(str(path)).get("model_type")
    if model_type != "bert":
        raise ValueError(
            f"model.cfg.pretrained_model_path={path!r} holds a {model_type!r} model; this "
            "project starts from BERT checkpoints (config.json model_type 'bert')."
        )
    return load_huggingface(str(path), model=BertModel, libai_cfg=cfg)


class SimCSE(nn.Module):
    """Sentence embeddings from a BERT encoder, trained with SimCSE's contrastive loss.

    ``SimCSE(cfg)``: ``cfg`` holds the BERT hyper-parameters (:class:`BertModel`'s) and the
    options of :data:`SIMCSE_DEFAULTS`. With ``pretrained_model_path`` the encoder is loaded
    from that Hugging Face directory (whose ``config.json`` then sets the BERT shapes).

    ``forward(input_ids, attention_mask=None, tokentype_ids=None, labels=None)``:

    * training: ``{"loss": ...}`` for ``input_ids`` of ``[B, S]`` (unsupervised: two dropout
      views of each sentence) or ``[B, n, S]`` with ``n`` = 2 (anchor, positive) or 3 (anchor,
      positive, hard negative);
    * eval: ``{"embeddings": [B, H]}`` for ``[B, S]``, ``{"embeddings": [B, n, H]}`` for
      ``[B, n, S]``, plus ``"cos_sim": [B]`` (cosine of the first two sentences of each row)
      when ``n >= 2``. ``labels`` (gold similarity scores of an evaluation batch) are accepted
      and left to the evaluator.
    """

    def __init__(self, cfg=None, **kwargs):
        super().__init__()
        cfg = {**(cfg or {}), **kwargs}
        options = {key: cfg.pop(key, default) for key, default in SIMCSE_DEFAULTS.items()}
        _check_options(options)
        self.options = options
        self.pooling, self.mlp_mode = options["pooling"], options["mlp"]
        self.temperature = float(options["temperature"])
        self.hard_negative_weight = float(options["hard_negative_weight"])
        self.gather_negatives = bool(options["gather_negatives"])
        encoder_cfg = {**cfg, "add_pooling_layer": False}  # BERT's own pooler is not used
        path = options["pretrained_model_path"]
        self.bert = load_bert_encoder(path, encoder_cfg) if path else BertModel(cfg=encoder_cfg)
        bert_cfg = self.bert.libai_cfg
        self.mlp = None
        if self.mlp_mode != "none":
            hidden = bert_cfg["hidden_size"]
            init = init_method_normal(bert_cfg["initializer_range"])
            # [S(0), B] x [B, B]^T -> [S(0), B]  (replicated, no comm)
            self.mlp = Linear(hidden, hidden, True, "data", init, layer_idx=-1)

    @property
    def libai_cfg(self) -> dict:
        """The encoder's hyper-parameters plus the SimCSE options."""
        return {**self.bert.libai_cfg, **self.options}

    # ---- embeddings ---------------------------------------------------------------------------
    def _pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def encode(self, input_ids, attention_mask=None, tokentype_ids=None) -> torch.Tensor:
        """Embeddings ``[..., hidden]`` of the sentences ``input_ids [..., seq]`` (any leading
        dims); the MLP applies in training, or always with ``mlp="always"``."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        lead, seq = input_ids.shape[:-1], input_ids.shape[-1]
        ids, mask = input_ids.reshape(-1, seq), attention_mask.reshape(-1, seq)
        types = None if tokentype_ids is None else tokentype_ids.reshape(-1, seq)
        hidden = self.bert(ids, mask, types)["last_hidden_state"]
        pooled = self._pool(hidden, mask)
        if self.mlp is not None and (self.training or self.mlp_mode == "always"):
            pooled = torch.tanh(self.mlp(pooled))
        return pooled.reshape(*lead, pooled.shape[-1])

    def _views(self, *tensors):
        """Training input as ``[B, n, S]``: a batch of single sentences (``[B, S]`` or
        ``[B, 1, S]``) becomes two copies of itself, which dropout makes two views."""
        ids = tensors[0]
        if ids.dim() not in (2, 3):
            raise ValueError(f"input_ids must be [batch, seq] or [batch, n, seq], got {ids.shape}")
        if not self.training or (ids.dim() == 3 and ids.shape[1] > 1):
            return tensors
        return tuple(
            None if t is None else t.reshape(t.shape[0], 1, t.shape[-1]).expand(-1, 2, -1)
            for t in tensors
        )

    # ---- loss -----------------------------------------------------------------------------
    def loss(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The contrastive loss of ``embeddings [B, 2 or 3, H]``; in training the candidates
        of every data-parallel rank join the negatives (``gather_negatives``)."""
        group = None
        if self.training and self.gather_negatives:
            group = dist.mesh_of(self).dp_group  # the mesh this model was built on
        return contrastive_loss(embeddings, self.temperature, self.hard_negative_weight, group)

    @accepts_hf_keywords
    def forward(self, input_ids, attention_mask=None, tokentype_ids=None, labels=None):
        del labels  # gold scores of evaluation batches: read by the evaluator from the batch
        embeddings = self.pipeline_forward(input_ids, attention_mask, tokentype_ids)
        if self.training:
            return {"loss": self.loss(embeddings)}
        out = {"embeddings": embeddings}
        if embeddings.dim() == 3 and embeddings.shape[1] >= 2:
            out["cos_sim"] = F.cosine_similarity(
                embeddings[:, 0].float(), embeddings[:, 1].float(), dim=-1
            )
        return out

    # ---- the runner's contract (libai.runtime.parallel; no pipeline split) ---------------------
    def pipeline_inputs(self, batch) -> tuple:
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        return ids, torch.ones_like(ids) if mask is None else mask, batch.get("tokentype_ids")

    def pipeline_forward(self, input_ids, attention_mask=None, tokentype_ids=None):
        """The embeddings of a batch: ``[B, 2, H]`` for single sentences in training (the two
        dropout views), else one per input sentence (``[B, H]`` or ``[B, n, H]``)."""
        return self.encode(*self._views(input_ids, attention_mask, tokentype_ids))

    def pipeline_target(self, batch):
        """Gold similarity scores of an evaluation batch (``None`` in training data)."""
        return batch.get("labels")

    def pipeline_loss(self, embeddings, target=None) -> torch.Tensor:
        """The contrastive loss of :meth:`pipeline_forward`'s output (``target`` unused)."""
        del target
        return self.loss(embeddings)

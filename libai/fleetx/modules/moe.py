"""FleetX's Mixture-of-Experts GPT pretraining: ``Model.module: MoEModule`` with
``Model.moe_configs: {expert_mode, gate, top_k, num_experts}`` and
``Engine.balance_loss_weight`` (FleetX's ``ppfleetx/configs/nlp/moe/*.yaml``).

What FleetX builds, and what this module builds for it:

- ``expert_mode: True``: every block's MLP is a MoE layer of ``num_experts`` experts *per
  data-parallel rank* (FleetX's expert group is its data-parallel group), so the model has
  ``num_experts x dp_degree`` experts split over the dp ranks (``train.dist.
  expert_parallel_size = dp_degree``); each expert is FleetX's ``ExpertLayer``: Linear with
  bias, tanh-GELU, Linear with bias; the gate is a Linear with bias. ``expert_mode: False``:
  dense blocks (FleetX builds its plain MLP then too).
- ``gate: naive``: the top-k of the gate's logits, the output weighted by those logits
  (FleetX's ``NaiveGate`` returns them unnormalized); no balancing loss.
- ``gate: gshard`` (top-2): the same routing; balancing loss FleetX's
  ``E * sum_e c_e * m_e`` (``c_e`` the share of assignments, ``m_e`` the mean softmax), i.e.
  ``top_k`` x libai's Switch/GShard loss. Its capacity (``ceil(1.2 x tokens)`` per expert)
  never binds on one rank, and FleetX shares it across ranks; here routing is dropless on
  every layout. Its random routing (dropping a second choice at random) is not applied:
  routing is deterministic, so every layout equals one process.
- ``gate: switch`` (top-1): softmax scores, the chosen expert weighted by its probability;
  balancing loss ``E * sum_e f_e * p_e``. FleetX's training noise on the logits is not
  applied (same reason); its capacity as gshard's.
- The loss: the LM loss plus ``Engine.balance_loss_weight`` x the mean over layers of their
  balancing losses (FleetX's ``MoEModule.training_step``), computed over the tokens of the
  whole global batch (FleetX: each rank's own), so dp runs equal one process.

Each departure is named once in the log when the module is built.
"""

from __future__ import annotations

import logging

from libai.fleetx.modules.gpt import GPTModule
from libai.fleetx.yaml_config import YAMLConfigError

__all__ = ["MoEModule", "fleetx_moe_settings"]

logger = logging.getLogger(__name__)

#: FleetX's gates -> (libai router scoring, FleetX's required top_k, loss scale over libai's)
GATES = {"naive": ("raw", None), "gshard": ("raw", 2), "switch": ("softmax", 1)}
MOE_CONFIG_KEYS = ("expert_mode", "gate", "top_k", "num_experts")


def fleetx_moe_settings(cfg) -> dict | None:
    """libai's ``moe`` model setting (:class:`~libai.layers.MoEConfig` keys) for a FleetX
    MoE YAML, or None for dense blocks; logs what is not FleetX's behaviour."""
    moe = dict(cfg.Model.get("moe_configs") or {})
    unknown = sorted(set(moe) - set(MOE_CONFIG_KEYS))
    if unknown:
        raise YAMLConfigError(
            f"unknown key(s) Model.moe_configs.{', '.join(unknown)}; FleetX's are "
            f"{', '.join(MOE_CONFIG_KEYS)}"
        )
    if not moe.get("expert_mode", False):
        logger.info("Model.moe_configs.expert_mode is off: dense MLP blocks, as FleetX builds")
        return None
    gate = str(moe.get("gate", "gshard"))
    if gate not in GATES:
        raise YAMLConfigError(
            f"Model.moe_configs.gate={gate!r}: FleetX's gates are {', '.join(GATES)}"
        )
    score_func, required_k = GATES[gate]
    top_k = int(moe.get("top_k", 2))
    if required_k is not None and top_k != required_k:
        raise YAMLConfigError(
            f"Model.moe_configs.top_k={top_k}: FleetX's {gate} gate takes top_k {required_k}"
        )
    per_rank = int(moe.get("num_experts", 1))
    ep = int(cfg.Distributed.get("ep_degree") or 1)
    layers = int(cfg.Model.get("num_layers") or cfg.Model.get("hidden_layers"))
    weight = float(cfg.Engine.get("balance_loss_weight") or 0.0)
    # FleetX: loss += weight x mean over layers of each gate's loss (gshard: top_k x libai's)
    scale = {"naive": 0.0, "gshard": float(top_k), "switch": 1.0}[gate]
    notes = [
        f"{per_rank} experts per data-parallel rank x {ep} ranks = {per_rank * ep} experts, "
        f"{per_rank} on each rank (expert_parallel_size={ep})",
        "balancing statistics over the whole global batch (FleetX: each rank's tokens)",
    ]
    if gate != "naive":
        notes.append(
            "no capacity limit (FleetX's ceil(1.2 x tokens) per expert never binds on one "
            "rank) and no random routing / logit noise: deterministic dropless routing"
        )
    logger.info("MoEModule (gate %s, top_k %d): %s", gate, top_k, "; ".join(notes))
    return dict(
        num_experts=per_rank * ep,
        top_k=top_k,
        score_func=score_func,
        norm_topk_prob=False,
        router_bias=True,
        ffn_bias=True,
        aux_loss_coeff=weight * scale / layers,
    )


class MoEModule(GPTModule):
    """FleetX's MoE GPT (the module doc): :class:`~libai.models.GPTForPreTraining` whose
    blocks' MLPs are MoE layers built from ``Model.moe_configs``."""

    module_keys = ("moe_configs",)

    def model_kwargs(self) -> dict:
        kwargs = super().model_kwargs()
        moe = fleetx_moe_settings(self.cfg)
        if moe is not None:
            kwargs["moe"] = moe
        return kwargs

"""GPT-2 pretraining as a task module: ``Model.module: GPTModule``."""

from __future__ import annotations

from libai.fleetx.module import InputSpec
from libai.fleetx.modules.base import ZooModule
from libai.models import GPTForPreTraining, GPTModel

__all__ = ["GPTModule"]


class GPTModule(ZooModule):
    """:class:`~libai.models.GPTForPreTraining` on ``{"input_ids", "labels"}`` batches
    (``Data.*.dataset.name: GPTDataset``); the loss is the model's, so every dp x tp x pp
    layout applies.

    ``Model`` keys: GPT's hyper-parameters (``hidden_layers``, ``hidden_size``,
    ``num_attention_heads``, ``ffn_hidden_size``, ``max_seq_length``, dropouts, ...;
    FleetX's ``num_layers``, ``max_position_embeddings``, ``hidden_dropout_prob``,
    ``attention_probs_dropout_prob`` are accepted too), and ``tokenizer: {vocab_file,
    merges_file, make_vocab_size_divisible_by}`` (files default to the built-in sample
    corpus'). ``vocab_size`` unset = the tokenizer's, padded to a multiple of
    ``make_vocab_size_divisible_by`` on every layout (as ``tools/train_net.py`` does);
    ``ffn_hidden_size`` unset or null = 4 x ``hidden_size``, as FleetX;
    ``vocab_size_divisible_unit`` pads the vocabulary to a multiple of it x ``mp_degree``.
    """

    model_class = GPTForPreTraining
    config_class = GPTModel
    aliases = {
        "num_layers": "hidden_layers",
        "max_position_embeddings": "max_seq_length",
        "hidden_dropout_prob": ("embedding_dropout_prob", "output_dropout_prob"),
        "attention_probs_dropout_prob": "attention_dropout_prob",
        "intermediate_size": "ffn_hidden_size",
    }

    def __init__(self, cfg):
        tokenizer_cfg = dict(cfg.Model.get("tokenizer") or {})
        self._divisible_by = int(tokenizer_cfg.pop("make_vocab_size_divisible_by", 128))
        self.tokenizer = _gpt2_tokenizer(**tokenizer_cfg)  # plain attributes, before the model
        super().__init__(cfg)

    def process_configs(self, configs):
        """FleetX's GPT module (its ``process_optim_configs``): with ``Optimizer.lr.
        use_increments`` the schedule advances by the global batch each step, so
        ``decay_steps`` (given in steps; unset: ``Engine.max_steps``) is turned into samples
        -- per optimizer step the cosine curve is the one of the file's ``decay_steps``."""
        lr = configs.Optimizer.get("lr")
        if hasattr(lr, "get") and lr.get("use_increments"):
            steps = lr.get("decay_steps") or configs.Engine.max_steps
            if steps and steps > 0:
                lr.decay_steps = int(steps) * int(configs.Global.global_batch_size)
        return configs

    def get_model(self):
        kwargs = self.model_kwargs()
        pretrained = self.cfg.Model.get("pretrained")
        if pretrained:  # a Hugging Face GPT-2 directory; the other keys override its config
            from libai.models.utils import load_huggingface

            return load_huggingface(str(pretrained), GPTForPreTraining, **kwargs)
        if kwargs.get("ffn_hidden_size") is None and kwargs.get("hidden_size"):
            # FleetX's `ffn_hidden_size: null` (its 1.3B .. 175B files): 4 x hidden
            kwargs["ffn_hidden_size"] = 4 * int(kwargs["hidden_size"])
        if kwargs.get("vocab_size") is None:
            kwargs["vocab_size"] = self.tokenizer.padded_vocab_size(self._divisible_by)
        unit = self.cfg.Model.get("vocab_size_divisible_unit")
        if unit:  # FleetX pads any vocab to a multiple of unit x mp_degree
            from libai.fleetx.fleetx_keys import padded_vocab_size

            kwargs["vocab_size"] = padded_vocab_size(
                kwargs["vocab_size"], unit, self.cfg.Distributed.mp_degree
            )
        return GPTForPreTraining(**kwargs)

    def pretreating_batch(self, batch):
        """FleetX's ``gpt_collate_fn`` batches carry a ``loss_mask``: its 0 positions become
        ignored labels (FleetX's masked mean loss), so the model's own loss applies."""
        from libai.data.datasets.fleetx_gpt import fold_loss_mask

        return fold_loss_mask(batch)

    def input_spec(self):
        vocab = self.model.GPT_model.embeddings.token_embeddings.num_embeddings
        return [InputSpec([None, None], "int64", "input_ids", high=vocab)]


def _gpt2_tokenizer(vocab_file=None, merges_file=None, **kwargs):
    """``Model.tokenizer``'s GPT-2 BPE. Both files null (the YAMLs' default) is the explicit
    way to ask for the built-in sample corpus' tokenizer, built in our cache directory if
    missing; given files are only read, whatever they are called."""
    from libai.tokenizer import GPT2Tokenizer

    if (vocab_file is None) != (merges_file is None):
        raise ValueError(
            "Model.tokenizer: give both vocab_file and merges_file (a GPT-2 BPE needs the two "
            "files of one tokenizer), or neither for the built-in sample corpus' tokenizer; got "
            f"vocab_file={vocab_file!r}, merges_file={merges_file!r}"
        )
    if vocab_file is None:
        from libai.data.sample_corpus import ensure_sample_dataset

        paths = ensure_sample_dataset()  # the cache directory, never a user's
        vocab_file, merges_file = paths["vocab_file"], paths["merges_file"]
    return GPT2Tokenizer(vocab_file, merges_file, **kwargs)

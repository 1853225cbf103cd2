"""Answer a prompt with a chat model fine-tuned by this project, through its chat template.

The training output directory holds everything: ``config.yaml`` (the model, the tokenizer and
the dataset's ``chat_template`` / ``end_of_turn`` settings) and the checkpoints
(``last_checkpoint`` names the newest). The conversation is rendered with the same template
as in training plus the generation prompt (``add_generation_prompt=True``), decoded by
libai's generation (:class:`libai.inference.TextGenerationPipeline`) and cut at the
end-of-turn token the model learned::

    python projects/chat_sft/chat.py output/chat_sft_tiny "What is 2 plus 3?"
    python projects/chat_sft/chat.py output/chat_sft_tiny "What is 2 plus 3?" \\
        --system "Answer in one short sentence." --max-new-tokens 64
    bash tools/infer.sh projects/chat_sft/chat.py 2 output/chat_sft_tiny "Hi" --tensor-parallel 2

Only global rank 0 prints the reply.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `projects.chat_sft` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from libai.config import LazyConfig, try_get_key  # noqa: E402
from libai.dist.cli import run_cli  # noqa: E402
from libai.inference import TextGenerationPipeline  # noqa: E402
from libai.models.utils import read_hf_config  # noqa: E402
from projects.chat_sft.chat_template import ChatTemplateError, load_chat_template  # noqa: E402


def _dataset_cfg(cfg):
    datasets = try_get_key(cfg, "dataloader.train.dataset")
    if not datasets:
        raise ValueError(
            "the config has no dataloader.train.dataset to take the chat template from"
        )
    return datasets[0]


class ChatPipeline(TextGenerationPipeline):
    """:class:`TextGenerationPipeline` whose inputs are conversations.

    An input is a list of ``{"role", "content"}`` messages (or a string: one user message).
    The chat template of the config's dataset renders it with the generation prompt; the
    text is tokenized without added special tokens (as ``apply_chat_template``), and the
    end-of-turn token joins the eos ids. Results are the replies only by default
    (``return_full_text=False``).
    """

    def __init__(self, config_file, *args, **kwargs):
        kwargs.setdefault("return_full_text", False)
        super().__init__(config_file, *args, **kwargs)
        dataset = _dataset_cfg(self.cfg)
        self.template = load_chat_template(
            self.tokenizer,
            try_get_key(dataset, "chat_template"),
            try_get_key(dataset, "end_of_turn"),
        )
        eos = self.generation_config.eos_token_ids
        try:
            end = self.tokenizer.encode(self.template.end_of_turn_text().strip())
        except ChatTemplateError:  # the template rejects the probe conversation
            end = []
        if len(end) == 1 and end[0] not in eos:
            eos = [*eos, end[0]]
        self.generation_config = self.generation_config.updated(eos_token_id=eos or None)

    def _as_batch(self, inputs):
        # one conversation (a list of message dicts) is one input, not a batch of messages
        if isinstance(inputs, list) and inputs and isinstance(inputs[0], dict):
            return [inputs], True
        return super()._as_batch(inputs)

    def preprocess(self, inputs: list, **params) -> dict:
        """Render each conversation with the generation prompt; left-pad the ids."""
        texts = []
        for conversation in inputs:
            if isinstance(conversation, str):
                conversation = [{"role": "user", "content": conversation}]
            texts.append(self.template.render(conversation, add_generation_prompt=True))
        # as apply_chat_template: the template writes the special tokens itself
        return self.encode_prompts(texts, add_special_tokens=False)


def pipeline_num_layers(cfg) -> int | None:
    """The layer count of the trained model (for pipeline parallel inference)."""
    layers = try_get_key(cfg, "train.dist.pipeline_num_layers")
    layers = layers or try_get_key(cfg, "model.cfg.hidden_layers")
    path = try_get_key(cfg, "model.path")
    if layers is None and path is not None:
        layers = read_hf_config(str(path)).get("num_hidden_layers")
    return None if layers is None else int(layers)


def build_pipeline(
    output_dir,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    checkpoint: str | None = None,
    **kwargs,
):
    """The :class:`ChatPipeline` of a training output directory on ``tensor_parallel`` x
    ``pipeline_parallel`` processes: its ``config.yaml`` and ``checkpoint`` (default
    ``model_final``, else the one ``last_checkpoint`` names)."""
    config = os.path.join(output_dir, "config.yaml")
    if not os.path.isfile(config):
        raise FileNotFoundError(
            f"{config} does not exist: give the train.output_dir of a chat_sft training run."
        )
    if checkpoint is None:
        final = os.path.join(output_dir, "model_final")
        checkpoint = final if os.path.isdir(final) else str(output_dir)
    layers = pipeline_num_layers(LazyConfig.load(config)) if pipeline_parallel > 1 else None
    return ChatPipeline(
        config_file=config,
        model_path=str(checkpoint),
        mode="libai",
        data_parallel=None,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        pipeline_num_layers=layers,
        **kwargs,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Answer one prompt with a chat_sft model.")
    parser.add_argument(
        "output_dir", help="train.output_dir of the run (config.yaml + checkpoints)"
    )
    parser.add_argument("prompt", help="the user message")
    parser.add_argument("--system", default=None, help="a system message before it")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--pipeline-parallel", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--checkpoint", default=None, help="checkpoint dir (default: OUTPUT_DIR/model_final)"
    )
    args = parser.parse_args(argv)
    pipe = build_pipeline(
        args.output_dir,
        args.tensor_parallel,
        args.pipeline_parallel,
        checkpoint=args.checkpoint,
        device=args.device,
    )
    messages = [{"role": "user", "content": args.prompt}]
    if args.system is not None:
        messages.insert(0, {"role": "system", "content": args.system})
    result = pipe(
        messages,
        max_new_tokens=args.max_new_tokens,
        do_sample=args.do_sample,
        temperature=args.temperature,
        top_p=args.top_p,
    )
    if result is not None:  # global rank 0
        print(result[0]["generated_text"], flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main)

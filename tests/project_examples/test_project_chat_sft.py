"""projects/chat_sft: chat templates rendered and tokenized as transformers'
``apply_chat_template`` does, labels on exactly the assistant replies and their end-of-turn
token, a tiny Hugging Face Qwen2 fine-tuned through tools/train_net.py on 1 process and on
tp2, projects/chat_sft/chat.py answering with the trained model, and bad input."""

from __future__ import annotations

import json
import math
import pickle
import re
import shutil
import subprocess
import sys

import pytest
import torch
import transformers
from launch import free_port
from train_net_helpers import ROOT, read_metrics, run_train_net, train_env
from zoo_data import build_sft_files

from libai.data.datasets.lm_utils import IGNORE_INDEX
from libai.tokenizer import JsonTokenizer
from projects.chat_sft.chat_template import ChatTemplateError, load_chat_template
from projects.chat_sft.dataset import ChatSFTDataset
from projects.chat_sft.sample_data import build_sample, make_conversations, write_jsonl

CONFIG = ROOT / "projects" / "chat_sft" / "configs" / "qwen2_chat_sft.py"
CHAT = ROOT / "projects" / "chat_sft" / "chat.py"
SYSTEM = {"role": "system", "content": "Be terse. "}
Q1 = {"role": "user", "content": "What is 1 plus 2?"}
A1 = {"role": "assistant", "content": "  1 plus 2 is 3.  "}  # templates may trim it
Q2 = {"role": "user", "content": "And 3 minus 1?"}
A2 = {"role": "assistant", "content": "3 minus 1 is 2."}
CONVERSATIONS = {
    "single": [Q1, A1],
    "single+system": [SYSTEM, Q1, A1],
    "multi": [Q1, A1, Q2, A2],
    "multi+system": [SYSTEM, Q1, A1, Q2, A2],
}
# A template in the style of Hub templates: block tags on their own lines (trim_blocks /
# lstrip_blocks decide the whitespace), bos_token, namespace(), a default system prompt,
# raise_exception, `| trim`, and transformers' {% generation %} block around each reply.
TRIMMING_TEMPLATE = """{{ bos_token }}
{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}
    {% set turns = messages[1:] %}
{% else %}
    {% set system = 'You add numbers.' %}
    {% set turns = messages %}
{% endif %}
{% set ns = namespace(replies=0) %}
<|im_start|>system
{{ system | trim }}<|im_end|>
{% for message in turns %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('roles must alternate user/assistant') }}
    {% endif %}
<|im_start|>{{ message['role'] }}
    {% if message['role'] == 'assistant' %}
        {% set ns.replies = ns.replies + 1 %}
{% generation %}{{ message['content'] | trim }}<|im_end|>{% endgeneration %}

    {% else %}
{{ message['content'] | trim }}<|im_end|>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The project's sample data and ChatML tokenizer, the same tokenizer without a template
    and with TRIMMING_TEMPLATE (chat_template.jinja, bos token), and a tiny random Hugging
    Face Qwen2 directory holding the ChatML tokenizer."""
    root = tmp_path_factory.mktemp("chat_sft")
    paths = build_sample(root / "sample", train=128, valid=16)
    tok = paths["tokenizer"]
    config = json.loads((tok / "tokenizer_config.json").read_text())
    bare = root / "bare"
    shutil.copytree(tok, bare)
    (bare / "tokenizer_config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "chat_template"})
    )
    trimming = root / "trimming"
    shutil.copytree(bare, trimming)
    (trimming / "chat_template.jinja").write_text(TRIMMING_TEMPLATE)
    (trimming / "tokenizer_config.json").write_text(
        json.dumps(
            {
                **json.loads((bare / "tokenizer_config.json").read_text()),
                "bos_token": "<|endoftext|>",
            }
        )
    )
    hf_dir = root / "qwen2"
    torch.manual_seed(0)
    hf_config = transformers.Qwen2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=JsonTokenizer(tok).vocab_size,
        max_position_embeddings=128,
    )
    transformers.Qwen2ForCausalLM(hf_config).save_pretrained(hf_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / name, hf_dir / name)
    return {**paths, "bare": bare, "trimming": trimming, "hf": hf_dir, "root": root}


def conversation_file(tmp_path, conversations, name="chats.jsonl"):
    return write_jsonl(tmp_path / name, [{"messages": c} for c in conversations])


# ---- the template and the labels ---------------------------------------------------------------
@pytest.mark.parametrize("which", ["tokenizer", "bare", "trimming"])
def test_rendering_and_ids_equal_transformers_apply_chat_template(files, which):
    """The checkpoint's template (or, for "bare", the built-in ChatML against transformers
    given that same text) renders and tokenizes every conversation as apply_chat_template."""
    directory = files[which]
    ours = load_chat_template(JsonTokenizer(directory))
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    template = None if which != "bare" else ours.source
    if which == "bare":
        assert hf.chat_template is None and ours.name == "the built-in ChatML"
    tokenizer = JsonTokenizer(directory)
    for messages in CONVERSATIONS.values():
        for generation_prompt in (False, True):
            text = ours.render(messages, add_generation_prompt=generation_prompt)
            want = hf.apply_chat_template(
                messages,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=generation_prompt,
            )
            assert text == want
            ids = hf.apply_chat_template(
                messages, chat_template=template, add_generation_prompt=generation_prompt
            )["input_ids"]
            assert tokenizer.encode(text, add_special_tokens=False) == ids
    if which == "trimming":
        assert text.startswith("<|endoftext|>\n<|im_start|>system\nBe terse.<|im_end|>")


@pytest.mark.parametrize("which", ["tokenizer", "trimming"])
def test_labels_are_the_assistant_replies_and_their_end_of_turn(files, tmp_path, which):
    """Every assistant turn (and nothing else: no system / user turn, header, newline or
    padding) is learned, each reply followed by <|im_end|>; the mask equals transformers'
    assistant-token mask of the {% generation %} template."""
    tokenizer = JsonTokenizer(files[which])
    hf = transformers.AutoTokenizer.from_pretrained(files[which])
    conversations = list(CONVERSATIONS.values())
    dataset = ChatSFTDataset(conversation_file(tmp_path, conversations), tokenizer, 96)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for i, messages in enumerate(conversations):
        sample = dataset[i]
        ids, labels, mask = sample["input_ids"], sample["labels"], sample["attention_mask"]
        n = int(mask.sum())
        assert ids[:n].tolist() == hf.apply_chat_template(messages)["input_ids"]
        assert (ids[n:] == tokenizer.pad_token_id).all() and (labels[n:] == IGNORE_INDEX).all()
        learned = labels != IGNORE_INDEX
        assert torch.equal(labels[learned], ids[learned])
        # contiguous learned runs, one per assistant turn
        runs, run = [], []
        for j in range(n):
            if learned[j]:
                run.append(int(ids[j]))
            elif run:
                runs.append(run)
                run = []
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert len(runs) == len(replies)
        for run, reply in zip(runs, replies):
            assert run[-1] == end
            decoded = tokenizer.decode(run)
            assert decoded == (reply.strip() if which == "trimming" else reply) + "<|im_end|>"
        if which == "trimming":
            reference = hf.apply_chat_template(
                messages, return_dict=True, return_assistant_tokens_mask=True
            )["assistant_masks"]
            assert learned[:n].long().tolist() == reference


def test_truncation_keeps_the_learned_prefix(files, tmp_path):
    tokenizer = JsonTokenizer(files["tokenizer"])
    messages = CONVERSATIONS["multi+system"]
    path = conversation_file(tmp_path, [messages])
    dataset = ChatSFTDataset(path, tokenizer, 96)
    full = dataset[0]
    copy = pickle.loads(pickle.dumps(dataset))[0]  # as DataLoader workers may get it
    assert all(torch.equal(full[k], copy[k]) for k in full)
    n = int(full["attention_mask"].sum())
    short = ChatSFTDataset(path, tokenizer, n - 5)[0]
    assert short["input_ids"].shape == (n - 5,) and int(short["attention_mask"].sum()) == n - 5
    assert torch.equal(short["input_ids"], full["input_ids"][: n - 5])
    assert torch.equal(short["labels"], full["labels"][: n - 5])


# ---- training through tools/train_net.py, then chat.py -------------------------------------------
def train(files, out_dir, extra, nproc=1):
    overrides = [
        f"model.path={files['hf']}",
        f"dataloader.train.dataset.0.data_path={files['train']}",
        "dataloader.train.dataset.0.max_seq_length=80",
        "train.train_epoch=0",
        "train.train_micro_batch_size=8",
        "train.num_accumulation_steps=1",
        "train.log_period=1",
        "train.warmup_ratio=0",
        "optim.lr=3e-3",
        f"train.output_dir={out_dir}",
        *extra,
    ]
    proc = run_train_net(CONFIG, overrides, nproc=nproc, env=train_env())
    metrics = read_metrics(out_dir)
    losses = [metrics[i]["total_loss"] for i in sorted(metrics) if "total_loss" in metrics[i]]
    return losses, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def trained(files):
    """A run of the Hugging Face config on 1 process, long enough to answer."""
    out = files["root"] / "out1"
    losses, log = train(files, out, ["train.train_iter=120", "train.checkpointer.period=1000"])
    return out, losses, log


def test_fine_tunes_a_hugging_face_qwen2_on_one_process(trained, files):
    out, losses, log = trained
    assert len(losses) == 120 and all(math.isfinite(v) for v in losses)
    # the first loss is the checkpoint's (random Qwen2): about ln(vocab) on the replies
    vocab = JsonTokenizer(files["tokenizer"]).vocab_size
    assert abs(losses[0] - math.log(vocab)) < 0.5, (losses[0], math.log(vocab))
    assert sum(losses[-10:]) / 10 < 0.3 * losses[0], losses
    assert "the chat template of" in log and "LlamaForCausalLM" in log
    assert (out / "model_final").is_dir() and (out / "config.yaml").is_file()


# torch 2.10's gloo prints "[Gloo] Rank 0 is connected to 0 peer ranks. Expected number of
# connected peer ranks is : 0" on stdout, on every rank, in pieces: two ranks' notices can
# interleave piece by piece
GLOO_PIECES = (
    "[Gloo] Rank ",
    " is connected to ",
    " peer ranks. ",
    "Expected number of connected peer ranks is : ",
)


def chat(out, *args, nproc=1):
    """projects/chat_sft/chat.py as a user runs it (tools/infer.sh for several processes):
    its reply, the last line of its output (before it only gloo's notices, checked)."""
    script = [str(CHAT), str(out), "What is 2 plus 3?", "--max-new-tokens", "24", *args]
    cmd = [sys.executable, *script]
    if nproc > 1:
        cmd = ["bash", str(ROOT / "tools" / "infer.sh"), script[0], str(nproc), *script[1:]]
    env = {**train_env(), "PORT": str(free_port())}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *before, reply = proc.stdout.strip().splitlines() or [""]
    leftover = "".join(before)
    for piece in GLOO_PIECES:
        leftover = leftover.replace(piece, "")
    assert not re.sub(r"[\d\s]", "", leftover), proc.stdout  # nothing but gloo's notices
    return reply.strip()


def test_chat_answers_with_the_template_and_stops_at_end_of_turn(trained):
    """chat.py renders the question with the generation prompt; the fine-tuned model answers
    in the trained form and stops at <|im_end|> (well before max_new_tokens), with the same
    reply on two pipeline stages."""
    out, _, _ = trained
    reply = chat(out)
    assert re.fullmatch(r"2 plus 3 is \d+\.", reply), reply
    assert chat(out, "--pipeline-parallel", "2", nproc=2) == reply


def test_tp2_fine_tunes_from_the_same_first_loss(trained, files):
    _, reference, _ = trained
    losses, log = train(
        files,
        files["root"] / "tp2",
        [
            "train.train_iter=8",
            "train.dist.tensor_parallel_size=2",
            "train.checkpointer.period=1000",
        ],
        nproc=2,
    )
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses)
    assert abs(losses[0] - reference[0]) < 1e-4, (losses[0], reference[0])
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5, losses


# ---- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "record, message",
    [
        ({"conversation": []}, r"chats.jsonl:2: no 'messages' field .*\['conversation'\]"),
        ({"messages": []}, r"chats.jsonl:2: 'messages' must be a non-empty list"),
        (
            {"messages": [Q1, {"role": "bot", "content": "3"}]},
            r"chats.jsonl:2: message 1 has role 'bot'; the roles are \['system', 'user', 'assistant'\]",
        ),
        ({"messages": [SYSTEM, Q1]}, r"chats.jsonl:2: the conversation has no assistant message"),
        (
            {"messages": [Q1, {"role": "assistant"}]},
            r"message 1 \(assistant\) needs a string 'content'",
        ),
    ],
)
def test_bad_records_name_the_line_and_field(files, tmp_path, record, message):
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": [Q1, A1]}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=message):
        ChatSFTDataset(path, JsonTokenizer(files["tokenizer"]), 64)


def test_template_errors(files, tmp_path):
    good = conversation_file(tmp_path, make_conversations(2))
    # a template is required but the checkpoint has none
    with pytest.raises(
        ChatTemplateError,
        match="chat_template='checkpoint' but the tokenizer directory .*bare has no chat template",
    ):
        ChatSFTDataset(good, JsonTokenizer(files["bare"]), 64, chat_template="checkpoint")
    # the built-in ChatML needs its markers as single tokens (a tokenizer with </s> and <pad>)
    plain_dir, _, _ = build_sft_files(tmp_path)
    with pytest.raises(ChatTemplateError, match="needs '<\\|im_start\\|>' as one token"):
        ChatSFTDataset(good, JsonTokenizer(plain_dir), 64)
    # the template's own raise_exception, with the file and line of the conversation
    bad = conversation_file(tmp_path, [[Q1, A1], [Q1, Q2, A2]], name="bad.jsonl")
    dataset = ChatSFTDataset(bad, JsonTokenizer(files["trimming"]), 96)
    with pytest.raises(ChatTemplateError, match="bad.jsonl:2: .*roles must alternate"):
        dataset[1]
    # a header outside the generation prompt cannot be told from the reply
    headerless = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    plain_chat = conversation_file(tmp_path, [[Q1, A2]], name="plain.jsonl")
    with pytest.raises(ChatTemplateError, match="writes 'assistant: ' before assistant message 1"):
        ChatSFTDataset(plain_chat, JsonTokenizer(files["tokenizer"]), 64, chat_template=headerless)
    # a template that rewrites earlier turns once later ones follow
    last_only = "{{ messages[-1]['content'] }}"
    with pytest.raises(ChatTemplateError, match="is not incremental at message 1"):
        ChatSFTDataset(plain_chat, JsonTokenizer(files["tokenizer"]), 64, chat_template=last_only)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatSFTDataset(good, JsonTokenizer(files["tokenizer"]), 64, chat_template="{% for %}")
    with pytest.raises(FileNotFoundError, match="sample_data.py"):
        ChatSFTDataset(tmp_path / "missing.jsonl", JsonTokenizer(files["tokenizer"]), 64)

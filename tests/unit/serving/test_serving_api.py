"""The OpenAI-compatible server, through the official ``openai`` client, against
transformers on the same tiny Llama directory:

- completions and chat (the directory's chat template, tokenized as transformers does):
  greedy text and usage equal transformers' greedy generation; streamed chunks add up to
  the whole answer, with the role first, the finish reason last and the usage chunk;
- stop strings cut the text before the stop (finish_reason "stop"); n > 1 with a seed is
  reproducible; log-probabilities equal transformers' log-softmax;
- bad input is a 400 naming the field (404 for an unknown model), before any work;
- a client that disconnects mid-stream frees its blocks; 200 concurrent requests leave
  every block free; a failing request fails alone.
"""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import openai
import pytest
from server_helpers import Reference, ThreadServer, make_chat_llama_dir

from libai import dist


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    dist.reset_dist_util()
    model_dir = make_chat_llama_dir(tmp_path_factory.mktemp("serve"))
    server = ThreadServer(model_dir, max_num_seqs=8, block_size=4, max_num_batched_tokens=24)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    yield server, client, Reference(model_dir), model_dir
    server.close()
    dist.reset_dist_util()


PROMPT = "the quick brown fox"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]


def test_models_and_health(served):
    server, client, _, model_dir = served
    (model,) = client.models.list().data
    assert model.id == model_dir and model.owned_by == "libai"
    assert httpx.get(server.url + "/health").status_code == 200


def test_completion_equals_transformers(served):
    _, client, ref, model_dir = served
    out = client.completions.create(model=model_dir, prompt=PROMPT, max_tokens=8, temperature=0)
    ids = ref.tok(PROMPT)["input_ids"]
    want = ref.greedy(ids, 8)
    (choice,) = out.choices
    assert choice.text == ref.text(want)
    assert choice.finish_reason == ("stop" if want[-1] == ref.eos else "length")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), len(want))
    assert out.object == "text_completion"


def test_chat_uses_the_template_and_equals_transformers(served):
    _, client, ref, model_dir = served
    out = client.chat.completions.create(
        model=model_dir, messages=MESSAGES, max_completion_tokens=7, temperature=0
    )
    ids = ref.tok.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    want = ref.greedy(ids, 7)
    assert out.usage.prompt_tokens == len(ids)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text(want)


def test_streaming_adds_up_to_the_whole_answer(served):
    _, client, _, model_dir = served
    settings = dict(model=model_dir, messages=MESSAGES, max_tokens=9, temperature=0)
    whole = client.chat.completions.create(**settings)
    chunks = list(
        client.chat.completions.create(
            **settings, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == whole.choices[0].finish_reason and not any(finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model_dir, prompt=PROMPT, max_tokens=8, temperature=0, stream=True
        )
    )
    plain = client.completions.create(model=model_dir, prompt=PROMPT, max_tokens=8, temperature=0)
    assert streamed == plain.choices[0].text


def test_stop_strings_cut_before_the_stop(served):
    _, client, _, model_dir = served
    full = client.completions.create(model=model_dir, prompt=PROMPT, max_tokens=12, temperature=0)
    text = full.choices[0].text
    stop = text[3:5]
    assert stop and len(text) > 5
    out = client.completions.create(
        model=model_dir, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop]
    )
    assert out.choices[0].text == text[: text.index(stop)]
    assert out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=model_dir, prompt=PROMPT, max_tokens=12, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == out.choices[0].text


def test_n_choices_with_a_seed_are_reproducible(served):
    _, client, _, model_dir = served
    settings = dict(model=model_dir, prompt=PROMPT, max_tokens=8, temperature=1.0, n=3)
    first = client.completions.create(**settings, seed=11)
    again = client.completions.create(**settings, seed=11)
    other = client.completions.create(**settings, seed=12)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.text for c in again.choices]
    assert texts != [c.text for c in other.choices]
    assert len(set(texts)) > 1  # each choice its own draws
    assert (
        first.usage.completion_tokens
        == sum(len(c.logprobs.tokens) if c.logprobs else 0 for c in first.choices)
        or first.usage.completion_tokens >= 3
    )


def test_logprobs_equal_transformers(served):
    _, client, ref, model_dir = served
    out = client.completions.create(
        model=model_dir, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3
    )
    ids = ref.tok(PROMPT)["input_ids"]
    want = ref.greedy(ids, 6)
    logprobs = out.choices[0].logprobs
    assert logprobs.token_logprobs == pytest.approx(ref.logprobs(ids, want), abs=1e-4)
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        # greedy: the chosen is the best (tokens decoding to the same text share a key)
        assert 1 <= len(top) <= 3 and max(top.values()) <= chosen + 1e-6
    chat = client.chat.completions.create(
        model=model_dir, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": "nope", "prompt": PROMPT}, 404, "model"),
        ({"prompt": PROMPT, "temperature": 5}, 400, "temperature"),
        ({"prompt": PROMPT, "top_p": 0}, 400, "top_p"),
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": PROMPT, "max_tokens": 500}, 400, "max_tokens"),
        ({"prompt": "fox " * 80}, 400, "prompt"),
        ({"prompt": PROMPT, "best_of": 2}, 400, "best_of"),
        ({"prompt": PROMPT, "presence_penalty": 1.0}, 400, "presence_penalty"),
        ({"prompt": PROMPT, "n": 0}, 400, "n"),
        ({"prompt": PROMPT, "logprobs": 50}, 400, "logprobs"),
    ],
)
def test_bad_requests_get_openai_errors_naming_the_field(served, body, status, param):
    server, _, _, model_dir = served
    response = httpx.post(server.url + "/v1/completions", json={"model": model_dir, **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"], error
    assert error["type"] == "invalid_request_error"
    server.wait_idle()
    assert server.engine.allocator.num_free == server.engine.allocator.num_blocks


def test_openai_client_raises_the_typed_errors(served):
    _, client, _, model_dir = served
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=PROMPT)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=model_dir, messages=MESSAGES, top_logprobs=2)


def test_a_client_that_disconnects_frees_its_blocks(served):
    server, _, _, model_dir = served
    body = {"model": model_dir, "prompt": PROMPT, "max_tokens": 40, "stream": True,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["object"] == "text_completion"
    server.wait_idle()
    allocator = server.engine.allocator
    assert allocator.num_free == allocator.num_blocks


def test_200_concurrent_requests_leave_every_block_free(served):
    server, _, ref, model_dir = served
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    prompts = [" ".join(["fox", "the", "hello", "paris"][: 1 + i % 4]) for i in range(200)]
    peak = []

    async def one(i):
        return await client.completions.create(
            model=model_dir, prompt=prompts[i], max_tokens=3 + i % 5, temperature=0
        )

    async def watch():
        while True:
            running = list(server.engine.scheduler.running)
            peak.append(len(running))
            for seq in running:
                assert len(seq.block_table) <= math.ceil(len(seq.all_ids) / 4) + 1
            await asyncio.sleep(0.01)

    async def main():
        watcher = asyncio.create_task(watch())
        try:
            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            watcher.cancel()

    outs = asyncio.run(main())
    assert max(peak) > 1  # batched, not one by one
    for i in (0, 1, 2, 3, 57, 199):  # spot checks against transformers
        want = ref.greedy(ref.tok(prompts[i])["input_ids"], 3 + i % 5)
        assert outs[i].choices[0].text == ref.text(want), i
    server.wait_idle()
    assert server.engine.allocator.num_free == server.engine.allocator.num_blocks


def test_a_failing_request_fails_alone(served, monkeypatch):
    """One sequence's failure (a planted detokenizer error) is a 500 for its request; the
    request running beside it completes, and the server goes on."""
    server, client, ref, model_dir = served
    from libai.serving.text import TextTracker

    update = TextTracker.update

    def failing(self, output_ids):
        if "paris" in (self.stop or []):
            raise RuntimeError("planted failure")
        return update(self, output_ids)

    monkeypatch.setattr(TextTracker, "update", failing)
    other = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    async def both():
        bad = other.completions.create(model=model_dir, prompt=PROMPT, max_tokens=5, stop="paris")
        good = other.completions.create(model=model_dir, prompt=PROMPT, max_tokens=5, temperature=0)
        return await asyncio.gather(bad, good, return_exceptions=True)

    bad, good = asyncio.run(both())
    assert isinstance(bad, openai.InternalServerError) and "planted failure" in str(bad)
    assert good.choices[0].text == ref.text(ref.greedy(ref.tok(PROMPT)["input_ids"], 5))
    server.wait_idle()
    assert server.engine.allocator.num_free == server.engine.allocator.num_blocks
    assert client.completions.create(model=model_dir, prompt=PROMPT, max_tokens=2).choices


def test_a_lora_adapter_is_served_merged(tmp_path):
    """``--lora-adapter DIR`` (a PEFT directory made by ``peft``): the served greedy text
    is that of transformers + PEFT on the same base and adapter."""
    peft = pytest.importorskip("peft")
    import torch
    import transformers

    dist.reset_dist_util()
    model_dir = make_chat_llama_dir(tmp_path)
    ref = Reference(model_dir)
    adapted = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(model_dir),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    adapted.save_pretrained(tmp_path / "adapter")
    ref.model = adapted.eval()
    server = ThreadServer(model_dir, lora_adapter=tmp_path / "adapter")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        out = client.completions.create(model=model_dir, prompt=PROMPT, max_tokens=8, temperature=0)
        want = ref.greedy(ref.tok(PROMPT)["input_ids"], 8)
        assert out.choices[0].text == ref.text(want)
        base = Reference(model_dir)
        assert ref.text(want) != base.text(base.greedy(ref.tok(PROMPT)["input_ids"], 8))
    finally:
        server.close()
        dist.reset_dist_util()


def test_adapters_are_served_per_request(tmp_path):
    """``--lora-modules sql=DIR chat=DIR`` (adapters made by ``peft``): ``/v1/models`` lists
    them under the base; concurrent requests naming the base, ``sql`` and ``chat`` each get
    transformers + PEFT's greedy answer for their own adapter (completions and chat)."""
    pytest.importorskip("peft")
    from serving_models import make_peft_adapter, peft_model

    dist.reset_dist_util()
    model_dir = make_chat_llama_dir(tmp_path)
    sql = make_peft_adapter(
        model_dir, tmp_path / "sql", 1, r=4, target_modules=["q_proj", "v_proj"]
    )
    chat = make_peft_adapter(
        model_dir, tmp_path / "chat", 2, r=8, lora_alpha=16, target_modules=["o_proj", "up_proj"]
    )
    refs = {"base": Reference(model_dir), "sql": Reference(model_dir), "chat": Reference(model_dir)}
    refs["sql"].model, refs["chat"].model = peft_model(model_dir, sql), peft_model(model_dir, chat)
    names = {"base": model_dir, "sql": "sql", "chat": "chat"}
    server = ThreadServer(model_dir, block_size=4, lora_modules=[f"sql={sql}", f"chat={chat}"])
    try:
        cards = openai.OpenAI(base_url=server.url + "/v1", api_key="x").models.list().data
        assert [(m.id, getattr(m, "parent", None)) for m in cards] == [
            (model_dir, None), ("sql", model_dir), ("chat", model_dir)
        ]  # fmt: skip
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)

        async def ask(kind):
            done = client.completions.create(
                model=names[kind], prompt=PROMPT, max_tokens=8, temperature=0
            )
            talk = client.chat.completions.create(
                model=names[kind], messages=MESSAGES, max_tokens=6, temperature=0
            )
            return await asyncio.gather(done, talk)

        async def everyone():
            return await asyncio.gather(*(ask(kind) for kind in names))

        answers = dict(zip(names, asyncio.run(everyone())))
        texts = set()
        for kind, (done, talk) in answers.items():
            ref = refs[kind]
            assert done.choices[0].text == ref.text(ref.greedy(ref.tok(PROMPT)["input_ids"], 8))
            prompt = ref.tok.apply_chat_template(
                MESSAGES, add_generation_prompt=True, tokenize=False
            )
            want = ref.greedy(ref.tok(prompt, add_special_tokens=False)["input_ids"], 6)
            assert talk.choices[0].message.content == ref.text(want), kind
            assert done.model == names[kind]
            texts.add(done.choices[0].text)
        assert len(texts) == 3  # each adapter answers differently
        with pytest.raises(openai.NotFoundError, match="serves .*`sql`, `chat`"):
            openai.OpenAI(
                base_url=server.url + "/v1", api_key="x", max_retries=0
            ).completions.create(model="sqll", prompt=PROMPT, max_tokens=2)
        server.wait_idle()
        assert server.engine.allocator.num_free == server.engine.allocator.num_blocks
    finally:
        server.close()
        dist.reset_dist_util()

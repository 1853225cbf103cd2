"""A libai server on a tiny Llama (with a chat template) in a thread of the test process,
and the references the API tests compare it with."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import torch
import transformers
import uvicorn
from generation_helpers import make_llama_dir

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}"
)


def make_chat_llama_dir(root: Path) -> str:
    """``make_llama_dir`` plus a chat template (``chat_template.jinja``, as transformers 5
    saves it)."""
    path = make_llama_dir(root)
    (Path(path) / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """``libai.serving.cli.serve``'s app on 127.0.0.1 in a thread (one process, tp1)."""

    def __init__(self, model_dir: str, **flags):
        from libai.serving import cli
        from libai.serving.api import build_app
        from libai.serving.async_engine import AsyncEngine
        from libai.serving.engine import LLMEngine

        self.port = free_port()
        argv = ["--model", model_dir, "--port", str(self.port), "--device", "cpu"]
        for key, value in flags.items():
            values = value if isinstance(value, list) else [value]
            argv += [f"--{key.replace('_', '-')}", *map(str, values)]
        args = cli.parse_args(argv)
        pipeline, model = cli.load(args)
        executor, config, eos = cli.build_engine(args, pipeline, model)
        self.engine = LLMEngine(executor, pipeline.tokenizer, config, eos)
        self.async_engine = AsyncEngine(self.engine)
        app = build_app(self.async_engine, cli.served_model(args, pipeline, config))
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Until the engine holds no sequence (cancellations are applied asynchronously)."""
        deadline = time.time() + timeout
        while self.engine.has_work() or self.async_engine._streams:
            assert time.time() < deadline, "the engine did not go idle"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class Reference:
    """transformers on the same directory: tokenizer, greedy tokens, log-probabilities."""

    def __init__(self, model_dir: str):
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.eos = self.model.config.eos_token_id

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """transformers' greedy tokens after ``ids`` (stopping at eos, which is kept)."""
        x = torch.tensor([ids])
        out = self.model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=self.eos,
            eos_token_id=self.eos,
        )
        new = out[0, len(ids) :].tolist()
        return new[: new.index(self.eos) + 1] if self.eos in new else new

    def logprobs(self, ids: list[int], new: list[int]) -> list[float]:
        with torch.no_grad():
            logits = self.model(torch.tensor([ids + new])).logits[0].float()
        logp = logits.log_softmax(-1)[len(ids) - 1 : len(ids) - 1 + len(new)]
        return logp.gather(1, torch.tensor(new)[:, None])[:, 0].tolist()

    def text(self, new: list[int]) -> str:
        return self.tok.decode(new, skip_special_tokens=True)

"""``libai-serve`` (also ``python tools/serve.py``): one command that serves a model over
HTTP with the OpenAI API.

    libai-serve --model PATH [--tensor-parallel-size N] [--pipeline-parallel-size N]
                [--host 127.0.0.1] [--port 8000] [--max-num-seqs 64] [--max-model-len L]
                [--block-size 16] [--num-blocks B] [--max-num-batched-tokens T]
                [--dtype auto|float32|bfloat16|float16] [--device cpu|cuda]
                [--lora-adapter ADAPTER_DIR] [--lora-modules NAME=ADAPTER_DIR ...]

``PATH`` is a Hugging Face directory (``config.json`` + weights + tokenizer) or a libai
training output directory (``config.yaml`` + its checkpoints). With more than one rank the
command starts its own worker processes (the user runs no launcher): rank 0 holds the HTTP
front and the scheduler, every rank loads its shard and steps the same batches.

``--lora-adapter`` merges one PEFT adapter into the weights. ``--lora-modules`` (vLLM's flag)
serves PEFT adapters beside the base, one per request: a request whose ``model`` is an
adapter's name runs through that adapter, in the same batches as the others.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time

logger = logging.getLogger("libai.serving")

DTYPES = ("auto", "float32", "bfloat16", "float16")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="libai-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face dir or a libai output dir")
    p.add_argument("--served-model-name", default=None, help="the model id clients send")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: 512")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None, help="default: every sequence full")
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument(
        "--lora-adapter", default=None, help="a PEFT adapter directory, merged into the model"
    )
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=ADAPTER_DIR",
        help="PEFT adapters served beside the base, chosen by a request's model name "
        '(also vLLM\'s JSON form \'{"name": ..., "path": ...}\')',
    )
    p.add_argument(
        "--enable-lora", action="store_true", help="accepted for vLLM's commands (implied)"
    )
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda if any")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs", "block_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not os.path.isdir(args.model):
        p.error(f"--model {args.model}: no such directory")
    has_hf = os.path.isfile(os.path.join(args.model, "config.json"))
    if not has_hf and not os.path.isfile(os.path.join(args.model, "config.yaml")):
        p.error(
            f"--model {args.model}: neither a Hugging Face directory (config.json) nor a libai "
            "output directory (config.yaml)"
        )
    args.lora_modules = _lora_modules(p, args)
    return args


def _lora_modules(p: argparse.ArgumentParser, args) -> dict[str, str]:
    """``--lora-modules`` as ``{name: directory}``, each checked (exits naming the entry)."""
    out: dict[str, str] = {}
    for entry in args.lora_modules:
        if entry.lstrip().startswith("{"):
            try:
                spec = json.loads(entry)
                name, path = spec["name"], spec["path"]
            except (ValueError, KeyError, TypeError):
                p.error(f'--lora-modules {entry!r}: JSON needs "name" and "path"')
        else:
            name, sep, path = entry.partition("=")
            if not sep or not name or not path:
                p.error(f"--lora-modules {entry!r}: expected NAME=ADAPTER_DIR")
        if name in out or name in (args.model, args.served_model_name):
            p.error(f"--lora-modules: the name {name!r} is already taken")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            p.error(
                f"--lora-modules {name}={path}: not a PEFT adapter directory (no adapter_config.json)"
            )
        out[name] = path
    return out


def load(args):
    """This rank's ``(pipeline, model)``: the model on its layout, in ``--dtype``."""
    import torch

    from libai.inference.text_generation import TextGenerationPipeline

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    hf = os.path.isfile(os.path.join(args.model, "config.json"))
    pipeline = TextGenerationPipeline(
        config_file=None if hf else os.path.join(args.model, "config.yaml"),
        model_path=args.model,
        mode="huggingface" if hf else "libai",
        tensor_parallel=args.tensor_parallel_size,
        pipeline_parallel=args.pipeline_parallel_size,
        device=device,
        lora_adapter=args.lora_adapter,
    )
    if args.lora_modules:  # beside the base, one per request
        from libai.models.lora_adapters import load_peft_adapters

        load_peft_adapters(pipeline.model, args.lora_modules)
    dtype = args.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    model = pipeline.model.to(getattr(torch, dtype))
    return pipeline, model


def build_engine(args, pipeline, model):
    """The executor (every rank) and, on rank 0, the engine over it."""
    from libai.layers.paged_kv_cache import PagedKVCache
    from libai.serving.engine import EngineConfig
    from libai.serving.executor import ModelExecutor

    limit = pipeline.stepper.max_positions
    max_model_len = args.max_model_len or limit or 2048
    if limit is not None and max_model_len > limit:
        raise SystemExit(
            f"--max-model-len {max_model_len} exceeds the model's {limit} positions; "
            f"use --max-model-len {limit} or less"
        )
    config = EngineConfig(
        max_model_len=max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens or max(512, args.max_num_seqs),
        block_size=args.block_size,
        num_blocks=args.num_blocks,
    )
    cache = PagedKVCache(config.blocks(), config.block_size)
    executor = ModelExecutor(model, cache, pipeline.device, pipeline.pipe)
    eos = pipeline.generation_config.eos_token_ids
    return executor, config, eos


def served_model(args, pipeline, config):
    """What the HTTP front serves: the model's name, tokenizer, chat template, adapters."""
    from libai.serving.api import ServedModel
    from libai.serving.chat import load_chat_template

    return ServedModel(
        name=args.served_model_name or args.model,
        tokenizer=pipeline.tokenizer,
        max_model_len=config.max_model_len,
        chat_template=load_chat_template(args.model),
        adapters=dict(args.lora_modules),
    )


def serve(args, rank: int = 0) -> None:
    """Load, then rank 0 serves HTTP until SIGTERM / Ctrl-C; other ranks step with it."""
    try:
        pipeline, model = load(args)
        executor, config, eos = build_engine(args, pipeline, model)
    except Exception as error:
        _agree_loaded(error)
        raise
    _agree_loaded(None)
    if rank != 0:
        executor.serve()
        return
    import uvicorn

    from libai.serving.api import build_app
    from libai.serving.async_engine import AsyncEngine
    from libai.serving.engine import LLMEngine

    engine = AsyncEngine(LLMEngine(executor, pipeline.tokenizer, config, eos))
    served = served_model(args, pipeline, config)
    app = build_app(engine, served, on_shutdown=executor.stop_workers)
    logger.info(
        "serving %s%s on http://%s:%d (tp %d, pp %d, %d blocks of %d)",
        served.name,
        f" and adapters {', '.join(served.adapters)}" if served.adapters else "",
        args.host,
        args.port,
        args.tensor_parallel_size,
        args.pipeline_parallel_size,
        config.blocks(),
        config.block_size,
    )
    # uvicorn shuts down gracefully on SIGTERM / SIGINT (in-flight requests finish, then the
    # engine cancels what is left) and re-raises the signal after: handled here, so the
    # command exits 0 once its workers have stopped
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=30,
    )


def _agree_loaded(error: BaseException | None) -> None:
    """Every rank learns whether every rank loaded (a stage may fail where the others did
    not), so none serves or waits for a peer that is gone; a rank that failed re-raises its
    own error, the others stop naming it."""
    import torch.distributed as torch_dist

    if not torch_dist.is_initialized() or torch_dist.get_world_size() == 1:
        return
    errors = [None] * torch_dist.get_world_size()
    mine = None if error is None else f"{type(error).__name__}: {error}"
    torch_dist.all_gather_object(errors, mine)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed and error is None:
        rank, message = failed[0]
        raise SystemExit(f"rank {rank} failed to load the model: {message}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, argv) -> None:
    if rank != 0:  # Ctrl-C reaches the whole process group: rank 0 stops the workers
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    serve(parse_args(argv), rank)


def _watch(workers, stop: threading.Event) -> None:
    """A worker that dies takes the server down at once (rank 0 would wait for it in the
    next collective)."""
    while not stop.wait(1.0):
        for w in workers:
            if w.exitcode not in (None, 0):
                logger.error("worker %s exited with %s: stopping the server", w.name, w.exitcode)
                for other in workers:
                    other.kill()
                os._exit(1)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    if world == 1:
        serve(args)
        return
    port = _free_port()
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_worker, args=(rank, world, port, argv), name=f"rank{rank}")
        for rank in range(1, world)
    ]
    for w in workers:
        w.start()
    stop = threading.Event()
    threading.Thread(target=_watch, args=(workers, stop), daemon=True).start()
    try:
        _worker(0, world, port, argv)
    finally:
        stop.set()
        deadline = time.time() + 30
        for w in workers:
            w.join(max(0.0, deadline - time.time()))
            if w.is_alive():
                w.kill()


if __name__ == "__main__":
    main()

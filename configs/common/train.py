"""Training defaults (LiBai's ``train`` namespace). Override from the command line, e.g.
``train.train_iter=1000 train.dist.tensor_parallel_size=2``."""

from libai.config import LazyCall
from libai.scheduler import WarmupCosineLR

# fmt: off
train = dict(
    # Directory where checkpoints, logs, config.yaml and metrics.json are written
    output_dir="./output",

    # Iterations to train; train_epoch > 0 raises it to cover that many epochs
    train_iter=10000,
    train_epoch=0,

    # Samples per micro batch on each data-parallel rank. global = micro x dp x accumulation;
    # None = derived from the other two (a contradiction is an error)
    train_micro_batch_size=32,
    global_batch_size=None,
    num_accumulation_steps=None,
    # Samples per batch on each data-parallel rank for evaluation
    test_micro_batch_size=32,

    # Print / write metrics every this many iterations
    log_period=20,
    # Same seed -> same run; offset per data-parallel rank for dropout
    seed=1234,

    # Fraction of train_iter used for LR warmup: warmup_iter = ceil(train_iter * warmup_ratio)
    warmup_ratio=0,

    # Progress counters; normally set by the trainer (and restored on resume)
    start_iter=0,
    consumed_train_samples=0,
    consumed_valid_samples=0,
    # Samples to train on; None = train_iter * global_batch_size
    train_samples=None,

    # Path of weights to load into the model before training / evaluation ("" = none)
    load_weight="",
    # Resume from the last checkpoint in output_dir (also `--resume` on the command line)
    resume=False,

    # Automatic mixed precision: torch.autocast with dtype "bf16", or "fp16" with a dynamic
    # loss scaler starting at init_scale (ours: dtype, init_scale)
    # level "O1": autocast, fp32 parameters; "O2" (ours, FleetX's / Megatron's): parameters
    # and gradients in dtype, fp32 master weights in the optimizer
    # fp8 (ours, torchao's recipes): "rowwise" or "tensorwise" runs the large Linear layers'
    # matmuls in float8 (pip install 'libai[fp8]'); fp8_min_size=False converts small ones too
    amp=dict(
        enabled=False, dtype="bf16", init_scale=65536.0, level="O1", fp8=None, fp8_min_size=True
    ),
    # Recompute each TransformerLayer in backward instead of storing its activations;
    # mode "full", or "selective": keep matmul / attention outputs, recompute the rest (ours);
    # "full_attn" / "core_attn" (FleetX's): only the attention sub-layer / attention core.
    # no_recompute_layers: layer indices that keep their activations (FleetX's)
    activation_checkpoint=dict(enabled=False, mode="full", no_recompute_layers=[]),
    # ZeRO: stage 1 shards optimizer states, 2 also gradients, 3 also parameters (FSDP2,
    # any dp x tp x pp layout); hsdp_replicate_size > 1 (stage 3, ours): HSDP, parameters
    # sharded within dp / hsdp_replicate_size ranks and replicated across the groups
    zero_optimization=dict(enabled=False, stage=1, hsdp_replicate_size=1),

    # LoRA (PEFT's field names): adapters on the layers target_modules names (PEFT's names,
    # e.g. ["q_proj", "v_proj"], or libai's: "query_key_value", "dense", ...), every other
    # weight frozen but modules_to_save; off while target_modules is empty
    lora=dict(
        target_modules=[], r=8, lora_alpha=8.0, lora_dropout=0.0, use_rslora=False,
        modules_to_save=[],
    ),

    # Save a checkpoint every `period` iterations, keep the last `max_to_keep`
    checkpointer=dict(period=5000, max_to_keep=100),

    evaluation=dict(
        enabled=True,
        # referenced by path so that this file does not import libai.evaluation
        evaluator=LazyCall("libai.evaluation.PPLEvaluator")(),
        eval_period=5000,
        # batches per evaluation
        eval_iter=100000,
        # metric (and whether lower or higher is better) for the best checkpoint
        eval_metric="PPL",
        eval_mode="min",
    ),

    # LR schedule; the trainer fills max_iter and warmup_iter (see libai/scheduler)
    scheduler=LazyCall(WarmupCosineLR)(
        warmup_factor=0.001,
        alpha=0.01,
        warmup_method="linear",
    ),

    # Parallel layout; the keys of libai.dist.DIST_CONFIG_KEYS
    dist=dict(
        # None = world_size / (tensor x pipeline x context parallel sizes)
        data_parallel_size=None,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        # the model's layer count; required when pipeline_parallel_size > 1
        pipeline_num_layers=None,
        # one stage id per layer, e.g. [0, 0, 0, 1] to balance stages by hand
        custom_pipeline_stage_id=None,
        # "cpu" (gloo) or "cuda" (nccl)
        device_type="cpu",
        # ours: model chunks per pipeline rank (> 1 for interleaved schedules)
        virtual_pipeline_size=1,
        # ours: "1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"
        pipeline_schedule="1F1B",
        # ours: Megatron-style sequence parallel (norms / dropout / residuals split along the
        # sequence over the tp group; needs tensor_parallel_size > 1; GPT-2 and Llama/Qwen2)
        sequence_parallel=False,
        # ours (Megatron's name): each sequence split over this many ranks (head-tail chunks),
        # attention across them; composes with data and tensor parallel (GPT-2, Llama/Qwen2)
        context_parallel_size=1,
        # ours (Megatron's expert_model_parallel_size): Mixture-of-Experts experts sharded
        # over this many of the data x context ranks; 1 until a model has MoE layers
        expert_parallel_size=1,
    ),
)
# fmt: on

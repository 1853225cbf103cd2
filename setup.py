"""Install libai: ``pip install -e .`` (add ``[test]`` for the test suite)."""

from setuptools import find_packages, setup

setup(
    name="libai",
    version="0.1.0",
    description="LiBai-style large Transformer training and serving on PyTorch DTensor",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["libai", "libai.*"]),
    # configs/ ships inside the package through the libai/config/configs symlink, so that
    # libai.config.get_config("common/train.py") works from a wheel as from a checkout
    package_data={"libai.config": ["configs/*.py", "configs/**/*.py", "configs/**/*.yaml"]},
    install_requires=[
        "torch>=2.10",  # the oldest release the suite passed on (README, "Supported PyTorch")
        "numpy",
        "omegaconf>=2.3",
        "cloudpickle",  # LazyConfig.save: configs YAML cannot hold (LiBai, detectron2)
        "hydra-core>=1.3",
        "black",  # LazyConfig.to_py formats its text with black, as LiBai does
        "safetensors",
        "xxhash",  # checkpoint manifests: a checksum of every file, verified before loading
        "tokenizers",
        "sentencepiece",
        "tqdm",
        "tensorboard",
        "matplotlib",
        "pillow",  # image datasets (ViT)
        "onnx",  # tools/export_onnx.py
        "onnxruntime",  # verifies exported graphs; the onnxruntime generator
        "onnxscript",  # torch.onnx's dynamo exporter
    ],
    extras_require={
        # libai.accelerate (libai-accelerate): unmodified Hugging Face models on local data
        "accelerate": ["transformers", "datasets"],
        # libai-serve: the OpenAI-compatible server (libai/serving)
        "serve": ["fastapi>=0.110", "uvicorn>=0.29", "jinja2>=3.1"],
        # LiBai's own projects (QQP, text_classification, SimCSE) through libai.oneflow_api:
        # their tokenizers', datasets' and evaluator's imports
        "libai-projects": ["six", "filelock", "jieba", "jsonlines", "scipy"],
        # train.amp.fp8: torchao's float8 training (libai/layers/float8.py)
        "fp8": ["torchao>=0.14"],
        # transformers: the reference models of the parity tests and the benchmarks' baseline;
        # jinja2: chat templates (projects/chat_sft); import-linter: the import rule
        "test": [
            "pytest>=7",
            "ruff",
            "transformers",
            "datasets",
            "jinja2>=3.1",
            "import-linter",
            "torchao>=0.14",  # the fp8 tests (emulated float8 on the CPU)
            "mutmut==3.8.1",  # tools/mutation.sh (docs/testing.md, "Mutation testing")
            "jieba",  # BertTokenizer(do_chinese_wwm=True): LiBai's Chinese whole-word masking
            # the server's tests: its dependencies, and the official client that talks to it
            "fastapi>=0.110",
            "uvicorn>=0.29",
            "openai>=1.0",
            "httpx",
            "peft",  # the LoRA tests' reference: PEFT adapters in and out
            "six",  # LiBai's QQP project (its BERT tokenizer), run by the door tests
            "filelock",  # LiBai's text_classification project (its dataset cache lock)
            "jsonlines",  # LiBai's SimCSE project (its SNLI reader)
            "scipy",  # LiBai's SimCSE project (its evaluator's Spearman correlation)
        ],
    },
    entry_points={
        "console_scripts": [
            "libai-accelerate=libai.accelerate.cli:console_main",
            "libai-serve=libai.serving.cli:main",
        ]
    },
)

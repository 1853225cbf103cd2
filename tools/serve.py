"""Serve a model with the OpenAI API: ``python tools/serve.py --model PATH ...`` (the same
as ``libai-serve``; see libai/serving/cli.py)."""

from libai.serving.cli import main

if __name__ == "__main__":
    main()

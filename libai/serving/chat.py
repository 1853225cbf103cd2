"""Chat templates: the model directory's Jinja template, rendered in a sandbox.

Hugging Face keeps a model's template in ``chat_template.jinja`` or under ``chat_template``
in ``tokenizer_config.json`` (a string, or named templates of which ``default`` is used);
it is rendered with the messages, ``add_generation_prompt`` and the tokenizer's special
tokens, in Jinja's immutable sandbox (a template is data from the model directory: it
cannot reach Python objects).
"""

from __future__ import annotations

import json
import os
from datetime import datetime

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def load_chat_template(model_dir: str) -> str | None:
    """The chat template of ``model_dir``, or None when it has none."""
    path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    config = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(config):
        return None
    with open(config, encoding="utf-8") as f:
        template = json.load(f).get("chat_template")
    if isinstance(template, list):  # named templates
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _raise(message: str):
    raise TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render_chat(template: str, messages: list[dict], **special_tokens) -> str:
    """The prompt text of ``messages`` (``{"role", "content"}`` dicts) ending with the
    assistant's turn opened (``add_generation_prompt``); ``special_tokens``: ``bos_token``,
    ``eos_token``, ... as the template expects them. A template error raises ``ValueError``."""
    try:
        compiled = _environment().from_string(template)
        return compiled.render(messages=messages, add_generation_prompt=True, **special_tokens)
    except TemplateError as error:
        raise ValueError(f"the chat template failed on these messages: {error}") from error

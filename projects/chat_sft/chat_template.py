"""Chat templates: the Jinja template of a checkpoint, rendered as ``transformers`` renders it.

A chat model's tokenizer directory carries the template that turns a list of messages into
its prompt text: ``chat_template.jinja`` (what ``transformers`` 5 writes) or the
``chat_template`` entry of ``tokenizer_config.json`` (a string, or a list of named templates
of which ``default`` is used). :class:`ChatTemplate` renders it in the same sandboxed Jinja
environment as ``tokenizer.apply_chat_template(..., tokenize=False)``: ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that does not escape
HTML, the ``raise_exception`` / ``strftime_now`` globals, the ``{% generation %}`` block, and
the tokenizer's special tokens (``bos_token``, ``eos_token``, ...) as variables.

:meth:`ChatTemplate.render_with_spans` also returns, per assistant message, the characters a
model must learn to produce: everything the template writes after the generation prompt
(``add_generation_prompt=True``) up to and including the end-of-turn marker (e.g. ChatML's
``<|im_end|>``), so that a fine-tuned model learns both the reply and when to stop.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache

from libai.tokenizer.tokenization_base import SPECIAL_TOKEN_ROLES

# under "libai" so that the trainer's log handlers (console, log.txt) show these lines
logger = logging.getLogger("libai.projects.chat_sft")

#: the built-in template (ChatML, the format of Qwen2's chat models), used when a checkpoint
#: has no template of its own; it needs ``<|im_start|>`` and ``<|im_end|>`` as single tokens
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('ChatML has no role ' ~ message['role']) }}"
    "{% endif %}"
    "{{ '<|im_start|>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
#: the template file ``transformers`` 5 saves next to ``tokenizer_config.json``
TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"


class ChatTemplateError(ValueError):
    """A template that cannot be found, compiled, rendered or split into turns."""


def _jinja():
    try:
        import jinja2  # noqa: F401
    except ImportError as e:  # pragma: no cover - jinja2 is installed with the test extra
        raise ImportError(
            "chat templates need jinja2 (as transformers' apply_chat_template does): "
            "pip install 'jinja2>=3.1'"
        ) from e
    return jinja2


@lru_cache(maxsize=16)
def compile_template(source: str):
    """The compiled Jinja template of ``source`` in transformers' chat environment."""
    jinja2 = _jinja()
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses the
        block to find assistant tokens; here the spans come from prefix renders instead)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e} (line {e.lineno})") from e


def read_checkpoint_template(directory) -> str | None:
    """The chat template of a tokenizer directory, or ``None`` if it has none.

    ``chat_template.jinja`` wins over ``tokenizer_config.json``'s ``chat_template`` (as in
    ``transformers``); a list / dict of named templates gives its ``default`` one.
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, TEMPLATE_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ChatTemplateError(f"cannot read the tokenizer config {path}: {e}") from e
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
    if isinstance(template, dict):
        if "default" not in template:
            raise ChatTemplateError(
                f"{path} has named chat templates {sorted(map(str, template))} but no 'default' "
                "one; set chat_template to the one to use (its text or a .jinja file)."
            )
        template = template["default"]
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"{path}: chat_template holds {type(template).__name__}.")
    return template


def tokenizer_directory(tokenizer) -> str | None:
    """The directory of a tokenizer loaded from files (``JsonTokenizer``'s ``tokenizer_file``)."""
    path = getattr(tokenizer, "tokenizer_file", None)
    return None if path is None else os.path.dirname(os.path.abspath(os.fspath(path)))


def special_token_variables(tokenizer) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... of ``tokenizer`` (the roles it has), as
    ``apply_chat_template`` hands them to the template."""
    tokens = {role: getattr(tokenizer, role, None) for role in SPECIAL_TOKEN_ROLES}
    return {role: str(token) for role, token in tokens.items() if token is not None}


class ChatTemplate:
    """A compiled chat template with the variables it is rendered with.

    Args:
        source: the Jinja text of the template.
        variables: extra template variables, normally the tokenizer's special tokens
            (:func:`special_token_variables`).
        end_of_turn: the text that ends an assistant turn and is learned with it; ``None``
            takes whatever the template writes after the reply, trailing whitespace removed
            (ChatML: ``<|im_end|>``, Llama 3: ``<|eot_id|>``).
        name: where the template came from, for messages.
    """

    def __init__(
        self,
        source: str,
        variables: Mapping[str, str] | None = None,
        end_of_turn: str | None = None,
        name: str = "chat template",
    ):
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError(f"{name} is empty; give the Jinja text of a chat template.")
        if end_of_turn is not None and not end_of_turn:
            raise ChatTemplateError("end_of_turn must be None (auto) or a non-empty string.")
        self.source = source
        self.variables = dict(variables or {})
        self.end_of_turn = end_of_turn
        self.name = name
        self._template = compile_template(source)
        self._warned_no_marker = False

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name})"

    # DataLoader workers may receive the dataset pickled: recompile there
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_template"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._template = compile_template(self.source)

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = False) -> str:
        """The prompt text of ``messages``, equal to ``tokenizer.apply_chat_template(messages,
        tokenize=False, add_generation_prompt=...)``."""
        jinja2 = _jinja()
        # apply_chat_template drops keys whose value is None
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return self._template.render(
                messages=chat,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.variables,
            )
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"{self.name} failed to render the conversation: {e}") from e

    def render_with_spans(self, messages: Sequence[Mapping]) -> tuple[str, list[tuple[int, int]]]:
        """``(text, spans)``: the rendered conversation and, per assistant message, the
        ``[start, end)`` characters of ``text`` a model learns: from the end of the
        generation prompt to the end of the end-of-turn marker.

        Raises:
            ChatTemplateError: the template renders earlier turns differently once later
                ones follow, does not write an assistant reply verbatim, writes a header
                that its generation prompt lacks, or lacks ``end_of_turn``.
        """
        text = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = self.render(messages[:i], add_generation_prompt=True)
            turn = self.render(messages[: i + 1])
            if not (turn.startswith(prompt) and text.startswith(turn)):
                raise ChatTemplateError(
                    f"{self.name} is not incremental at message {i}: the text of the "
                    "conversation up to it (plus the generation prompt) is not a prefix of the "
                    "whole conversation's text, so the reply's tokens cannot be located."
                )
            spans.append((len(prompt), self._turn_end(turn, len(prompt), message, i)))
        return text, spans

    def _turn_end(self, turn: str, start: int, message: Mapping, index: int) -> int:
        reply = message["content"].strip()
        at = turn.find(reply, start)
        if at < 0:
            raise ChatTemplateError(
                f"{self.name} does not write assistant message {index}'s content verbatim "
                "after its generation prompt, so its tokens cannot be located."
            )
        if turn[start:at].strip():
            raise ChatTemplateError(
                f"{self.name} writes {turn[start:at]!r} before assistant message {index}'s "
                "content, which its generation prompt (add_generation_prompt=True) does not "
                "write: a template for chat fine-tuning must put the assistant header in the "
                "generation prompt."
            )
        after = at + len(reply)
        tail = turn[after:]
        if self.end_of_turn is not None:
            k = tail.find(self.end_of_turn)
            if k < 0:
                raise ChatTemplateError(
                    f"end_of_turn={self.end_of_turn!r} does not follow assistant message "
                    f"{index} in the text of {self.name} (it writes {tail!r} there)."
                )
            return after + k + len(self.end_of_turn)
        marker = tail.rstrip()
        if not marker and not self._warned_no_marker:
            self._warned_no_marker = True
            logger.warning(
                "%s writes no end-of-turn marker after an assistant reply: the model will not "
                "learn where a reply stops. Set end_of_turn (e.g. the eos token).",
                self.name,
            )
        return after + len(marker)

    def end_of_turn_text(self, messages: Sequence[Mapping] | None = None) -> str:
        """The end-of-turn marker learned after the first assistant reply of ``messages``
        (default: a one-question probe); "" if the template writes none."""
        if messages is None:
            messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
        text, spans = self.render_with_spans(messages)
        reply = next(m for m in messages if m["role"] == "assistant")["content"].strip()
        learned = text[spans[0][0] : spans[0][1]]
        return learned[learned.find(reply) + len(reply) :]


def load_chat_template(
    tokenizer, chat_template: str | None = None, end_of_turn: str | None = None
) -> ChatTemplate:
    """The :class:`ChatTemplate` of a dataset / chat config.

    Args:
        tokenizer: the libai tokenizer; its special tokens become template variables and
            its directory (``tokenizer_file``'s) is the checkpoint whose template is read.
        chat_template: ``None``: the checkpoint's template, else the built-in ChatML;
            ``"checkpoint"``: the checkpoint's template, an error if it has none;
            ``"chatml"``: the built-in ChatML; a path to a ``.jinja`` file; or the Jinja
            text itself.
        end_of_turn: see :class:`ChatTemplate`.

    Raises:
        ChatTemplateError: no template where one is required, a template that does not
            compile, or ChatML with a vocabulary lacking ``<|im_start|>`` / ``<|im_end|>``.
    """
    variables = special_token_variables(tokenizer)
    directory = tokenizer_directory(tokenizer)
    if chat_template in (None, "checkpoint"):
        found = None if directory is None else read_checkpoint_template(directory)
        if found is not None:
            where = f"the chat template of {directory}"
            return ChatTemplate(found, variables, end_of_turn, name=where)
        if chat_template == "checkpoint":
            raise ChatTemplateError(
                f"chat_template='checkpoint' but the tokenizer directory {directory} has no chat "
                f"template (no {TEMPLATE_FILE}, no 'chat_template' in {CONFIG_FILE}). Use a chat "
                "checkpoint, or set chat_template to 'chatml', a .jinja file or the template text."
            )
        logger.info("%s has no chat template: using the built-in ChatML template", directory)
        chat_template = "chatml"
    if chat_template == "chatml":
        _check_chatml_tokens(tokenizer)
        return ChatTemplate(CHATML_TEMPLATE, variables, end_of_turn, name="the built-in ChatML")
    if not isinstance(chat_template, str):
        raise ChatTemplateError(
            f"chat_template must be None, 'checkpoint', 'chatml', a .jinja path or Jinja text; "
            f"got {type(chat_template).__name__}."
        )
    if os.path.isfile(chat_template):
        with open(chat_template, encoding="utf-8") as f:
            return ChatTemplate(f.read(), variables, end_of_turn, name=chat_template)
    if "{{" in chat_template or "{%" in chat_template:
        return ChatTemplate(chat_template, variables, end_of_turn, name="the given chat_template")
    raise ChatTemplateError(
        f"chat_template={chat_template!r} is not 'checkpoint', 'chatml', an existing file, or "
        "Jinja text (no '{{' or '{%' in it)."
    )


def _check_chatml_tokens(tokenizer) -> None:
    """ChatML's markers must each encode to one token, or the model cannot see turns."""
    for token in CHATML_TOKENS:
        if len(tokenizer.encode(token)) != 1:
            raise ChatTemplateError(
                f"the built-in ChatML template needs {token!r} as one token, but the tokenizer "
                f"{tokenizer!r} splits it. Use a tokenizer with the ChatML tokens (Qwen2's), or "
                "set chat_template to a template written with this tokenizer's own tokens."
            )

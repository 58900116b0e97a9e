"""Tokenizer and chat template, from a GGUF header or a Hugging Face folder.

GGUF files carry a byte-level BPE (vocab, merges, token types) and the Jinja chat template; we
rebuild the fast tokenizer with the `tokenizers` library. The pre-tokenizer follows llama.cpp's
per-model rule named by `tokenizer.ggml.pre` (SmolLM2: digits split one by one, then GPT-2's regex).
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

GGUF_CONTROL = 3
GGUF_USER_DEFINED = 4
_PRE_TOKENIZERS = {
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    ),
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
}


class Tokenizer:
    """encode/decode plus the model's chat template.

    Args:
        fast: the `tokenizers.Tokenizer`.
        eos_token_id: the id that ends generation.
        bos_token_id: prepended by `encode` only when `add_bos` is set.
        chat_template: Jinja source, or None when the model has none.
    """

    def __init__(
        self,
        fast: FastTokenizer,
        *,
        eos_token_id: int,
        bos_token_id: int | None,
        chat_template: str | None,
        add_bos: bool = False,
    ) -> None:
        self.fast = fast
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self._template = None
        if chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(chat_template)

    @property
    def vocab_size(self) -> int:
        return self.fast.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL while it works (encode holds it): a huge prompt tokenized on a server's worker
        # thread then leaves the event loop free; the ids are the same.
        ids = self.fast.encode_batch([text], add_special_tokens=False)[0].ids
        return [self.bos_token_id, *ids] if self.add_bos and self.bos_token_id is not None else ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.fast.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.fast.id_to_token(token_id) or ""

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template renders a request's tools itself (it names `tools`)."""
        return self.chat_template is not None and "tools" in self.chat_template

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """Render OpenAI-style messages (and, for a template that takes them, the request's tools) into the model's
        prompt text.

        Raises:
            ValueError: when the model has no chat template or the messages break it.
        """
        if self._template is None:
            raise ValueError("this model has no chat template; use a completion prompt instead")
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools or None,
                bos_token=self.token_text(self.bos_token_id) if self.bos_token_id is not None else "",
                eos_token=self.token_text(self.eos_token_id),
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from exc

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: dict) -> Tokenizer:
        """Build from GGUF metadata values (already decoded to Python values)."""
        model = fields.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer model {model!r}; only byte-level BPE ('gpt2') is supported")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        fast = FastTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        pre = fields.get("tokenizer.ggml.pre", "default")
        fast.pre_tokenizer = _PRE_TOKENIZERS.get(pre, _PRE_TOKENIZERS["default"])()
        fast.decoder = decoders.ByteLevel()
        specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == GGUF_CONTROL]
        user = [
            AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == GGUF_USER_DEFINED
        ]
        fast.add_special_tokens(specials)
        if user:
            fast.add_tokens(user)
        return cls(
            fast,
            eos_token_id=fields["tokenizer.ggml.eos_token_id"],
            bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
            chat_template=fields.get("tokenizer.chat_template"),
            add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        )

    @classmethod
    def from_hf_dir(cls, path: Path, config: dict) -> Tokenizer:
        """Build from tokenizer.json (+ tokenizer_config.json for the template and special tokens)."""
        tok_file = path / "tokenizer.json"
        if not tok_file.exists():
            raise ValueError(f"{path} has no tokenizer.json (a fast tokenizer is required)")
        fast = FastTokenizer.from_file(str(tok_file))
        tcfg = (
            json.loads((path / "tokenizer_config.json").read_text())
            if (path / "tokenizer_config.json").exists()
            else {}
        )
        template = tcfg.get("chat_template")
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()

        def token_id(key: str, cfg_key: str) -> int | None:
            tok = tcfg.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            found = fast.token_to_id(tok) if tok else None
            return found if found is not None else _first_id(config.get(cfg_key))

        eos = token_id("eos_token", "eos_token_id")
        if eos is None:
            raise ValueError(f"{path}: cannot tell the EOS token (tokenizer_config.json or config.json)")
        return cls(
            fast,
            eos_token_id=eos,
            bos_token_id=token_id("bos_token", "bos_token_id"),
            chat_template=template,
            add_bos=bool(tcfg.get("add_bos_token", False)),
        )


def _first_id(value) -> int | None:
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)

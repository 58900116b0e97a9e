"""Constrained decoding: a request's output held to a grammar (xgrammar), so a small model still answers with a
valid tool call or JSON.

    grammars = Grammars(tokenizer)                        # one per engine: compiles against its vocabulary
    params = SamplingParams(..., constraint=grammars.tool_call(tools, name="search"))
    params = SamplingParams(..., constraint=grammars.json(schema))    # None: any JSON object

A `Constraint` is one request's grammar state: before each sample the sampler masks the tokens the grammar does
not allow next (`mask`), after it tells the grammar the token taken (`accept`). Once the grammar is complete only
the stop tokens remain allowed, so the request ends as any other does. Grammars come from xgrammar (the library
vLLM and SGLang use for structured output); compiled grammars are cached by xgrammar per compiler.
"""

from __future__ import annotations

import json
import threading

import torch

try:  # the `server` extra; without it a request that needs a grammar is refused (see `available`)
    import xgrammar as xgr
except ImportError:  # pragma: no cover - exercised only without the extra
    xgr = None  # type: ignore[assignment]

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"  # around a JSON list of calls


def available() -> bool:
    return xgr is not None


class Constraint:
    """One request's grammar matcher (used on the engine thread only)."""

    def __init__(self, compiled, vocab_size: int) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits of the tokens the grammar forbids next to -inf, in place (one row)."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        row = logits.view(1, -1)
        xgr.apply_token_bitmask_inplace(row, self.bitmask.to(row.device), vocab_size=self.vocab_size)

    def accept(self, token_id: int) -> None:
        if not self.matcher.is_terminated():
            self.matcher.accept_token(token_id)


class Grammars:
    """Compiles grammars against one tokenizer's vocabulary (byte-level BPE, as the GGUF and HF tokenizers the
    engine loads are)."""

    def __init__(self, tokenizer) -> None:
        if xgr is None:
            raise RuntimeError("constrained decoding needs xgrammar: pip install 'kvobs[server]'")
        vocab = [tokenizer.token_text(i) for i in range(tokenizer.vocab_size)]
        stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=len(vocab), stop_token_ids=stop)
        self.vocab_size = len(vocab)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._lock = threading.Lock()  # compiles happen on server worker threads

    def json(self, schema: dict | None = None) -> Constraint:
        """Any JSON object (`response_format: json_object`), or one matching `schema` (`json_schema`)."""
        schema = {"type": "object"} if schema is None else schema  # json_object: an object, not any JSON value
        with self._lock:
            compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        return Constraint(compiled, self.vocab_size)

    def tool_call(self, tools: list[dict], name: str | None = None) -> Constraint:
        """One call of one of `tools` (OpenAI function tools), or of the one named, in the model's tool-call syntax:
        `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>` (SmolLM2's; Hermes-style models use the same
        tags)."""
        calls = [_call_schema(t["function"]) for t in tools if name is None or t["function"]["name"] == name]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        grammar = xgr.Grammar.concat(
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(TOOL_CALL_START + '[')}"),
            xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False),
            xgr.Grammar.from_ebnf(f"root ::= {json.dumps(']' + TOOL_CALL_END)}"),
        )
        with self._lock:
            compiled = self.compiler.compile_grammar(grammar)
        return Constraint(compiled, self.vocab_size)


def _call_schema(function: dict) -> dict:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }

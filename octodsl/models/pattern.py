"""Layer-pattern strings: one symbol per atomic sub-layer, `[` embedding ... `]` LM head + loss.

The symbols are those of the plan language's `partition "..."` form (docs/language.md).
"""

from __future__ import annotations

SYMBOL_KIND: dict[str, str] = {
    "[": "embedding",
    "M": "mamba2",
    "m": "mamba1",
    "*": "attention",
    "G": "gated_deltanet",
    "-": "mlp",
    "E": "moe",
    "]": "lm_head_loss",
}
"""Pattern symbol -> layer kind."""

KIND_SYMBOL: dict[str, str] = {kind: sym for sym, kind in SYMBOL_KIND.items()}
"""Layer kind -> pattern symbol."""

LAYER_KINDS: tuple[str, ...] = tuple(SYMBOL_KIND.values())
"""Every layer kind, in the symbol table's order."""


MIXERS = "*G"
"""Symbols that open a transformer layer of a GPT-style model (attention, gated DeltaNet)."""
FFNS = "-E"
"""Symbols that close one (MLP, MoE)."""


def transformer_layers(body: str) -> bool:
    """Whether a pattern (less its `[` and `]`) is GPT-style transformer layers: mixer, MLP,
    mixer, MLP, ... (Llama, Qwen3-Next); Megatron-LM then counts each pair as one layer, and
    each symbol of any other pattern (its hybrid models) as one."""
    return len(body) % 2 == 0 and all(
        body[i] in MIXERS and body[i + 1] in FFNS for i in range(0, len(body), 2)
    )


def normalize_pattern(text: str) -> str:
    """The pattern with whitespace removed and the `[` / `]` ends added when left out.

    Raises ValueError naming the first symbol that is not a layer symbol, or a bracket that is
    not at an end."""
    body = "".join(text.split())
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    for i, sym in enumerate(body):
        if sym not in SYMBOL_KIND:
            known = " ".join(f"'{s}'" for s in SYMBOL_KIND)
            raise ValueError(
                f"unknown layer symbol {sym!r} at position {i} of the pattern (symbols: {known})"
            )
        if sym in "[]" and 0 < i < len(body) - 1:
            raise ValueError(
                f"{sym!r} at position {i}: the embedding '[' and the LM head ']' "
                "may only open and close the pattern"
            )
    if len(body) < 2:
        raise ValueError("empty pattern")
    return body

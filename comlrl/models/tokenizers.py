"""Tokenizers of training entities: who gets which tokenizer, and the special ids we need.

Trainers never rewrite a model's config for padding (CoMLRL 1.4.3 wrote pad/eos ids into every model
config lazily); the ids below are passed explicitly wherever they are needed.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from comlrl.models.sources import check_source_exists, describe_source, load_failure_fix


def _is_tokenizer_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def plan_tokenizers(tokenizer: Any, sources: Sequence[Any], *, kind: str = "agents", argument: str = "tokenizer") -> List[Any]:
    """One tokenizer (object) or tokenizer source (string to load) per entity, without loading.

    - ``tokenizer`` None: each string source's own tokenizer is loaded; a model object has no
      loadable name, so a tokenizer must then be given.
    - a list/tuple: one per entity (length must match).
    - anything else: one tokenizer (object, hub id or directory) shared by every entity.
    """
    count = len(sources)
    if tokenizer is None:
        for index, source in enumerate(sources):
            if not isinstance(source, str):
                raise ValueError(
                    f"{argument} is required because {kind}[{index}] is {describe_source(source)}: a loaded "
                    f"model carries no tokenizer. Pass {argument}=<tokenizer> (shared) or a list with one "
                    f"tokenizer per entry of {kind}."
                )
        return list(sources)
    if _is_tokenizer_sequence(tokenizer):
        if len(tokenizer) != count:
            raise ValueError(
                f"{argument} length ({len(tokenizer)}) must match the number of {kind} ({count}): "
                f"give one tokenizer per entry, or a single tokenizer to share."
            )
        for index, entry in enumerate(tokenizer):
            if entry is None:
                raise ValueError(f"{argument}[{index}] is None; give a tokenizer object, hub id or directory.")
        return list(tokenizer)
    return [tokenizer] * count


def tokenizer_fix(agents: Any) -> str:
    """The one line that gives ``agents`` their tokenizers: a saved folder or hub id holds its own."""
    sources = list(agents) if isinstance(agents, (list, tuple)) else [agents]
    if sources and all(isinstance(source, str) for source in sources):
        return f"Add tokenizer={sources!r} (each folder or id holds its tokenizer)."
    return ("Add tokenizer=[AutoTokenizer.from_pretrained(path) for path in <the folders or ids the agents were loaded "
            "from>], one per agent.")


def load_tokenizers(plan: Sequence[Any]) -> List[Any]:
    """Load string entries with ``AutoTokenizer`` (each distinct string once); objects pass through."""
    from transformers import AutoTokenizer

    cache: Dict[str, Any] = {}
    out = []
    for entry in plan:
        if isinstance(entry, str):
            if entry not in cache:
                check_source_exists(entry, "tokenizer")
                try:
                    cache[entry] = AutoTokenizer.from_pretrained(entry)
                except (OSError, ValueError) as exc:
                    reason = " ".join(str(exc).split()).rstrip(".")
                    raise ValueError(
                        f"Could not load a tokenizer from {entry!r}: {reason}. {load_failure_fix(entry, 'tokenizer files')[:-1]}, "
                        f"or pass tokenizer=... explicitly."
                    ) from exc
            out.append(cache[entry])
        else:
            out.append(entry)
    return out


def pad_token_id(tokenizer: Any) -> int:
    """The id used to pad: the tokenizer's pad token, else its end-of-sequence token."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has neither a pad token nor an end-of-sequence token; "
            f"set tokenizer.pad_token before training."
        )
    return int(pad)


def _special_ids(tokenizer: Any) -> Optional[set]:
    """Ids the tokenizer treats as special tokens (None when it cannot say)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        ids.update(int(i) for i, token in decoder.items() if getattr(token, "special", True))
    return ids or None


def eos_token_ids(tokenizer: Any, model: Any = None) -> List[int]:
    """Every id that ends a completion: the tokenizer's eos, plus the eos ids of the model's generation
    config that the tokenizer agrees are special tokens (chat models list their end-of-turn token
    there, e.g. Llama-3's ``<|eot_id|>`` beside ``<|end_of_text|>``). Nothing else of the model's
    generation config is ever used."""
    ids: List[int] = []

    def add(value: Any, allowed: Optional[set] = None) -> None:
        if value is None:
            return
        for item in value if isinstance(value, (list, tuple, set)) else [value]:
            if item is None or int(item) in ids:
                continue
            if allowed is not None and int(item) not in allowed:
                continue
            ids.append(int(item))

    add(getattr(tokenizer, "eos_token_id", None))
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        add(getattr(generation_config, "eos_token_id", None), _special_ids(tokenizer) or set())
    return ids


def bos_token(tokenizer: Any) -> Optional[tuple]:
    """``(text, id)`` of the tokenizer's beginning-of-sequence token, or None."""
    text, token_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if not isinstance(text, str) or not text or token_id is None:
        return None
    return text, int(token_id)


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token (its eos) when it has none; raise if it has neither."""
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "pad_token_id", None) is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no pad token and no eos token to use instead; set tokenizer.pad_token."
        )
    return tokenizer


def ensure_tokenizer(model: Any, tokenizer: Any = None) -> Any:
    """``tokenizer`` (given) or the tokenizer loaded from the model id ``model``, with a pad token."""
    if tokenizer is None:
        if not isinstance(model, str):
            raise ValueError(
                f"A tokenizer is required for {describe_source(model)}; pass tokenizer=... explicitly."
            )
        tokenizer = load_tokenizers([model])[0]
    return ensure_pad_token(tokenizer)


def resolve_tokenizers(model: Any, tokenizer: Any, agents: Optional[Sequence[Any]] = None) -> Any:
    """CoMLRL-compatible helper: a tokenizer list when ``agents`` is given, else one tokenizer."""
    if agents is None:
        if _is_tokenizer_sequence(tokenizer):
            return [ensure_pad_token(t) for t in load_tokenizers(tokenizer)]
        return ensure_tokenizer(model, tokenizer)
    tokenizers = load_tokenizers(plan_tokenizers(tokenizer, list(agents)))
    if not _is_tokenizer_sequence(tokenizer) and tokenizer is not None:
        return ensure_pad_token(tokenizers[0])
    return [ensure_pad_token(t) for t in tokenizers]


def add_special_tokens(tokenizer: Any, special_tokens: Optional[Dict[str, Any]]) -> None:
    """Apply ``model_config["special_tokens"]`` to a tokenizer (embeddings are resized by the loader)."""
    if special_tokens:
        tokenizer.add_special_tokens(dict(special_tokens))


def check_vocabulary_fits(model: Any, tokenizer: Any, label: str) -> None:
    """Refuse a tokenizer whose ids do not all index the model's input embedding."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    try:
        size = len(tokenizer)
    except TypeError:
        return  # duck-typed tokenizer without a length: nothing to check
    if rows is not None and size > rows:
        raise ValueError(
            f"The tokenizer of {label} has {size} tokens but the model's embedding has only {rows} rows, so "
            f"some ids would fall outside it. Give this model its own tokenizer (a list with one tokenizer "
            f"per agent), or resize the model's embeddings."
        )


def apply_tokenizer_specials(tokenizer: Any, models: Sequence[Any]) -> None:
    """Write the tokenizer's pad id and eos id (pad when eos is missing) into each model's config.

    comlrl's trainers never need this (they pass the ids explicitly); it is kept for code that calls it.
    """
    pad = getattr(tokenizer, "pad_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    for model in models:
        inner = getattr(model, "model", None)
        config = getattr(inner, "config", None) if inner is not None and hasattr(model, "value_head") else None
        config = config if config is not None else getattr(model, "config", None)
        if config is None:
            continue
        if pad is not None:
            config.pad_token_id = pad
        if eos is not None or pad is not None:
            config.eos_token_id = eos if eos is not None else pad

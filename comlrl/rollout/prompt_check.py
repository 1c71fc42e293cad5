"""Every prompt fits its agent: checked over the datasets' rows once the tokenizers are loaded and
before any model loads, and again for each prompt as it is encoded (later turns, streamed data).

An agent's context holds ``max_position_embeddings`` positions (``n_positions``, ...); a prompt plus
``max_new_tokens`` sampled tokens must fit, or generation fails inside the model (an embedding
index out of range) or runs past what the model was trained on. The check formats each row with
each agent's formatter (so a formatter that fails on a row is named with that row here too) and
counts tokens only for prompts that could be too long: a token covers at least one byte of UTF-8
text, so a prompt of fewer bytes than the budget (less a few added special tokens) fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from comlrl.rollout.rows import describe_row, labelled_rows

SPECIAL_TOKEN_MARGIN = 8  # BOS/EOS and other tokens a tokenizer adds to the text's own
ENCODE_BATCH = 256


class PromptTooLongError(ValueError):
    """A prompt plus ``max_new_tokens`` does not fit its agent's context (``index``: the prompt's position
    in the generate call that found it, when found there)."""

    def __init__(self, message: str, index: Optional[int] = None):
        super().__init__(message)
        self.index = index


def too_long_message(tokens: int, limit: int, max_new_tokens: int) -> str:
    return (f"the prompt has {tokens} tokens, and with max_new_tokens={max_new_tokens} it needs {tokens + max_new_tokens} "
            f"positions, more than the model's context of {limit} (max_position_embeddings). Shorten the prompts (the "
            f"formatter, or filter long rows out), lower max_new_tokens to at most {max(limit - tokens, 0)}, or use a model "
            f"with a longer context.")


def check_budget(limit: Optional[int], max_new_tokens: int, label: str) -> None:
    if limit is not None and limit - max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in {label}'s context of {limit} "
                         f"positions (max_position_embeddings); lower max_new_tokens below {limit}.")


@dataclass
class PromptCheck:
    """The datasets' rows against the agents' contexts (``__call__(tokenizers, limits)``)."""

    datasets: Mapping[str, Any]
    formatters: Sequence[Any]
    max_new_tokens: int

    def __call__(self, tokenizers: Sequence[Any], limits: Sequence[Optional[int]]) -> None:
        for agent, limit in enumerate(limits):
            check_budget(limit, self.max_new_tokens, f"agents[{agent}]")
        for name, dataset in self.datasets.items():
            if dataset is None or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
                continue  # an iterable dataset is not consumed here; its prompts are checked when encoded
            candidates: List[List[Tuple[int, Any, str]]] = [[] for _ in self.formatters]
            for index, row in enumerate(dataset):
                with labelled_rows([row], index, name):
                    prompts = [formatter(row) for formatter in self.formatters]
                for agent, prompt in enumerate(prompts):
                    limit = limits[agent]
                    if limit is not None and len(prompt.encode("utf-8")) + SPECIAL_TOKEN_MARGIN > limit - self.max_new_tokens:
                        candidates[agent].append((index, row, prompt))
            for agent, rows in enumerate(candidates):
                self._count(name, agent, rows, tokenizers[agent], limits[agent])

    def _count(self, name: str, agent: int, rows: List[Tuple[int, Any, str]], tokenizer: Any, limit: Optional[int]) -> None:
        for start in range(0, len(rows), ENCODE_BATCH):
            chunk = rows[start: start + ENCODE_BATCH]
            texts = [prompt for _, _, prompt in chunk]
            try:  # no "longer than the specified maximum" warning: the length is what is being checked
                ids = tokenizer(texts, verbose=False)["input_ids"]
            except TypeError:
                ids = tokenizer(texts)["input_ids"]
            for (index, row, _), tokens in zip(chunk, ids):
                if len(tokens) + self.max_new_tokens > limit:
                    with labelled_rows([row], index, name):
                        where = describe_row(row)
                    raise PromptTooLongError(f"agents[{agent}]'s prompt for {where}: "
                                             + too_long_message(len(tokens), limit, self.max_new_tokens))


def check_encoded(lengths: Sequence[int], limit: Optional[int], max_new_tokens: int) -> None:
    """Refuse the first prompt (by its token count) that does not fit ``limit`` with ``max_new_tokens``."""
    if limit is None:
        return
    for index, tokens in enumerate(lengths):
        if tokens + max_new_tokens > limit:
            raise PromptTooLongError(too_long_message(tokens, limit, max_new_tokens), index)

"""Formatters: one callable per agent that turns a dataset item into that agent's prompt."""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Mapping, Optional, Sequence

from comlrl.rollout.rows import as_dataset, callable_name, describe_row, raised_at


def _accepts_keyword(func: Callable, name: str) -> bool:
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def default_formatter(item: Mapping[str, Any], external_prompts: Optional[str] = None) -> str:
    """The item's ``"prompt"`` field, or the transition's prompt for later turns."""
    if external_prompts is not None:
        return external_prompts
    return item.get("prompt", "") if isinstance(item, Mapping) else ""


def check_not_empty(dataset: Any, name: str) -> None:
    """Refuse a dataset with a length of 0 (an iterable one without a length is not checked)."""
    try:
        empty = dataset is not None and len(dataset) == 0
    except TypeError:
        return
    if empty:
        raise ValueError(f"{name} has no rows, so there is nothing to train on (was every row filtered out?). Give a dataset "
                         f"with at least one row.")


def check_prompt_rows(datasets: Mapping[str, Any], formatters: Any) -> None:
    """Without formatters every prompt is the row's ``"prompt"``: refuse a dataset whose first row has
    none (or an empty one), naming the fields it has and the fix. Only indexable datasets and
    iterable ones that declare their columns are checked; nothing is consumed. An empty training
    dataset (no rows, e.g. everything filtered out) is refused whatever the formatters."""
    check_not_empty(datasets.get("train_dataset"), "train_dataset")
    if formatters is not None:
        return
    for name, dataset in datasets.items():
        dataset = as_dataset(dataset, name)
        if dataset is None:
            continue
        columns = _first_row_fields(dataset)
        if columns is None:
            continue
        fields, prompt = columns
        if "prompt" not in fields:
            problem = f"has no 'prompt' column (its rows have {sorted(fields)})"
        elif prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
            problem = f"has an empty or non-text 'prompt' in its first row ({prompt!r})"
        else:
            continue
        raise ValueError(
            f"{name} {problem} and no formatters were given, so the agents' prompts would be empty. Add a "
            f"'prompt' column, or pass formatters=[...] with one callable per agent (row -> prompt str); "
            f"comlrl.utils.chat_formatters builds them from a message such as '{{question}}'."
        )


def _first_row_fields(dataset: Any):
    """``(field names, first prompt or None)`` of a dataset's first row, or None when unknown."""
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        if len(dataset) == 0:
            return None
        row = dataset[0]
        if not isinstance(row, Mapping):
            return None
        return set(row), row.get("prompt")
    columns = getattr(dataset, "column_names", None)
    return (set(columns), None) if columns else None


class FormatterError(ValueError):
    """A formatter raised, or returned something other than a prompt string, for a dataset row."""


class Formatter:
    """Calls a user formatter with ``(item)`` or ``(item, external_prompts=...)`` and checks the result;
    whatever goes wrong is one ``FormatterError`` naming the formatter, its agent and the row."""

    def __init__(self, func: Callable, index: int, *, pass_none_external_prompts: bool):
        self.original = func
        self.index = index
        self._takes_external = _accepts_keyword(func, "external_prompts")
        self._pass_none = pass_none_external_prompts

    def _name(self) -> str:
        if self.original is default_formatter:
            return f"formatters[{self.index}] (none given: the row's 'prompt'), agent {self.index}"
        return f"formatters[{self.index}] ({callable_name(self.original)}) of agent {self.index}"

    def __call__(self, item: Any, external_prompts: Optional[str] = None) -> str:
        try:
            if self._takes_external and (external_prompts is not None or self._pass_none):
                prompt = self.original(item, external_prompts=external_prompts)
            else:
                prompt = self.original(item)
        except Exception as error:  # noqa: BLE001 - the user's formatter: name it, its agent and the row
            fields = f" (the row's fields: {sorted(map(str, item))})" if isinstance(item, Mapping) else ""
            raise FormatterError(
                f"{self._name()} raised {type(error).__name__}: {error}{raised_at(error)} on {describe_row(item)}{fields}. "
                f"Fix the formatter or that row (a formatter maps a row to the agent's prompt string)."
            ) from error
        if not isinstance(prompt, str):
            what = "None" if prompt is None else f"a {type(prompt).__name__}"
            cause = " (its 'prompt' field is None or missing)" if self.original is default_formatter else ""
            raise FormatterError(
                f"{self._name()} returned {what} for {describe_row(item)}{cause}; it must return the prompt as a str. "
                f"Fill in or drop that row (e.g. dataset.filter(lambda row: row['prompt'])), or fix the formatter."
            )
        return prompt

    def __repr__(self) -> str:
        return f"Formatter({self.original!r})"


def build_formatters(formatters: Any, num_agents: int, *, pass_none_external_prompts: bool = True) -> List[Formatter]:
    """One ``Formatter`` per agent from None (the item's "prompt"), one callable, or a list of them."""
    if formatters is None:
        funcs: Sequence[Callable] = [default_formatter] * num_agents
    elif callable(formatters):
        funcs = [formatters] * num_agents
    elif isinstance(formatters, (list, tuple)):
        if len(formatters) != num_agents:
            raise ValueError(
                f"Number of formatters must match num_agents: got {len(formatters)} formatters for {num_agents} "
                f"agents. Give one formatter per agent, or a single callable to share."
            )
        for index, func in enumerate(formatters):
            if not callable(func):
                raise ValueError(f"formatters[{index}] must be callable, got {type(func).__name__}.")
        funcs = list(formatters)
    else:
        raise ValueError(
            f"formatters must be None, a callable or a list of callables (one per agent), got {type(formatters).__name__}."
        )
    return [Formatter(f, i, pass_none_external_prompts=pass_none_external_prompts) for i, f in enumerate(funcs)]


# ----------------------------------------------------------------------------- chat templates


def _message_function(message: Any, index: int) -> Callable[[Any], str]:
    """A per-agent user message: a format string over the item's fields, or a callable item -> str."""
    if callable(message):
        return message
    if not isinstance(message, str):
        raise ValueError(
            f"messages[{index}] must be a format string such as 'Answer briefly.\\n{{prompt}}' or a callable "
            f"item -> str, got {type(message).__name__}."
        )

    def render(item: Any) -> str:
        fields = dict(item) if isinstance(item, Mapping) else {"prompt": item}
        try:
            return message.format(**fields)
        except KeyError as exc:
            raise ValueError(
                f"messages[{index}] {message!r} names the field {exc.args[0]!r}, which the dataset row lacks "
                f"(it has {sorted(fields)})."
            ) from None

    return render


def adds_bos_token(tokenizer: Any) -> bool:
    """True when encoding text puts the tokenizer's BOS in front of it (``add_special_tokens=True``)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    try:
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        special = tokenizer("a")["input_ids"]
    except Exception:  # a duck-typed tokenizer: assume it does not
        return False
    return len(special) > len(plain) and special[0] == bos


class ChatFormatter:
    """One agent's formatter: the user message of an item in that agent's chat template, with the
    assistant turn opened (``add_generation_prompt=True``), as text (see ``chat_formatters``)."""

    def __init__(self, message: Callable[[Any], str], tokenizer: Any, system_prompt: Optional[str] = None):
        self.message = message
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        bos = getattr(tokenizer, "bos_token", None)
        # The tokenizer adds its BOS when the prompt is encoded; a template that writes it too would
        # give the model two, so the template's own copy is dropped from the text.
        self._strip = bos if isinstance(bos, str) and bos and self.has_template and adds_bos_token(tokenizer) else None

    def __call__(self, item: Any) -> str:
        text = self.message(item)
        if not isinstance(text, str):
            raise ValueError(f"the message of {self!r} must be a str, got {type(text).__name__}.")
        if not self.has_template:
            return text if self.system_prompt is None else f"{self.system_prompt}\n{text}"
        messages = [{"role": "user", "content": text}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if self._strip is not None and prompt.startswith(self._strip):
            prompt = prompt[len(self._strip):]
        return prompt

    def __repr__(self) -> str:
        return f"ChatFormatter({getattr(self.message, '__name__', 'message')}, {type(self.tokenizer).__name__})"


def chat_formatters(
    messages: Any,
    tokenizers: Any,
    *,
    system_prompt: Optional[str] = None,
    num_agents: Optional[int] = None,
) -> List[ChatFormatter]:
    """One formatter per agent that puts its user message into that agent's own chat template.

    Instruct models answer a bare prompt with their end-of-turn token; in their chat template they
    answer. Each formatter renders ``tokenizer.apply_chat_template([system?, user], tokenize=False,
    add_generation_prompt=True)`` and returns the text (a plain ``str``), so a heterogeneous team
    gets each model's own format.

    - ``messages``: per agent, a format string over the dataset row's fields
      (``"Give a brief answer.\\n{prompt}"``) or a callable row -> str (e.g. an existing plain-text
      formatter); one entry shared by every agent, or a list with one per agent. In later turns the
      row's ``prompt`` is the transition's prompt, so the same message wraps it.
    - ``tokenizers``: per agent, a tokenizer object or the hub id / folder to load it from (each
      distinct string loaded once); one shared, or a list with one per agent.
    - ``system_prompt``: an optional system message (the template's default otherwise).
    - ``num_agents``: needed only when neither argument is a list.

    A tokenizer without a chat template (a base model) gets the message text as it is. When a
    tokenizer adds its BOS token while encoding and its template writes one too, the template's is
    dropped, so the model sees exactly one BOS.
    """
    from comlrl.models.tokenizers import load_tokenizers

    message_list = list(messages) if isinstance(messages, (list, tuple)) else None
    tokenizer_list = list(tokenizers) if isinstance(tokenizers, (list, tuple)) else None
    lengths = {len(x) for x in (message_list, tokenizer_list) if x is not None}
    if num_agents is not None:
        lengths.add(num_agents)
    if len(lengths) != 1:
        raise ValueError(
            f"chat_formatters needs one entry per agent: got {len(message_list) if message_list is not None else 'one'} "
            f"message(s), {len(tokenizer_list) if tokenizer_list is not None else 'one'} tokenizer(s) and "
            f"num_agents={num_agents}. Give lists of the same length (or a single shared entry and num_agents)."
        )
    count = lengths.pop()
    if count < 1:
        raise ValueError("chat_formatters needs at least one agent.")
    message_list = message_list if message_list is not None else [messages] * count
    loaded = load_tokenizers(tokenizer_list if tokenizer_list is not None else [tokenizers] * count)
    return [ChatFormatter(_message_function(m, i), tok, system_prompt) for i, (m, tok) in enumerate(zip(message_list, loaded))]

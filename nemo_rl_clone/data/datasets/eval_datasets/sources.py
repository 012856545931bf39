"""Rows of NeMo-RL's evaluation sets that are read from their own sources (`load_eval_dataset`'s ``math``,
``mmlu``, ``mmlu_<LANG>``, ``mmlu_pro``, ``gpqa``, ``gpqa_diamond``).

- ``math``: the full MATH test set, ``simple-evals/math_test.csv`` (columns ``Question``, ``Answer``) → the common
  math form ``{"problem", "expected_answer", "task_name"}``.
- ``mmlu`` (English) and ``mmlu_<LANG>`` (`MMLU_LANGUAGES`): ``simple-evals/mmlu[_<LANG>].csv`` (columns
  ``Question``, ``A`` … ``D``, ``Answer`` (a letter), ``Subject``).
- ``mmlu_pro``: ``TIGER-Lab/MMLU-Pro`` split ``test`` (``question``, ``options``: a list of up to 10 strings,
  ``answer`` (a letter), ``category``).
- ``gpqa`` / ``gpqa_diamond``: ``Idavidrein/gpqa`` configs ``gpqa_main`` / ``gpqa_diamond``, split ``train``
  (``Question``, ``Correct Answer``, ``Incorrect Answer 1`` … ``3``). The four choices of each row are shuffled
  with a ``random.Random`` seeded by the evaluation seed, so a run is reproducible; NeMo-RL shuffles with an
  unseeded one, so its letters (and its scores, a little) change from run to run. ``answer`` is the letter where
  the correct choice landed.

Multiple-choice rows are ``{"question", "options": {letter: text}, "answer", "subject", "task_name"}`` (GPQA's
without ``subject``), the form `multichoice_qa_processor` reads; ``task_name`` is ``math``, the environment that
scores them (with a multiple-choice ``env.math.verifier_type``). ``data_path`` replaces the source with a local file (or URL) in the source's format.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nemo_rl_clone.data.datasets import DataError

# The loaders (and torch, through `common`) load on first use: the names above are read when a config is validated.
if TYPE_CHECKING:
    import datasets

SIMPLE_EVALS = "https://openaipublic.blob.core.windows.net/simple-evals"
MMLU_LANGUAGES = (
    "AR-XY",
    "BN-BD",
    "DE-DE",
    "EN-US",
    "ES-LA",
    "FR-FR",
    "HI-IN",
    "ID-ID",
    "IT-IT",
    "JA-JP",
    "KO-KR",
    "PT-BR",
    "ZH-CN",
    "SW-KE",
    "YO-NG",
)
MMLU_PRO_HUB_ID = "TIGER-Lab/MMLU-Pro"
GPQA_HUB_ID = "Idavidrein/gpqa"
GPQA_VARIANTS = ("main", "diamond")
LETTERS = "ABCDEFGHIJ"

# The instruction placed before the question and options when no data.prompt_file is given (NeMo-RL's text).
GPQA_PROMPT = (
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before answering.\n"
)
MMLU_PRO_PROMPT = (
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'Answer: $LETTER' (without quotes) where LETTER is one of A, B, C, D, E, F, G, H, I, J. Think step by "
    "step before answering.\n"
)

# CSV cells such as "None" or "NA" are answer options, not missing values (pandas reads them as NaN by default).
_CSV_AS_TEXT = {"keep_default_na": False}


def mmlu_language(name: str) -> str | None:
    """The language of MMLU set ``name`` (``mmlu`` → EN-US, ``mmlu_ZH-CN`` → ZH-CN); None: not an MMLU set."""
    if name == "mmlu":
        return "EN-US"
    language = name.removeprefix("mmlu_")
    return language if name.startswith("mmlu_") and language in MMLU_LANGUAGES else None


def mmlu_dataset_name(language: str) -> str:
    """`load_eval_dataset`'s name of the MMLU set in ``language``."""
    if language not in MMLU_LANGUAGES:
        raise DataError(f"language: unknown MMLU language {language!r}; use one of {', '.join(MMLU_LANGUAGES)}")
    return "mmlu" if language == "EN-US" else f"mmlu_{language}"


MMLU_DATASETS = tuple(mmlu_dataset_name(language) for language in MMLU_LANGUAGES)
MULTICHOICE_DATASETS = ("gpqa", "gpqa_diamond", *MMLU_DATASETS, "mmlu_pro")
SOURCE_DATASETS = ("math", *MULTICHOICE_DATASETS)
DEFAULT_PROMPTS = {"gpqa": GPQA_PROMPT, "gpqa_diamond": GPQA_PROMPT, "mmlu_pro": MMLU_PRO_PROMPT}


def load_source_rows(name: str, data_path: str | None, seed: int) -> datasets.Dataset:
    """The rows of set ``name`` (one of `SOURCE_DATASETS`), from its source or from ``data_path``."""
    if name == "math":
        return math_test_rows(data_path)
    if name == "mmlu_pro":
        return mmlu_pro_rows(data_path)
    if name.startswith("gpqa"):
        return gpqa_rows("diamond" if name == "gpqa_diamond" else "main", seed, data_path)
    language = mmlu_language(name)
    if language is None:
        raise DataError(f"data.dataset_name: {name!r} is not one of {', '.join(SOURCE_DATASETS)}")
    return mmlu_rows(language, data_path)


def math_test_rows(data_path: str | None = None) -> datasets.Dataset:
    """The full MATH test set in the common math form."""
    from nemo_rl_clone.data.datasets.common import column, to_common_math_form

    url = f"{SIMPLE_EVALS}/math_test.csv"
    path = data_path or url
    raw = _read("math", data_path, url)
    return to_common_math_form(raw, f"math ({path})", problem=column("Question"), answer=column("Answer"))


def mmlu_rows(language: str = "EN-US", data_path: str | None = None) -> datasets.Dataset:
    """MMLU in ``language`` (simple-evals' translations), as multiple-choice rows."""
    name = mmlu_dataset_name(language)
    url = f"{SIMPLE_EVALS}/{name}.csv"
    path = data_path or url
    raw = _read(name, data_path, url)
    _require_columns(raw, name, path, ("Question", *LETTERS[:4], "Answer", "Subject"))

    def rekey(row: Mapping[str, Any], index: int) -> dict[str, Any]:
        options = {letter: _text(row[letter]) for letter in LETTERS[:4]}
        return {
            **_choice_row(name, path, index, row["Question"], options, row["Answer"]),
            "subject": _text(row["Subject"]),
        }

    return _map(raw, rekey, 4, f"{name} ({path})")


def mmlu_pro_rows(data_path: str | None = None) -> datasets.Dataset:
    """MMLU-Pro's test split: up to ten options, keyed A, B, C, … in order; ``subject`` is the category."""
    from nemo_rl_clone.data.datasets.common import load_raw_rows

    raw = load_raw_rows("mmlu_pro", MMLU_PRO_HUB_ID, "test", data_path, csv_options=_CSV_AS_TEXT)
    source = data_path or MMLU_PRO_HUB_ID
    _require_columns(raw, "mmlu_pro", source, ("question", "options", "answer", "category"))

    def rekey(row: Mapping[str, Any], index: int) -> dict[str, Any]:
        listed = row["options"]
        if not isinstance(listed, Sequence) or isinstance(listed, str) or not 1 <= len(listed) <= len(LETTERS):
            raise DataError(
                f"mmlu_pro ({source}): row {index}: field 'options' must be a list of 1 to {len(LETTERS)} "
                f"strings, got {listed!r}"
            )
        options = {letter: _text(text) for letter, text in zip(LETTERS, listed, strict=False)}
        choice_row = _choice_row("mmlu_pro", source, index, row["question"], options, row["answer"])
        return {**choice_row, "subject": _text(row["category"])}

    return _map(raw, rekey, len(LETTERS), f"mmlu_pro ({source})")


def gpqa_rows(variant: str = "diamond", seed: int = 42, data_path: str | None = None) -> datasets.Dataset:
    """GPQA ``variant`` (``main`` or ``diamond``), each row's choices in a seeded random order."""
    from nemo_rl_clone.data.datasets.common import load_raw_rows

    if variant not in GPQA_VARIANTS:
        raise DataError(f"variant: unknown GPQA variant {variant!r}; use one of {', '.join(GPQA_VARIANTS)}")
    name = "gpqa" if variant == "main" else "gpqa_diamond"
    raw = load_raw_rows(name, GPQA_HUB_ID, "train", data_path, hub_subset=f"gpqa_{variant}", csv_options=_CSV_AS_TEXT)
    source = data_path or f"{GPQA_HUB_ID} (gpqa_{variant})"
    choices = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    _require_columns(raw, name, source, ("Question", *choices))
    # Drawn up front in file order from one generator: the same seed gives every row the same order in any run.
    rng = random.Random(seed)
    orders = [rng.sample(range(4), 4) for _ in range(len(raw))]

    def rekey(row: Mapping[str, Any], index: int) -> dict[str, Any]:
        texts = [_text(row[key]) for key in choices]
        for key, text in zip(choices, texts, strict=True):
            if text is None:
                raise DataError(f"{name} ({source}): row {index}: field {key!r} is missing or empty")
        order = orders[index]
        options = {LETTERS[slot]: texts[choice] for slot, choice in enumerate(order)}
        answer = LETTERS[order.index(0)]  # where the correct choice (index 0) landed
        return _choice_row(name, source, index, row["Question"], options, answer)

    return _map(raw, rekey, 4, f"{name} ({source})", with_subject=False)


def _read(name: str, data_path: str | None, url: str) -> datasets.Dataset:
    """A simple-evals CSV from ``url``, or ``data_path`` instead (these sets are files, not hub datasets)."""
    from nemo_rl_clone.data.datasets.common import DatasetLoadError, load_raw_rows

    try:
        return load_raw_rows(name, url, "", data_path or url, csv_options=_CSV_AS_TEXT)
    except DatasetLoadError as err:
        if data_path is not None:
            raise
        raise DatasetLoadError(
            f"{err}; without network access, download it and set data.data_path to the file"
        ) from err


def _require_columns(raw: datasets.Dataset, name: str, source: str, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in raw.column_names]
    if missing:
        raise DataError(
            f"{name} ({source}): missing column(s) {missing}; the file has {raw.column_names}. "
            f"Expected the source's format: {list(columns)}"
        )


def _text(value: Any) -> str | None:
    """A cell as text (a CSV column of numbers is read as numbers); None for an empty cell."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _choice_row(
    name: str,
    source: str,
    index: int,
    question: Any,
    options: dict[str, str | None],
    answer: Any,
) -> dict[str, Any]:
    question_text, answer_text = _text(question), _text(answer)
    for key, value in (("question", question_text), ("answer", answer_text)):
        if value is None:
            raise DataError(f"{name} ({source}): row {index}: field {key!r} is missing or empty")
    given = [letter for letter, text in options.items() if text is not None]
    if answer_text not in given:
        raise DataError(
            f"{name} ({source}): row {index}: answer {answer_text!r} is not one of the row's option letters {given}"
        )
    return {"question": question_text, "options": options, "answer": answer_text, "task_name": "math"}


def _map(
    raw: datasets.Dataset,
    rekey: Callable[[Mapping[str, Any], int], dict[str, Any]],
    num_options: int,
    desc: str,
    with_subject: bool = True,
) -> datasets.Dataset:
    import datasets

    text = datasets.Value("string")
    # GPQA has no subject column: its rows go without one (the processor copies a subject into extra_env_info).
    # Declared so that an option absent from every row of a batch (MMLU-Pro's short lists) stays a string column.
    columns: dict[str, Any] = {"question": text, "options": dict.fromkeys(LETTERS[:num_options], text)}
    columns.update({"answer": text, **({"subject": text} if with_subject else {}), "task_name": text})
    features = datasets.Features(columns)
    return raw.map(rekey, with_indices=True, remove_columns=raw.column_names, features=features, desc=desc)

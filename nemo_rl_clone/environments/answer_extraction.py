"""Pull the final answer out of a model response (pure functions, no dependencies).

Which extractor is used decides whether GRPO groups have any reward variance: SmolLM2-135M-Instruct never writes
``<answer>`` tags unless the prompt shows a one-shot example, but a last-number scorer finds its answers on easy
arithmetic (docs/grpo.md, "The main job on a 2-core CPU machine"). ``auto`` therefore tries the explicit formats first and
falls back to the last number.

Every extractor returns the answer as a stripped string, or ``None`` when the response holds no answer in that
format (an empty answer counts as none). They look at the *last* occurrence: models restate and correct themselves,
and the final statement is the one that counts.
"""

from __future__ import annotations

import re

ANSWER_EXTRACTION_METHODS: tuple[str, ...] = ("boxed", "answer_tag", "last_number", "auto")

_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
# One number: optional sign, then 1,234,567(.89) | 1234(.5) | .5, then an optional /denominator.
# - A number never starts inside a word, a decimal or a fraction ("x2", "v1.2", "3/4" yield no extra numbers).
# - "-" is a sign only where it cannot be a binary minus: not after a digit, letter or closing bracket, and it must
#   touch the digits ("4 - 1 = 3" -> "3", "3-5" -> "5", "= -4" -> "-4").
# - Comma groups count as thousands separators only when every group has exactly three digits and no digit
#   follows ("1,234" -> "1234", but "1, 2, 3" and "1,2345" are separate numbers).
_LAST_NUMBER = re.compile(
    r"(?:(?<![A-Za-z0-9_./)\]}])(?P<sign>[-+\u2212])(?=\.?\d))?"
    r"(?<![A-Za-z0-9_./])"
    r"(?P<magnitude>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?|\.\d+)"
    r"(?:/(?P<denominator>\d+))?"
)


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included.

    An unclosed last box (a truncated response) is skipped in favour of the previous complete one.
    """
    starts = sorted(
        (match.end() for command in _BOXED_COMMANDS for match in re.finditer(re.escape(command) + r"\s*\{", text)),
        reverse=True,
    )
    for content_start in starts:
        depth = 1
        for position in range(content_start, len(text)):
            if text[position] == "{":
                depth += 1
            elif text[position] == "}":
                depth -= 1
                if depth == 0:
                    return _non_empty(text[content_start:position])
    return None


def extract_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` (tags case-insensitive, content may span lines).

    A last opening tag with no closing tag yields everything after it: generation engines drop the stop string
    from the output, so a response stopped at ``</answer>`` ends without it.
    """
    openings = list(_ANSWER_OPEN.finditer(text))
    if not openings:
        return None
    content_start = openings[-1].end()
    closing = _ANSWER_CLOSE.search(text, content_start)
    return _non_empty(text[content_start : closing.start() if closing else len(text)])


def extract_last_number(text: str) -> str | None:
    """The last number in ``text``, normalised so that ``decimal.Decimal`` or a fraction parser accepts it.

    Handles signs (ASCII or Unicode minus; a leading ``+`` is dropped), decimals (``.5`` becomes ``0.5``), thousands
    separators (removed: ``1,234`` -> ``1234``) and fractions ``a/b`` (kept as ``a/b``, sign in front). A sentence
    full stop is not part of a number (``"is 42."`` -> ``"42"``). LaTeX (``\\frac{3}{4}``) is not a number here; use
    ``boxed`` for LaTeX answers. Exponents and units are not understood (``1e5`` -> ``1``, ``50%`` -> ``50``).
    """
    matches = list(_LAST_NUMBER.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    magnitude = match["magnitude"].replace(",", "")
    if magnitude.startswith("."):
        magnitude = "0" + magnitude
    sign = "-" if match["sign"] in ("-", "\u2212") else ""
    denominator = f"/{match['denominator']}" if match["denominator"] else ""
    return f"{sign}{magnitude}{denominator}"


def extract_answer(text: str, method: str) -> str | None:
    """Dispatch to one extractor by name (one of `ANSWER_EXTRACTION_METHODS`).

    ``auto``: ``<answer>`` tag, else ``\\boxed{}``, else the last number.
    """
    if method == "boxed":
        return extract_boxed(text)
    if method == "answer_tag":
        return extract_answer_tag(text)
    if method == "last_number":
        return extract_last_number(text)
    if method == "auto":
        for extractor in (extract_answer_tag, extract_boxed, extract_last_number):
            answer = extractor(text)
            if answer is not None:
                return answer
        return None
    raise ValueError(
        f"unknown answer extraction method {method!r}; valid methods: {', '.join(ANSWER_EXTRACTION_METHODS)}"
    )


def _non_empty(answer: str) -> str | None:
    answer = answer.strip()
    return answer or None

"""Math rewards: the final answer of the whole response (seed prefix + continuation) checked with math-verify."""

from __future__ import annotations

import re

from trl.rewards import accuracy_reward

# A final answer is marked by \boxed{...}, a GSM8K-style "#### 42" line, or a sentence "The (final) answer is 42".
_HASHES = re.compile(r"^\s*####\s*(.+?)\s*$", re.MULTILINE)
_ANSWER_IS = re.compile(r"\banswer\s+is\s*:?\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


def completion_text(completion) -> str:
    """The text of a completion, which TRL passes as a string or, for conversational data, a list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(message["content"] for message in completion if message.get("role", "assistant") == "assistant")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces balanced; None when there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    open_brace = text.index("{", start)
    depth = 0
    for index in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[open_brace + 1 : index]
    return None  # unbalanced: the response was cut inside the box


def _clean(answer: str) -> str:
    # "$18." and "$\frac{1}{2}$." both occur after "The answer is"; math-verify wants the bare expression.
    answer = re.sub(r"\s+[A-Za-z][A-Za-z\s]*$", "", answer.strip().rstrip(".").strip())  # "18 dollars" -> "18"
    if len(answer) > 1 and answer.startswith("$") and answer.endswith("$"):
        answer = answer.strip("$")
    return answer.removeprefix("\\$").removeprefix("$").strip()


def extract_final_answer(text: str) -> str | None:
    """The final answer marked in `text`: the last \\boxed{}, else the last `####` line, else "The answer is X"."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip() or None
    for pattern in (_HASHES, _ANSWER_IS):
        matches = pattern.findall(text)
        if matches:
            return _clean(matches[-1]) or None
    return None


def math_reward(completions, answer, log_extra=None, **kwargs) -> list[float | None]:
    """1.0 when the response's final answer equals the gold `answer` (math-verify), else 0.0; None if the gold can't
    be parsed. Gold answers may be plain (`18`, `\\frac{1}{2}`) or full GSM8K/MATH solutions (`... #### 18`)."""
    texts = [completion_text(completion) for completion in completions]
    predicted = [extract_final_answer(text) for text in texts]
    # TRL's accuracy_reward finds \boxed{} first, so a marked answer is handed over boxed; unmarked text goes as is
    # and only scores if math-verify's own anchors ("final answer is $...$") find something.
    boxed = [[{"content": text if pred is None else f"\\boxed{{{pred}}}"}] for text, pred in zip(texts, predicted)]
    # Boxed too: math-verify reads a bare "\\frac12" or "x^2+1" as nothing, but a boxed one as the expression.
    gold = [f"\\boxed{{{extract_final_answer(str(ref)) or _clean(str(ref))}}}" for ref in answer]
    return accuracy_reward(boxed, gold, log_extra=log_extra)


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when the response marks a final answer (\\boxed{}, `####`, or "The answer is"), else 0.0."""
    return [float(extract_final_answer(completion_text(completion)) is not None) for completion in completions]

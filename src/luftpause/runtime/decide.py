"""``decide`` (R13): classify a text in one cheap step.

* No labels: the dataplane's single-pass replica (``POST /v1/decide``, vLLM
  ``/classify`` format: body ``{"model"?, "input"}``, answer ``data[0].label``
  and ``data[0].probs``).
* 2-20 labels: one *interactive* turn (B13: *batch* for a keyed caller that may
  not use interactive) on a generative replica with
  ``max_tokens: 1``, ``logprobs: true``, ``top_logprobs: 20``. Each label is
  scored by the probability of the top-logprob token that is the longest
  prefix of it (case and leading whitespace ignored: tokenizers split words
  differently); the scores are normalised over the scored labels. Labels whose
  first token is not among the top logprobs are returned as ``unscored``.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from luftpause.runtime.llm import Identity, TurnFailed

if TYPE_CHECKING:
    from luftpause.runtime.loop import Runtime

MIN_LABELS = 2
MAX_LABELS = 20
TOP_LOGPROBS = 20


def score_labels(
    labels: Sequence[str], top: Sequence[tuple[str, float]]
) -> tuple[dict[str, float], list[str]]:
    """Normalised first-token probabilities per label, and the labels left unscored."""
    raw: dict[str, float] = {}
    for label in labels:
        wanted = label.strip().lower()
        best: tuple[int, float] | None = None
        for token, logprob in top:
            piece = token.strip().lower()
            if piece and wanted.startswith(piece):
                candidate = (len(piece), logprob)
                if best is None or candidate > best:
                    best = candidate
        if best is not None:
            raw[label] = math.exp(best[1])
    total = sum(raw.values())
    probabilities = {k: v / total for k, v in raw.items()} if total > 0 else {}
    unscored = [label for label in labels if label not in raw]
    return probabilities, unscored


def prompt_for(text: str, labels: Sequence[str]) -> list[dict[str, str]]:
    return [
        {
            "role": "system",
            "content": "You classify texts. Answer with exactly one of the given labels and "
            "nothing else.",
        },
        {"role": "user", "content": f"{text}\n\nlabels: {', '.join(labels)}"},
    ]


async def decide(
    rt: Runtime,
    text: str,
    labels: list[str] | None,
    model: str | None,
    caller: str,
    service_class: str = "interactive",
) -> dict[str, Any]:
    from luftpause.runtime.loop import RuntimeError_, check_text

    for field, values in (("input", text), ("labels", labels), ("model", model)):
        check_text(field, values)
    if labels is None:
        try:
            data = await rt.llm.classify(text, model, caller)
        except TurnFailed as exc:
            raise RuntimeError_(str(exc)) from None
        items = data.get("data")
        if not isinstance(items, list) or not items or not isinstance(items[0], dict):
            raise RuntimeError_("decide failed: the classifier's answer has no data[0]")
        first = items[0]
        label = first.get("label")
        probs = first.get("probs")
        probs_list = [float(p) for p in probs] if isinstance(probs, list) else []
        best = max(probs_list) if probs_list else None
        return {
            "label": label,
            "probabilities": {str(label): best} if label is not None and best is not None else {},
            "classProbabilities": probs_list,
            "unscored": [],
            "model": data.get("model"),
            "via": "classifier",
        }
    cleaned = [label.strip() for label in labels]
    if not MIN_LABELS <= len(cleaned) <= MAX_LABELS:
        raise RuntimeError_(f"labels: give {MIN_LABELS}-{MAX_LABELS} labels, got {len(cleaned)}")
    if any(not label for label in cleaned):
        raise RuntimeError_("labels: a label is empty")
    if len(set(cleaned)) != len(cleaned):
        raise RuntimeError_("labels: labels must be distinct")
    model_name = model or await rt.default_model()
    run_id = f"decide-{uuid.uuid4().hex[:16]}"
    body = {
        "model": model_name,
        "messages": prompt_for(text, cleaned),
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }
    try:
        # One token: nothing for the decode pace to time, and logprobs come whole.
        data = await rt.llm.chat(body, Identity(run_id, service_class, caller), stream=False)
    except TurnFailed as exc:
        raise RuntimeError_(f"decide failed: {exc}") from None
    finally:
        await rt.llm.end_run(run_id)
    choice = data["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    top: list[tuple[str, float]] = []
    if content and isinstance(content[0], dict):
        first = content[0]
        for entry in first.get("top_logprobs") or []:
            if isinstance(entry, dict) and isinstance(entry.get("token"), str):
                top.append((entry["token"], float(entry.get("logprob", -math.inf))))
        if not top and isinstance(first.get("token"), str):
            top.append((first["token"], float(first.get("logprob", 0.0))))
    probabilities, unscored = score_labels(cleaned, top)
    label = max(probabilities, key=lambda k: probabilities[k]) if probabilities else None
    out: dict[str, Any] = {
        "label": label,
        "probabilities": {k: round(v, 6) for k, v in probabilities.items()},
        "unscored": unscored,
        "model": model_name,
        "via": "first-token logprobs",
    }
    if label is None:
        out["note"] = "no label's first token was among the model's top logprobs"
    return out

"""Dataset helpers: stable prompt ids and the checks every training dataset passes before any GPU work."""

from __future__ import annotations

import hashlib
import json


def prompt_id_of(prompt) -> str:
    """A stable id of a prompt: sha1 of its text, or of the canonical JSON of a list of chat messages."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]

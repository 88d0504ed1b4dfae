"""Real input data that lives beside the checkout, never inside it.

The routing traces and prompts in ``../shared/traces/`` carry no license, so the repository reads
them in place. ``$ELMOE3D_TRACES`` (a folder) overrides the location.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import UserError


__all__ = ["ROUTING_FILES", "ROUTING_MODEL", "PROMPT_FILE", "COUNT_FILE", "traces_dir",
           "traces_hint",
           "routing_path", "gsm8k_prompts"]

#: The real routing traces by name (``../shared/traces/README.md``: Mixtral-8x7B-Instruct on
#: GSM8K and HumanEval problems 0-1, top-2 of 8, with gate weights), the files of
#: :func:`traces_dir`.
ROUTING_FILES = {"gsm8k": "gsm8k_2_routing.jsonl", "humaneval": "humaneval_2_routing.jsonl"}
#: The model preset that routed them (the files name no model).
ROUTING_MODEL = "mixtral-8x7b"
#: The GSM8K prompts of those runs (real text for real activations).
PROMPT_FILE = "gsm8k_2_outputs.jsonl"
#: The OLMoE / Mixtral expert-count table (per-expert picks at layers 0, 7, 15 per domain).
COUNT_FILE = "olmoe_mixtral_expert_counts.csv"

_REPO = Path(__file__).resolve().parents[2]


def traces_dir() -> Path:
    """``$ELMOE3D_TRACES`` if set, else ``../shared/traces`` beside the repository."""
    env = os.environ.get("ELMOE3D_TRACES")
    return Path(env) if env else _REPO.parent / "shared" / "traces"


def traces_hint() -> str:
    """Where the traces folder is taken from, for an error about a missing trace file:
    ``" (the traces folder: ...)"``."""
    env = os.environ.get("ELMOE3D_TRACES")
    if not env:
        return " (the traces folder: ../shared/traces beside the checkout, or $ELMOE3D_TRACES)"
    # $ELMOE3D_TRACES naming a file (its README) or nothing: said, not left to the file's path
    what = ("" if Path(env).is_dir() else ", a file, not a folder" if Path(env).exists()
            else ", which does not exist")
    return f" (the traces folder: $ELMOE3D_TRACES = {env}{what})"


def routing_path(name: str = "gsm8k") -> Path:
    """The file of the real routing trace ``name`` (a key of :data:`ROUTING_FILES`) in
    :func:`traces_dir`; whether it is there is the reader's to check. Raises
    :class:`~elmoe3d.errors.UserError` naming the known names for another ``name``."""
    if not isinstance(name, str) or name not in ROUTING_FILES:
        raise UserError(f"routing trace {name!r}: expected one of {', '.join(ROUTING_FILES)}")
    return traces_dir() / ROUTING_FILES[name]


def gsm8k_prompts(path: Path | None = None) -> list[str]:
    """The GSM8K prompts of :data:`PROMPT_FILE` (real text for real activations).

    Raises :class:`~elmoe3d.errors.UserError` naming the file when it is missing or a line is
    not a JSON object with a non-empty ``prompt`` string.
    """
    path = Path(path) if path is not None else traces_dir() / PROMPT_FILE
    if not path.is_file():
        raise UserError(f"GSM8K prompts not found at {path} (set ELMOE3D_TRACES to the folder "
                        f"holding {PROMPT_FILE})")
    prompts = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    prompt = json.loads(line)["prompt"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise UserError(f"{path}:{lineno}: expected a JSON object with a 'prompt' "
                                    f"string ({exc})") from None
                if not isinstance(prompt, str) or not prompt:
                    raise UserError(f"{path}:{lineno}: 'prompt' must be a non-empty string")
                prompts.append(prompt)
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the GSM8K prompts ({exc})") from None
    if not prompts:
        raise UserError(f"{path}: no prompts")
    return prompts

"""Export the JSON Schema of every shared model and the AsyncAPI document, for subscribers.

`escrowd schemas export` writes `schemas/jsonschema/<Name>.json` and `schemas/asyncapi.yaml`
(which points to them); a test fails when the committed files differ from what the models and
the channel catalog produce.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from schemas.events import EscrowEventMessage, event_args_models

JSONSCHEMA_DIR = Path(__file__).parent / "jsonschema"

# Models of other modules, exported when the module exists: (module, class name).
_OPTIONAL_MODELS = (
    ("schemas.criteria", "VerificationCriteria"),
    ("schemas.verification", "VerificationResult"),
    ("schemas.task_state", "TaskState"),
    ("schemas.task_state", "Reputation"),
    ("schemas.task_state", "DeadlinePassed"),
    ("schemas.task_state", "AppealWindowClosed"),
    ("schemas.task_state", "EscalationCollectible"),
    ("schemas.task_state", "TimerRetracted"),
    ("schemas.verdict", "Verdict"),
    ("schemas.verdict", "SignedVerdict"),
    ("schemas.proof", "SignedProof"),
    ("schemas.task_terms", "TaskTerms"),
    ("schemas.task_terms", "FinalizeRequested"),
    ("schemas.task_terms", "ReviewSubmitted"),
    ("schemas.task_terms", "VerifierVerdictReported"),
    ("schemas.task_terms", "VerifierFailed"),
    ("schemas.task_terms", "RetryDue"),
    ("schemas.panels", "VerifierRegistration"),
    ("schemas.panels", "PanelRound"),
    ("schemas.panels", "SignedAttestation"),
    ("schemas.panels", "ConsensusRecord"),
    ("schemas.panels", "SignedRuling"),
    ("schemas.panels", "CalibrationUpdate"),
    ("schemas.panels", "FeeLedgerEntry"),
)


def exported_models() -> dict[str, type[BaseModel]]:
    """Every model whose schema is published, by file name."""
    models: dict[str, type[BaseModel]] = {"EscrowEventMessage": EscrowEventMessage}
    for name, model in event_args_models().items():
        models[f"events/{name}Args"] = model
    for module_name, class_name in _OPTIONAL_MODELS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        candidate = getattr(module, class_name, None)
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            models[class_name] = candidate
    return models


def render(model: type[BaseModel]) -> str:
    """The schema text of one model, stable across runs."""
    schema: dict[str, Any] = model.model_json_schema()
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def expected_files() -> dict[Path, str]:
    """Path → content of every schema file."""
    return {JSONSCHEMA_DIR / f"{name}.json": render(model) for name, model in exported_models().items()}


def export() -> list[Path]:
    """Write every schema file and the AsyncAPI document; remove stale ones; return the paths written."""
    from schemas import asyncapi

    files = expected_files()
    for path in JSONSCHEMA_DIR.rglob("*.json"):
        if path not in files:
            path.unlink()
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    asyncapi.ASYNCAPI_FILE.write_text(asyncapi.render(), encoding="utf-8")
    return [*sorted(files), asyncapi.ASYNCAPI_FILE]

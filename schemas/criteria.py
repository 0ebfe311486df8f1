"""Auto-check criteria (`verificationCriteria`) as posted with a task.

Every rule of the verification spec is a field here, with the spec's size limits:
lists hold at most 50 entries of 200 characters, `rubric` at most 20 items with 20
keywords each, `expected_schema.properties` at most 50 entries, `expected_answer` at
most 2,000 characters, `acceptance` at most 4,000, `min_length`/`max_length` are
positive whole numbers up to 1,000,000, `pass_threshold` is 0-100 and a rubric
`weight` is positive and at most 100.

Decisions where the spec is silent:

* Numbers must be JSON numbers: strings and booleans are refused rather than coerced
  (`"10"` is not a `min_length`). An integral float such as `10.0` is a whole number.
* `null` is read as "not set".
* `regex_pattern` has no size limit here: a pattern over 200 characters is refused by
  the check itself with the spec's `regex_pattern was not applied …` reason.
* `min_mentions` is at most 20, the most keywords a rubric item can list.
* Unknown fields are dropped, at every level (a misspelled field sets nothing);
  :func:`unknown_fields` names them so post-time validation can report them.

The models are frozen and hashable so that per-criteria work can be cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

LIST_ITEMS_MAX = 50
ITEM_CHARS_MAX = 200
RUBRIC_ITEMS_MAX = 20
RUBRIC_KEYWORDS_MAX = 20
SCHEMA_PROPERTIES_MAX = 50
SCHEMA_TYPE_CHARS_MAX = 50
EXPECTED_ANSWER_CHARS_MAX = 2_000
ACCEPTANCE_CHARS_MAX = 4_000
LENGTH_BOUND = 1_000_000
RUBRIC_WEIGHT_MAX = 100
DEFAULT_PASS_THRESHOLD = 60


def _json_number(value: object) -> object:
    """Refuse what JSON would not call a number; pydantic's lax mode would coerce it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON number")
    return value


Item = Annotated[str, StringConstraints(max_length=ITEM_CHARS_MAX)]
ItemList = Annotated[tuple[Item, ...], Field(max_length=LIST_ITEMS_MAX)]
Length = Annotated[int, BeforeValidator(_json_number), Field(gt=0, le=LENGTH_BOUND)]


class RubricItem(BaseModel):
    """One scored rubric item: `{criterion, keywords?, min_mentions?, weight?}`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    criterion: Item
    keywords: Annotated[tuple[Item, ...], Field(max_length=RUBRIC_KEYWORDS_MAX)] | None = None
    min_mentions: (
        Annotated[int, BeforeValidator(_json_number), Field(gt=0, le=RUBRIC_KEYWORDS_MAX)] | None
    ) = None
    weight: (
        Annotated[float, BeforeValidator(_json_number), Field(gt=0, le=RUBRIC_WEIGHT_MAX)] | None
    ) = None


class PropertySpec(BaseModel):
    """A property of `expected_schema`: only its `type` is kept (guidance, never scored)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Annotated[str, StringConstraints(max_length=SCHEMA_TYPE_CHARS_MAX)] | None = None


class ExpectedSchema(BaseModel):
    """`expected_schema`: `{type?, required?, properties?}`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Annotated[str, StringConstraints(max_length=SCHEMA_TYPE_CHARS_MAX)] | None = None
    required: ItemList | None = None
    properties: (
        Annotated[dict[Item, PropertySpec], Field(max_length=SCHEMA_PROPERTIES_MAX)] | None
    ) = None

    def __hash__(self) -> int:
        # The generated frozen hash would fail on the properties dict.
        properties = tuple(self.properties.items()) if self.properties is not None else None
        return hash((self.type, self.required, properties))


class VerificationCriteria(BaseModel):
    """The poster's rules for the auto check (all optional)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    min_length: Length | None = None
    contains_keywords: ItemList | None = None
    forbidden_phrases: ItemList | None = None
    required_fields: ItemList | None = None
    expected_schema: ExpectedSchema | None = None
    expected_answer: (
        Annotated[str, StringConstraints(max_length=EXPECTED_ANSWER_CHARS_MAX)] | None
    ) = None
    regex_pattern: str | None = None
    max_length: Length | None = None
    rubric: Annotated[tuple[RubricItem, ...], Field(max_length=RUBRIC_ITEMS_MAX)] | None = None
    pass_threshold: Annotated[float, BeforeValidator(_json_number), Field(ge=0, le=100)] | None = (
        None
    )
    acceptance: Annotated[str, StringConstraints(max_length=ACCEPTANCE_CHARS_MAX)] | None = None


def _unknown_keys(data: Mapping[Any, Any], model: type[BaseModel], prefix: str) -> list[str]:
    return [f"{prefix}{key}" for key in data if key not in model.model_fields]


def unknown_fields(data: Mapping[Any, Any]) -> list[str]:
    """Paths of the fields in raw criteria that the model drops (`rubric[0].wieght`, ...)."""
    found = _unknown_keys(data, VerificationCriteria, "")
    rubric = data.get("rubric")
    if isinstance(rubric, list | tuple):
        for index, item in enumerate(rubric):
            if isinstance(item, Mapping):
                found += _unknown_keys(item, RubricItem, f"rubric[{index}].")
    schema = data.get("expected_schema")
    if isinstance(schema, Mapping):
        found += _unknown_keys(schema, ExpectedSchema, "expected_schema.")
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            for name, spec in properties.items():
                if isinstance(spec, Mapping):
                    found += _unknown_keys(
                        spec, PropertySpec, f"expected_schema.properties.{name}."
                    )
    return found

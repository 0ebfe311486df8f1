"""The judge model: an OpenAI-compatible chat-completions client with strict answer parsing.

`ModelClient.ask(messages, Answer)` POSTs `{model, messages, temperature: 0,
response_format: {type: json_object}}` to `<url>/chat/completions` and returns the reply
parsed into `Answer` (a pydantic model with `extra="forbid"`). Everything about the reply
is hostile: its size is bounded before parsing, the envelope must have exactly one usable
choice that stopped normally, and the content must be exactly one JSON object that fits
`Answer` — no prose around it, no unknown fields, no coercion. Anything else is a
`ModelError`, never an answer: a caller turns it into "not judged (yet)", never a verdict.

Transient faults (timeouts, connection errors, HTTP 429 and 5xx) are retried with
tenacity (exponential backoff, `attempts` in all); a malformed reply is not retried here —
the model answered, badly, and the caller's next poll asks again.

The API key comes from `ESCROWD_MODEL_API_KEY` or the file `ESCROWD_MODEL_API_KEY_FILE`,
is held as a `SecretStr`, registered with the log redactor and only ever put in the
`Authorization` header.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import structlog
import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from runtime.httpbody import read_bounded
from runtime.logging import register_secret
from runtime.settings import ServiceSettings
from schemas import jsonbounds

log = structlog.get_logger(__name__)

PROMPTS_FILE = Path(__file__).with_name("prompts.yaml")
DATA_MARKER = "<<<DATA>>>"
MAX_CONTENT_CHARS = 16_000
"""Longest answer content accepted: a verdict is a flag and ten short reasons."""

AnswerT = TypeVar("AnswerT", bound=BaseModel)


class ModelError(Exception):
    """The model gave no usable answer. `transient` faults are worth retrying at once."""

    def __init__(self, reason: str, *, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


class ModelSettings(ServiceSettings):
    """Where the judge model is and how it is called (`ESCROWD_MODEL_*`)."""

    model_config = SettingsConfigDict(env_prefix="ESCROWD_MODEL_", extra="ignore")

    url: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible API (…/v1); none disables the judge"
    )
    name: str = Field(default="judge", min_length=1, max_length=200, description="Model name sent in requests")
    api_key: SecretStr | None = Field(default=None, description="Bearer key of the model API")
    api_key_file: Path | None = Field(default=None, description="File holding the key (preferred over the variable)")
    timeout_seconds: float = Field(default=60.0, gt=0, description="Seconds one model call may take")
    attempts: int = Field(default=3, ge=1, le=10, description="Tries per question on timeouts, 429 and 5xx")
    backoff_seconds: float = Field(default=1.0, ge=0, description="First wait between tries (doubles)")
    max_response_bytes: int = Field(default=256 * 1024, ge=1024, description="Largest reply body read")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("model url must be http(s)://")
        return value.rstrip("/")

    def key(self) -> str | None:
        """The API key (file first), registered with the log redactor; never log it."""
        if self.api_key_file is not None:
            try:
                value = self.api_key_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ModelError(f"cannot read the model key file: {type(exc).__name__}") from None
        elif self.api_key is not None:
            value = self.api_key.get_secret_value().strip()
        else:
            return None
        register_secret(value)
        return value or None


# ---------------------------------------------------------------------------- prompts


class PromptPair(BaseModel):
    """A system message and a user template with one `{data}` slot."""

    system: str
    user: str


class Prompts(BaseModel):
    """The versioned prompt file."""

    version: str
    verifier: PromptPair
    rubric_judge: PromptPair


@lru_cache(maxsize=1)
def prompts() -> Prompts:
    """The prompt templates (`prompts.yaml`, read once)."""
    return Prompts.model_validate(yaml.safe_load(PROMPTS_FILE.read_text(encoding="utf-8")))


def render(pair: PromptPair, data: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat messages: fixed rules as the system message, the data JSON-encoded as the user's.

    The data goes in as one JSON object, so nothing inside it can close its string and pose
    as rules or as the answer; the system message says it is data.
    """
    encoded = json.dumps(dict(data), ensure_ascii=False, indent=1)
    return [
        {"role": "system", "content": pair.system.strip()},
        {"role": "user", "content": pair.user.replace("{data}", encoded).strip()},
    ]


def extract_data(user_content: str) -> Any:
    """The data object of a rendered user message (the stub model reads it this way)."""
    _, marker, rest = user_content.partition(DATA_MARKER)
    if not marker:
        raise ValueError("no data block")
    return json.loads(rest)


# ---------------------------------------------------------------------------- parsing (pure)


def parse_envelope(body: bytes, *, max_bytes: int) -> str:
    """The one choice's content of a chat-completions reply, or ModelError."""
    if len(body) > max_bytes:
        raise ModelError(f"reply larger than {max_bytes} bytes")
    try:
        data = jsonbounds.loads(body, max_bytes=None)  # bounded nesting; size checked above
    except (ValueError, UnicodeDecodeError):
        raise ModelError("reply is not JSON") from None
    if not isinstance(data, dict):
        raise ModelError("reply is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ModelError("reply must hold exactly one choice")
    choice = choices[0]
    finish = choice.get("finish_reason")
    if finish not in (None, "stop"):
        raise ModelError(f"the answer did not finish normally ({str(finish)[:40]})")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError("the choice has no message")
    if message.get("tool_calls"):
        raise ModelError("the answer is a tool call, not content")
    content = message.get("content")
    if not isinstance(content, str):
        raise ModelError("the answer has no text content")
    if len(content) > MAX_CONTENT_CHARS:
        raise ModelError(f"the answer is longer than {MAX_CONTENT_CHARS} characters")
    return content


def _no_constants(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def parse_answer(content: str, answer: type[AnswerT]) -> AnswerT:
    """Exactly one JSON object fitting `answer` (strict: no prose, no extra fields), or ModelError."""
    text = content.strip()
    if not text.startswith("{") or not text.endswith("}"):
        raise ModelError("the answer is not exactly one JSON object")
    try:
        # Refuses trailing data, NaN / Infinity and nesting past the bound.
        data = jsonbounds.loads(text, max_bytes=None)
    except ValueError:
        raise ModelError("the answer is not valid JSON") from None
    if not isinstance(data, dict):
        raise ModelError("the answer is not a JSON object")
    try:
        return answer.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "answer"
        raise ModelError(f"the answer does not fit: {where}: {first.get('msg', 'invalid')}"[:300]) from None


def finite(value: float) -> float:
    """Refuse NaN and infinities (pydantic's float check lets them through)."""
    if not math.isfinite(value):
        raise ValueError("must be finite")
    return value


# ---------------------------------------------------------------------------- the client


class ModelClient:
    """Asks the configured model questions and returns strictly parsed answers."""

    def __init__(self, settings: ModelSettings) -> None:
        if settings.url is None:
            raise ValueError("the model client needs ESCROWD_MODEL_URL")
        self.settings = settings
        self._url = f"{settings.url}/chat/completions"
        self._key = settings.key()
        self._session: aiohttp.ClientSession | None = None
        self.calls = 0

    @property
    def model(self) -> str:
        """The model name the client asks."""
        return self.settings.name

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def ask(self, messages: Sequence[Mapping[str, str]], answer: type[AnswerT]) -> AnswerT:
        """One question; transient faults retried, anything malformed a ModelError."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.attempts),
            wait=wait_exponential(multiplier=self.settings.backoff_seconds, max=30),
            retry=retry_if_exception(lambda exc: isinstance(exc, ModelError) and exc.transient),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                content = await self._call_once(messages)
        return parse_answer(content, answer)

    async def _call_once(self, messages: Sequence[Mapping[str, str]]) -> str:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        body = {
            "model": self.settings.name,
            "messages": [dict(m) for m in messages],
            "temperature": 0,
            "response_format": {"type": "json_object"},
        }
        self.calls += 1
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_seconds)
        limit = self.settings.max_response_bytes
        try:
            async with self._session.post(self._url, json=body, headers=headers, timeout=timeout) as response:
                status = response.status
                raw = await read_bounded(response, limit)
        except TimeoutError:
            raise ModelError(f"no answer within {self.settings.timeout_seconds:g} s", transient=True) from None
        except aiohttp.ClientError as exc:
            raise ModelError(f"model unreachable: {type(exc).__name__}", transient=True) from None
        if status == 429 or status >= 500:
            log.warning("model_call_failed", status=status)
            raise ModelError(f"model answered HTTP {status}", transient=True)
        if status != 200:
            raise ModelError(f"model answered HTTP {status}")
        if raw is None:
            raise ModelError(f"reply larger than {limit} bytes")
        return parse_envelope(raw, max_bytes=limit)

"""Settings of the panel service (`ESCROWD_*` over the configuration file's `panels:` section)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from panels import rules
from runtime.config_file import key_or_file
from runtime.settings import ConsumerSettings, one_key_source
from schemas import jsonbounds
from schemas.panels import Address, OperatorId

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096
MAX_ALLOWLIST_BYTES = 8 * 1024 * 1024
MAX_ALLOWLIST_ENTRIES = 100_000


class AllowlistEntry(BaseModel):
    """One admitted address (a verifier, or a party whose operator must be excluded) and the
    operator identity the deployment vouches for."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    address: Address
    operator: OperatorId


_ENTRIES = TypeAdapter(Annotated[list[AllowlistEntry], Field(max_length=MAX_ALLOWLIST_ENTRIES)])


class PanelSettings(ConsumerSettings):
    """What `escrowd consume panels` needs. The secret and the key are never logged."""

    panel_secret_file: Path = Field(description="File holding the draw and sampling secret (at least 16 bytes)")
    panel_secret_version: str = Field(
        default="1", max_length=64, description="Recorded with every round, so audits know which secret drew it"
    )
    panel_signing_key: SecretStr | None = Field(
        default=None, description="0x hex secp256k1 key that signs rulings for the relayer"
    )
    panel_signing_key_file: Path | None = Field(
        default=None, description="File holding that key (a mounted secret), instead of panel_signing_key"
    )
    panel_attestation_seconds: int = Field(
        default=3600, ge=1, le=7 * 86_400, description="Attestation deadline after the draw"
    )
    panel_fee_units: int = Field(default=50_000, ge=0, description="Per weighted attestation, in token units")
    panel_min_confidence: float = Field(
        default=rules.MIN_CONFIDENCE_PPM / rules.PPM, ge=0, le=1, allow_inf_nan=False,
        description="Below this confidence an attestation is a decline: no weight, fee or calibration move",
    )
    panel_operator_cap: float = Field(
        default=rules.OPERATOR_WEIGHT_CAP_PPM / rules.PPM, gt=0, le=1, allow_inf_nan=False,
        description="Most draw weight all verifiers of one operator identity carry together",
    )
    panel_admission: Literal["open", "allowlist"] = Field(
        default="open",
        description="open: every registered verifier under its declared operator; allowlist: only the"
        " addresses of panel_allowlist_file, under the operator it names (docs/panels.md)",
    )
    panel_allowlist_file: Path | None = Field(
        default=None, description='JSON [{"address", "operator"}]: admitted verifiers and parties\' operators'
    )
    panel_idle_interval: float = Field(default=1.0, gt=0, le=60, description="Seconds between deadline sweeps")

    @model_validator(mode="after")
    def _one_key(self) -> PanelSettings:
        one_key_source(("panel_signing_key", self.panel_signing_key), ("panel_signing_key_file", self.panel_signing_key_file))
        if rules.to_ppm(self.panel_operator_cap) < 1:
            raise ValueError("panel_operator_cap must be at least 0.000001")
        if self.panel_admission == "allowlist" and self.panel_allowlist_file is None:
            raise ValueError("panel_admission allowlist needs panel_allowlist_file")
        return self

    def read_allowlist(self) -> dict[str, str]:
        """The allow-list (address lower case → operator), empty when none is set; ValueError
        naming the file's problem (never a value from it)."""
        if self.panel_allowlist_file is None:
            return {}
        with self.panel_allowlist_file.open("rb") as handle:
            raw = handle.read(MAX_ALLOWLIST_BYTES + 1)
        try:
            data = jsonbounds.loads(raw, max_bytes=MAX_ALLOWLIST_BYTES)
            entries = _ENTRIES.validate_python(data)
        except (ValueError, ValidationError):
            raise ValueError("panel_allowlist_file must hold a JSON list of {address, operator}") from None
        listed: dict[str, str] = {}
        for entry in entries:
            if listed.setdefault(entry.address.lower(), entry.operator) != entry.operator:
                raise ValueError("panel_allowlist_file names one address under two operators")
        return listed

    def signing_key(self) -> str:
        """The ruling key's 0x hex (from the file, whitespace removed); ValueError without echoing it."""
        return key_or_file(self.panel_signing_key, self.panel_signing_key_file, "panel_signing_key_file")

    def read_secret(self) -> bytes:
        """The secret's bytes (surrounding whitespace removed); ValueError without echoing it."""
        with self.panel_secret_file.open("rb") as handle:
            raw = handle.read(MAX_SECRET_BYTES + 1).strip()
        if not MIN_SECRET_BYTES <= len(raw) <= MAX_SECRET_BYTES:
            raise ValueError(f"the panel secret must hold {MIN_SECRET_BYTES}–{MAX_SECRET_BYTES} bytes")
        return raw


PANELS_SECTION = "panels"
"""Section of the configuration file read by `escrowd consume panels`."""


def load_panel_settings(config_file: Path | None = None, **overrides: Any) -> PanelSettings:
    """The settings of `escrowd consume panels`: `ESCROWD_*` over the file's `panels:` section."""
    from runtime.config_file import load

    return load(PanelSettings, PANELS_SECTION, config_file, **overrides)

"""Settings of `escrowd relay`, parsed once at the entry point and passed down explicitly.

Sources, highest first: keyword arguments, environment variables with the prefix
`ESCROWD_`, the configuration file (`--config` or `ESCROWD_CONFIG`, YAML or JSON: the
`relayer:` section, then shared top-level keys; `${VAR}` expanded), and the defaults below. Keys and passwords belong in the environment or in files mounted as
secrets, never in the configuration file.

`chains` has the same shape as the indexer's, so one `ESCROWD_CHAINS` value can serve both;
fields the relayer does not use are ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from chain.fees import GWEI, NODE_MIN_BUMP_BPS, FeePolicy
from chain.signers import SignerSpec
from runtime.config_file import load as config_file_load
from runtime.settings import ChainEndpoints, PostgresUrl, ServiceSettings, secrets_required
from schemas.topics import DEAD_LETTERS, VERDICTS
from schemas.verdict import checksum_address


class ChainSettings(ChainEndpoints):
    """One chain the relayer sends verdicts to."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    confirmations: int = Field(
        default=1, ge=0, description="Blocks (including its own) before a verdict tx counts as confirmed; 0 = 1"
    )

    @property
    def depth(self) -> int:
        """Confirmation depth with 0 read as 1 (mined)."""
        return max(1, self.confirmations)


class RelayerSettings(ServiceSettings):
    """Everything `escrowd relay` needs."""

    model_config = SettingsConfigDict(frozen=True)

    database_url: PostgresUrl = Field(description="PostgreSQL URL")
    kafka_bootstrap: str = Field(description="Kafka bootstrap servers")
    chains: list[ChainSettings] = Field(min_length=1, description="Chains to send to")
    verdicts_topic: str = Field(default=VERDICTS, description="Topic of signed verdicts")
    dlq_topic: str = Field(default=DEAD_LETTERS, description="Dead-letter topic")
    relayer_consumer_group: str = Field(
        default="settlement-relayer", description="Consumer name: inbox, offsets and (in group mode) Kafka group"
    )
    relayer_consumer_assignment: Literal["direct", "group"] = Field(
        default="direct",
        description=(
            "direct: one leader (advisory lock) assigns itself every partition and keeps its offsets in"
            " PostgreSQL with the verdicts (no group join on restart); group: a Kafka consumer group"
        ),
    )
    relayer_kafka_session_timeout_ms: int = Field(default=10_000, ge=1000, description="Group mode only")
    relayer_consumer_max_records: int = Field(
        default=500, ge=1, description="Verdicts per consumer transaction at most"
    )
    relayer_consumer_commit_verdicts: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Verdicts per consumer transaction within one fetch (unset: the whole fetch): each commit"
            " wakes the sender, so a smaller one starts signing sooner and a whole fetch sends a burst in"
            " fewer rounds and transactions (measured in docs/performance.md)"
        ),
    )
    relayer_consumer_fetch_max_wait_ms: int = Field(
        default=20,
        ge=1,
        le=500,
        description=(
            "Longest a Kafka fetch waits for new verdicts; the broker may answer a fetch only at this"
            " bound, so it is also the worst added latency (aiokafka's default is 500)"
        ),
    )

    relayer_signer: SignerSpec = Field(
        default_factory=SignerSpec,
        description=(
            "Who holds the marketplace verifier key: kind keystore (relayer_keystore or relayer_key),"
            " aws-kms (kms_key_id, kms_region, kms_endpoint_url) or remote (remote_url, address)"
        ),
    )
    relayer_key: SecretStr | None = Field(default=None, description="Raw 0x key (devnet only)")
    relayer_keystore: Path | None = Field(default=None, description="Encrypted keystore file")
    relayer_keystore_password: SecretStr | None = Field(default=None, description="Keystore password")
    relayer_keystore_password_file: Path | None = Field(default=None, description="File holding the password")
    relayer_trusted_signers: Annotated[list[str], NoDecode] = Field(
        min_length=1, description="Verification-service signer addresses (JSON list or comma-separated)"
    )

    relayer_fee_cap_wei: int = Field(default=500 * GWEI, gt=0, description="max_fee_per_gas never above this")
    relayer_min_priority_fee_wei: int = Field(default=1, ge=0)
    relayer_max_priority_fee_wei: int = Field(default=50 * GWEI, ge=0)
    relayer_base_fee_multiplier_bps: int = Field(default=20_000, ge=10_000)
    relayer_fee_bump_bps: int = Field(default=1_250, ge=NODE_MIN_BUMP_BPS, description="Replacement bump")
    relayer_gas_limit: int = Field(default=400_000, ge=21_000, description="Gas limit of a verdict tx")

    relayer_max_in_flight: int = Field(default=512, ge=1, description="Unmined transactions at most")
    relayer_batch_size: int = Field(default=512, ge=1, description="Verdicts signed per round")
    relayer_broadcast_concurrency: int = Field(default=16, ge=1, le=256)
    relayer_settle_batch_size: int = Field(
        default=100,
        ge=0,
        le=256,
        description=(
            "Verdicts per completeVerificationBatch transaction when a round is deep enough; 0 or 1:"
            " one completeVerification per verdict (measured in docs/relayer.md)"
        ),
    )
    relayer_settle_batch_min: int = Field(
        default=2, ge=2, description="Verdicts ready in one dispatch round before they are packed"
    )
    relayer_preflight_simulation: bool = Field(
        default=True, description="eth_call each verdict first: a refusal then costs no nonce"
    )
    relayer_poll_interval: float = Field(default=5.0, gt=0, description="Health / key-match check period")
    relayer_indexer_stale_seconds: float = Field(
        default=60.0,
        gt=0,
        description="/health/bridge fails when the indexer is behind the head and its cursor has not moved this long",
    )
    relayer_replace_after_seconds: float = Field(
        default=30.0, gt=0, description="An unmined tx with no chain progress this long is replaced"
    )
    relayer_revert_reason_patience_seconds: float = Field(
        default=300.0, ge=0, description="How long a reverted verdict waits for the node to trace why before it is recorded without the reason"
    )
    relayer_track_interval: float = Field(
        default=0.02, ge=0, description="Least seconds between two receipt rounds (coalesces fast blocks)"
    )
    relayer_reorg_watch_blocks: int = Field(
        default=64, ge=1, description="Blocks a confirmed tx is still watched for reorgs"
    )
    relayer_evidence_wait_seconds: float = Field(
        default=3600.0, gt=0, description="How long a verdict may wait for its attempt to be indexed"
    )
    relayer_host: str = Field(default="127.0.0.1", description="Bind address of /health/bridge and /metrics")
    relayer_port: int | None = Field(default=9465, ge=0, le=65535, description="Port; none disables")
    log_json: bool = Field(default=True, description="JSON log lines (false: console)")
    relayer_fault_injection: str | None = Field(
        default=None, description="Tests only: 'point:probability,...' kill -9 at named crash points"
    )

    @field_validator("relayer_trusted_signers", mode="before")
    @classmethod
    def _split_signers(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("relayer_trusted_signers")
    @classmethod
    def _checksum_signers(cls, values: list[str]) -> list[str]:
        return [checksum_address(v) for v in values]

    @model_validator(mode="after")
    def _one_key_source(self) -> RelayerSettings:
        if self.relayer_key is not None and self.relayer_keystore is not None:
            raise ValueError("set relayer_keystore or relayer_key, not both")
        keystore_kind = self.relayer_signer.kind == "keystore"
        if keystore_kind and self.relayer_key is None and self.relayer_keystore is None and secrets_required():
            raise ValueError("no relayer key: set relayer_keystore (+ password) or relayer_key")
        if not keystore_kind and (self.relayer_key is not None or self.relayer_keystore is not None):
            raise ValueError(f"relayer_signer is {self.relayer_signer.kind}: a key in this process is not used, remove it")
        if self.relayer_min_priority_fee_wei > self.relayer_max_priority_fee_wei:
            raise ValueError("relayer_min_priority_fee_wei exceeds relayer_max_priority_fee_wei")
        ids = [c.chain_id for c in self.chains]
        if len(set(ids)) != len(ids):
            raise ValueError("each chain_id may appear once in chains")
        return self

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> RelayerSettings:
        """Read the settings (`runtime.config_file`): keyword arguments, then `ESCROWD_*`,
        then the file's `relayer:` section and shared top-level keys; `config_file`
        defaults to `$ESCROWD_CONFIG` when set."""
        return config_file_load(cls, "relayer", config_file, **overrides)

    def fee_policy(self) -> FeePolicy:
        """The fee policy these settings describe."""
        return FeePolicy(
            fee_cap=self.relayer_fee_cap_wei,
            min_priority_fee=self.relayer_min_priority_fee_wei,
            max_priority_fee=self.relayer_max_priority_fee_wei,
            base_fee_multiplier_bps=self.relayer_base_fee_multiplier_bps,
            bump_bps=self.relayer_fee_bump_bps,
        )

"""The API server's settings (`ESCROWD_*` environment variables), parsed once at start-up."""

from __future__ import annotations

from typing import Any

from eth_utils.address import is_address, to_checksum_address
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from runtime.settings import PostgresUrl, ServiceSettings
from schemas import topics
from schemas.request_auth import Deployment


class DeploymentSetting(BaseModel):
    """One escrow on one chain this API serves (a request signature is bound to it)."""

    model_config = ConfigDict(extra="forbid")

    chain_id: int = Field(gt=0, le=2**63 - 1)
    escrow: str = Field(pattern=r"^0x[0-9a-fA-F]{40}$")


class ApiSettings(ServiceSettings):
    """Everything `escrowd api serve` needs."""

    database_url: PostgresUrl = Field(description="PostgreSQL URL")
    kafka_bootstrap: str | None = Field(
        default=None, description="Kafka bootstrap servers; with it the API runs a (standby) outbox publisher"
    )
    api_host: str = Field(default="127.0.0.1", description="Address the API listens on")
    api_port: int = Field(default=8080, ge=0, le=65535, description="Port the API listens on")
    verification_requests_topic: str = Field(
        default=topics.VERIFICATION_REQUESTS, description="Topic finalize / review / report requests go to"
    )
    api_run_publisher: bool = Field(
        default=True, description="Run an outbox publisher in the API process when kafka_bootstrap is set"
    )
    evidence_wait_seconds: float = Field(
        default=10.0, ge=0, description="How long finalize waits for the agent's submitEvidence to be indexed"
    )
    finalize_wait_seconds: float = Field(
        default=5.0, ge=0, description="How long finalize waits for the auto-check verdict before answering 202"
    )
    signature_max_ttl_seconds: int = Field(
        default=900, ge=10, description="Latest X-Escrowd-Expires-At accepted, in seconds from now"
    )
    deployments: list[DeploymentSetting] = Field(
        default_factory=list,
        description="The escrows (chain_id, escrow) this API serves; request signatures are bound to one of them."
        " Empty: the escrows of bridge_chains",
    )
    api_service_key: SecretStr | None = Field(
        default=None,
        description="0x key the API signs the requests it relays to the verification consumer with"
        " (not the verdict-signing key); without it the consumer verifies the requester's signature only",
    )
    marketplace_verifier_address: str | None = Field(
        default=None, description="The marketplace verifier address: it may never finalize as an agent"
    )
    plugin_packages: list[str] = Field(
        default_factory=list, description="Packages plugin verifiers may come from (checked at registration)"
    )
    endpoint_hosts: list[str] = Field(
        default_factory=list, description="Hosts endpoint verifiers may be on (checked at registration)"
    )
    api_max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Largest request body accepted; larger ones get 413 before they are read",
    )
    executions_limit: int = Field(default=200, ge=1, le=10_000, description="Most executions one list returns")
    db_pool_size: int = Field(default=8, ge=1, description="Database connections of the API")
    bridge_arbiter_address: str | None = Field(
        default=None,
        description="The address that sends panel rulings; /health/bridge then reports arbiterMatches",
    )
    bridge_chains: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Chains /health/bridge must have a relayer report for (the indexer's `chains` shape:"
        " chain_id, rpc_urls, escrow_addresses)",
    )

    @field_validator("marketplace_verifier_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not is_address(value):
            raise ValueError("marketplace_verifier_address is not an address")
        return str(to_checksum_address(value))

    def served_deployments(self) -> list[Deployment]:
        """The deployments of this API, in configuration order (the first is its home)."""
        if self.deployments:
            return [Deployment(d.chain_id, d.escrow) for d in self.deployments]
        out: list[Deployment] = []
        for chain in self.bridge_chains:
            for escrow in chain.get("escrow_addresses") or []:
                out.append(Deployment(int(chain["chain_id"]), str(escrow)))
        return out

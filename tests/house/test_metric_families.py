"""Every metric family an alert or a dashboard reads exists from the start, so every alert can fire the first time.

Observation 2 of the operations issue: counters used by alerts had no series until their
first increment, so `increase(x[5m]) > 0` read nothing at the first forged verdict and fired
only at the second. Each long-running process is started here on a fresh deployment (no
traffic at all), its `/metrics` scraped, and every family named in `grafana/alerts/` and
`grafana/dashboards/` must have at least one sample in some process.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

from eth_account import Account

from escrowd.devnet import Devnet, anvil_key
from escrowd.harness import chain_config, write_config
from runtime.services.kafka import KafkaService
from runtime.services.ports import free_port
from tests.house.test_service_signals import Service, _get, empty_database  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"\bescrowd_[a-z0-9_]+")
_HISTOGRAM_PARTS = ("_bucket", "_count", "_sum", "_created")


def used_families() -> set[str]:
    """Metric families the alert rules and the dashboards query."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in [*ROOT.glob("grafana/alerts/*.yml"), *ROOT.glob("grafana/dashboards/*.json")])
    names = set()
    for name in _NAME.findall(text):
        for part in _HISTOGRAM_PARTS:
            if name.endswith(part):
                name = name.removesuffix(part)
                break
        names.add(name)
    return names


def gauges(exposition: str) -> set[str]:
    """Families the exposition declares as gauges (set by their loops, not created at 0)."""
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ") and line.split()[3] == "gauge"}


def present_families(exposition: str) -> set[str]:
    """Families with at least one sample (a labelled family with no child has none)."""
    families = set()
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for part in (*_HISTOGRAM_PARTS, "_total"):
            if name.endswith(part) and part != "_total":
                name = name.removesuffix(part)
                break
        families.add(name)
    return families


def test_used_families_are_found_in_the_rules() -> None:
    """The scan itself finds what the rules use (a scan that finds nothing proves nothing)."""
    used = used_families()
    assert "escrowd_relayer_signature_rejections_total" in used
    assert "escrowd_relayer_verdict_confirmation_seconds" in used
    assert len(used) > 40


def test_every_family_an_alert_or_dashboard_uses_exists_at_start(
    devnet: Devnet, empty_database: str, kafka_service: KafkaService, tmp_path: Path  # noqa: F811
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    base = {"ESCROWD_DATABASE_URL": empty_database, "ESCROWD_KAFKA_BOOTSTRAP": kafka_service.bootstrap,
            "ESCROWD_EVENTS_TOPIC": f"{prefix}.events", "ESCROWD_DEAD_LETTER_TOPIC": f"{prefix}.dlq"}  # fmt: skip
    signer_key = "0x" + "4c" * 32
    secret = tmp_path / "panel-secret"
    secret.write_bytes(b"p" * 32)
    relayer_chains = json.dumps([{"chain_id": devnet.chain_id, "rpc_urls": [devnet.rpc_url], "escrow_addresses": [devnet.escrow_address],
                                  "confirmations": 0, "poll_interval": 0.2, "rpc_timeout": 3.0}])  # fmt: skip
    config = write_config(
        tmp_path / "indexer.yaml", database_url=empty_database, kafka_bootstrap=kafka_service.bootstrap,
        topic=f"{prefix}.events", chains=[chain_config(devnet)],
    )  # fmt: skip
    ports = {name: free_port() for name in ("indexer", "relayer", "rulings", "verification", "lifecycle", "reputation", "panels", "api",
                                            "verifier_agent")}  # fmt: skip
    specs: dict[str, tuple[list[str], dict[str, str]]] = {
        "indexer": (["index", "run", "--config", str(config)], {"ESCROWD_METRICS_PORT": str(ports["indexer"]),
                                                                 "ESCROWD_FINALIZED_TOPIC": f"{prefix}.finalized"}),
        "relayer": (["relay", "run"], {
            "ESCROWD_CHAINS": relayer_chains, "ESCROWD_RELAYER_KEY": devnet.marketplace_verifier.private_key,
            "ESCROWD_RELAYER_PORT": str(ports["relayer"]), "ESCROWD_RELAYER_TRUSTED_SIGNERS": Account.from_key(signer_key).address,
            "ESCROWD_VERDICTS_TOPIC": f"{prefix}.verdicts",
        }),
        "rulings": (["relay", "rulings"], {
            "ESCROWD_RULING_CHAIN_ID": str(devnet.chain_id), "ESCROWD_RULING_RPC_URL": devnet.rpc_url,
            "ESCROWD_RULING_ESCROW": devnet.escrow_address, "ESCROWD_RULING_ARBITER_KEY": devnet.arbiter.private_key,
            "ESCROWD_RULING_TRUSTED_SIGNERS": f'["{Account.from_key(anvil_key(8)[1]).address}"]',
            "ESCROWD_PANEL_RULINGS_TOPIC": f"{prefix}.rulings", "ESCROWD_METRICS_PORT": str(ports["rulings"]),
        }),
        "verification": (["consume", "verification", "run"], {
            "ESCROWD_VERIFICATION_SIGNING_KEY": signer_key, "ESCROWD_VERIFICATION_GROUP": f"{prefix}.verification",
            "ESCROWD_VERIFICATION_REQUESTS_TOPIC": f"{prefix}.requests", "ESCROWD_VERDICTS_TOPIC": f"{prefix}.verdicts",
            "ESCROWD_METRICS_PORT": str(ports["verification"]),
        }),
        "lifecycle": (["consume", "lifecycle"], {"ESCROWD_METRICS_PORT": str(ports["lifecycle"]),
                                                 "ESCROWD_TASKS_TOPIC": f"{prefix}.tasks", "ESCROWD_TIMERS_TOPIC": f"{prefix}.timers"}),
        "reputation": (["consume", "reputation"], {"ESCROWD_METRICS_PORT": str(ports["reputation"]),
                                                   "ESCROWD_REPUTATION_TOPIC": f"{prefix}.reputation"}),
        "panels": (["consume", "panels"], {"ESCROWD_METRICS_PORT": str(ports["panels"]), "ESCROWD_PANEL_SECRET_FILE": str(secret),
                                           "ESCROWD_PANEL_SIGNING_KEY": anvil_key(8)[1]}),
        "api": (["api", "serve", "--port", str(ports["api"])], {
            "ESCROWD_DEPLOYMENTS": json.dumps([{"chain_id": devnet.chain_id, "escrow": devnet.escrow_address}])}),
        # Ready once a poll reached the chain, the API and its queue; no model call without work.
        "verifier_agent": (["verifier-agent"], {
            "ESCROWD_VERIFIER_API_URL": f"http://127.0.0.1:{ports['api']}", "ESCROWD_VERIFIER_RPC_URL": devnet.rpc_url,
            "ESCROWD_VERIFIER_CHAIN_ID": str(devnet.chain_id), "ESCROWD_VERIFIER_ESCROW_ADDRESS": devnet.escrow_address,
            "ESCROWD_VERIFIER_WALLET_KEY": devnet.verifier_agents[0].private_key, "ESCROWD_VERIFIER_POLL_SECONDS": "0.5",
            "ESCROWD_MODEL_URL": "http://127.0.0.1:9/v1", "ESCROWD_VERIFIER_METRICS_PORT": str(ports["verifier_agent"]),
        }),
    }  # fmt: skip
    services: dict[str, Service] = {}
    scraped: dict[str, set[str]] = {}
    declared_gauges: set[str] = set()
    try:
        for name, (argv, extra) in specs.items():
            services[name] = Service(argv, {**base, **extra}, tmp_path)
        for name, service in services.items():
            url = f"http://127.0.0.1:{ports[name]}"
            service.wait_for(lambda url=url: _get(url + "/readyz")[0] == 200, f"{name} ready")
            status, body = _get(url + "/metrics")
            assert status == 200, (name, body[:500])
            scraped[name] = present_families(body.decode())
            declared_gauges |= gauges(body.decode())
        # Counters and histograms: at the first scrape after ready. Gauges: once their loop
        # has run (a balance or a lag is not 0 before it is read); until the deadline.
        used = used_families()
        missing = sorted(used - declared_gauges - set().union(*scraped.values()))
        assert missing == [], f"counters/histograms with no series before the first event: {missing}"
        deadline = time.monotonic() + 120
        while (used - set().union(*scraped.values())) and time.monotonic() < deadline:
            time.sleep(1)
            for name in services:
                scraped[name] |= present_families(_get(f"http://127.0.0.1:{ports[name]}/metrics")[1].decode())
    finally:
        for service in services.values():
            service.kill()
    missing = sorted(used_families() - set().union(*scraped.values()))
    assert missing == [], f"gauges never set: {missing}"

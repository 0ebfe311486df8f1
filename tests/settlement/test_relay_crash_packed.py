"""The kill -9 campaign of `test_relay_crash.py` with packing on (the default,
`completeVerificationBatch`): 300 verdicts, 20 kills, every crash point twice."""

from __future__ import annotations

import pytest

from escrowd.devnet import Devnet
from tests.settlement.conftest import IndexerRun
from tests.settlement.test_relay_crash import kill_nine_300_verdicts_20_kills


@pytest.mark.timeout(600)
async def test_kill_nine_300_verdicts_20_kills_packed_keeps_exactly_once(
    devnet: Devnet, database_url, kafka_bootstrap, topic_prefix, indexer: IndexerRun, service_signer, tmp_path
) -> None:
    """Packed: every verdict in exactly one mined batch or transaction, no nonce gap."""
    await kill_nine_300_verdicts_20_kills(
        devnet, database_url, kafka_bootstrap, topic_prefix, indexer, service_signer, tmp_path, packed=True
    )

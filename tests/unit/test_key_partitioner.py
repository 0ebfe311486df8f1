"""The publisher's partitioner: the default partitioner's choice, each key hashed once."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from runtime.outbox import KeyPartitioner


@given(
    keys=st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=50),
    count=st.integers(1, 64),
    limit=st.integers(1, 8),
)
def test_a_key_lands_where_the_default_partitioner_puts_it(keys: list[bytes], count: int, limit: int) -> None:
    """Same partition as `DefaultPartitioner` for every key, asked again and again, also
    after the cache was cleared (a small `limit`) and with another partition count."""
    partitioner = KeyPartitioner(limit=limit)
    partitions = list(range(count))
    for key in keys + keys:
        assert partitioner(key, partitions, partitions) == DefaultPartitioner()(key, partitions, partitions)
    wider = list(range(count + 3))
    for key in keys:
        assert partitioner(key, wider, wider) == DefaultPartitioner()(key, wider, wider)


def test_keyless_messages_go_to_an_available_partition() -> None:
    """No key: one of the available partitions, as the default does."""
    partitioner = KeyPartitioner()
    assert {partitioner(None, [0, 1, 2, 3], [2]) for _ in range(20)} == {2}

"""`split_fetch`: the verdict consumer's chunks keep every record once, in the fetch's order."""

from __future__ import annotations

from aiokafka import ConsumerRecord, TopicPartition

from relayer.settlement.consumer import split_fetch


def _records(tp: TopicPartition, count: int) -> list[ConsumerRecord[bytes, bytes]]:
    return [
        ConsumerRecord(
            topic=tp.topic, partition=tp.partition, offset=i, timestamp=0, timestamp_type=0, key=None,
            value=b"v", checksum=None, serialized_key_size=0, serialized_value_size=1, headers=(),
        )
        for i in range(count)
    ]


def test_chunks_keep_every_record_once_in_order_and_never_exceed_the_size() -> None:
    a, b, c = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
    fetch = {a: _records(a, 7), b: _records(b, 2), c: _records(c, 5)}
    chunks = split_fetch(fetch, 4)
    assert [sum(len(r) for r in chunk.values()) for chunk in chunks] == [4, 4, 4, 2]
    flat = [(tp, rec.offset) for chunk in chunks for tp, records in chunk.items() for rec in records]
    assert flat == [(tp, rec.offset) for tp, records in fetch.items() for rec in records]
    # A partition's records within a chunk are contiguous: its committed offset is its last + 1.
    assert chunks[1] == {a: fetch[a][4:7], b: fetch[b][:1]}


def test_a_fetch_smaller_than_the_size_is_one_chunk() -> None:
    a = TopicPartition("t", 0)
    fetch = {a: _records(a, 3)}
    assert split_fetch(fetch, 50) == [fetch]

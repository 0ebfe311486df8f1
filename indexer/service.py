"""The indexer: follows each chain's escrow events into PostgreSQL and the outbox.

Per chain, one loop:

* **start-up**: load the cursor; if the block it names is no longer canonical (a reorg
  happened while we were down), repair first;
* **backfill**: while the cursor is deeper than `finality_depth` below the head, fetch
  `eth_getLogs` over adaptive ranges, several in flight, applied in block order; each range
  also fetches its first and last header so the parent link to the cursor is checked;
* **head**: near the head, fetch every header of a window and its logs in one batched round
  trip, check that headers link and that the logs belong to those headers, and store them;
* **reorg**: when the next block does not build on the cursor, walk back over the stored
  hashes to the common ancestor, delete what is past it and queue a retraction for every
  published event that disappeared (`IndexerStore.rollback_to`).

Each window is one transaction (events, outbox rows, block hashes, cursor), so a kill at
any instant loses nothing and duplicates nothing. New heads arrive by WebSocket `newHeads`
when a `ws_url` is configured, else by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
import orjson
import structlog

from chain.rpc import (
    RpcCallError,
    RpcClient,
    RpcError,
    RpcRangeTooLarge,
    RpcTransportError,
    header_reply,
    logs_reply,
)
from indexer import metrics
from indexer.config import ChainConfig
from indexer.decode import DecodedLog, DecodeError, EscrowLogDecoder
from indexer.ranges import RangeSizer, plan_ranges
from indexer.reorg import BlockRef, Inconsistent, Reorged, check_window, common_ancestor
from indexer.store import Cursor, CursorMoved, IndexerStore
from runtime.aio import wait_event
from runtime.db import connect, is_connection_error
from schemas.abi import escrow_abi

log = structlog.get_logger(__name__)

RangeFetch = tuple[list[dict[str, Any]], list[BlockRef | None], float]
"""One range's logs, the headers of its first and last block, and the fetch time."""
WindowFetch = tuple[list[dict[str, Any]], list[dict[str, Any] | None], float]
"""One head window's logs, the header of every block in it, and the fetch time."""


class ConfigMismatch(RuntimeError):
    """The RPC serves another chain than the configuration says: refuse to index it."""


class ReorgTooDeep(RuntimeError):
    """No stored block is canonical any more: the reorg is deeper than the kept history."""


class ChainIndexer:
    """Indexes one chain. `run` until `stop` is set."""

    def __init__(
        self,
        chain: ChainConfig,
        *,
        database_url: str,
        topic: str,
        rpc: RpcClient | None = None,
        finalized_stream: bool = False,
        on_commit: Callable[[int, int, Sequence[DecodedLog]], None] | None = None,
    ) -> None:
        self.chain = chain
        # Told of each committed window (chain id, last position, its events): the publisher
        # of this process sends them from memory instead of reading them back.
        self._on_commit = on_commit
        self.chain_label = str(chain.chain_id)
        self._database_url = database_url
        self.rpc = rpc or RpcClient(chain.rpc_urls, chain_id=chain.chain_id, timeout=chain.rpc_timeout)
        self.store = IndexerStore(chain.chain_id, topic, keep_blocks=chain.keep_blocks)
        self.decoder = EscrowLogDecoder(escrow_abi())
        self.sizer = RangeSizer(size=chain.initial_range, max_size=chain.max_range)
        # Head windows start at one block and grow (or shrink) with their log count.
        self.head_sizer = RangeSizer(size=1, max_size=chain.head_window)
        self.cursor: Cursor | None = None
        self.head: BlockRef | None = None
        self._wake = asyncio.Event()
        self._ahead: deque[tuple[int, int, asyncio.Task[RangeFetch]]] = deque()
        self._ahead_head: deque[tuple[int, int, asyncio.Task[WindowFetch]]] = deque()
        self._storing: asyncio.Task[None] | None = None
        self._bound = log.bind(chain_id=chain.chain_id)
        # How deep a block must be to publish its events: a count, or the head's distance to
        # the node's `safe`/`finalized` block, read at every pass (`_finality`).
        self._tag = chain.finality_tag
        self.publish_depth = chain.fixed_confirmations
        # The finalized-only stream's line (`chain_cursor.finalized_through`): from the node's
        # `finalized` tag, or the head minus `fallback_confirmations` (`_final_tag` None).
        self._final_stream = finalized_stream
        self._final_tag: str | None = "finalized"

    # -- lifecycle ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Index until `stop` is set; reconnect and retry on transient failures."""
        watcher = asyncio.create_task(self._watch_heads(stop))
        try:
            served = await self.rpc.chain_id()
            if served != self.chain.chain_id:
                raise ConfigMismatch(
                    f"chains[{self.chain.chain_id}]: the RPC serves chain id {served}, not {self.chain.chain_id}"
                )
            backoff = 0.2
            while not stop.is_set():
                conn: asyncpg.Connection | None = None
                try:
                    conn = await connect(self._database_url)
                    await self._start(conn)
                    backoff = 0.2
                    while not stop.is_set():
                        await self.sync_once(conn, stop)
                        self._wake.clear()
                        await wait_event(self._wake, self.chain.poll_interval)
                except (RpcError, DecodeError) as exc:
                    self._bound.warning("indexer_retry", error=str(exc))
                except CursorMoved as exc:
                    # Reload the stored cursor and go on from there; loud, because two
                    # indexers on one chain is a deployment mistake (one replica per chain).
                    self._bound.error("indexer_cursor_moved_by_another_writer", error=str(exc))
                except Exception as exc:
                    if not is_connection_error(exc):
                        raise
                    self._bound.warning("indexer_database_retry", error=repr(exc))
                finally:
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            await conn.close(timeout=2)
                if not stop.is_set():
                    await asyncio.sleep(backoff)
                    backoff = min(5.0, backoff * 2)
        finally:
            self._drop_ahead(self._ahead)
            self._drop_ahead(self._ahead_head)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
            await self.rpc.close()

    async def _tag_supported(self, tag: str) -> bool:
        """Does the node name `tag`? If not: one clear warning (the caller falls back to confirmations)."""
        try:
            await self.rpc.tagged_number(tag)
        except RpcCallError as exc:
            self._bound.warning(
                "finality_tag_unsupported", tag=tag, fallback_confirmations=self.chain.fallback_confirmations,
                error=str(exc),
            )  # fmt: skip
            return False
        self._bound.info("finality_tag", tag=tag)
        return True

    async def _detect_finality(self) -> None:
        """At start: the tags this chain's settings name, each checked once against the node."""
        checked = self._tag
        if self._tag is not None and not await self._tag_supported(self._tag):
            if self._tag == self._final_tag:
                self._final_tag = None
            self._tag = None
            self.publish_depth = self.chain.fallback_confirmations
        final = self._final_tag
        if self._final_stream and final is not None and final != checked and not await self._tag_supported(final):
            self._final_tag = None

    async def _tagged_depth(self, tag: str | None, head: BlockRef) -> int:
        if tag is None:
            return self.chain.fallback_confirmations
        tagged = await self.rpc.tagged_number(tag)
        # No tagged block yet: hold everything.
        return head.number + 1 if tagged is None else max(0, head.number - tagged)

    async def _finality(self, conn: asyncpg.Connection, head: BlockRef) -> None:
        """The publish depth of this pass, and the finalized-only stream's line."""
        if self._tag is not None:
            # The store's line is the cursor minus this depth: at or below the tagged block
            # whenever the cursor is at or below the head.
            self.publish_depth = await self._tagged_depth(self._tag, head)
        if self._final_stream:
            same = self._tag is not None and self._tag == self._final_tag
            depth = self.publish_depth if same else await self._tagged_depth(self._final_tag, head)
            # Only raised: a node behind another one (failover) never lowers it.
            await conn.execute(
                "UPDATE chain_cursor SET finalized_through = GREATEST(coalesce(finalized_through, -1), $2)"
                " WHERE chain_id = $1",
                self.chain.chain_id,
                head.number - depth,
            )

    async def _start(self, conn: asyncpg.Connection) -> None:
        await self._detect_finality()
        cursor = await self.store.load_cursor(conn)
        if cursor is None:
            cursor = await self._initial_cursor(conn)
        self.cursor = cursor
        # A reorg while we were down: the block under the cursor is not canonical any more.
        if cursor.number >= 0:
            (header,) = await self.rpc.headers([cursor.number])
            if header is None or header["hash"] != cursor.hash:
                self._bound.warning("reorg_detected_at_startup", cursor=cursor.number)
                await self.repair(conn)
        self._bound.info("indexer_started", cursor=self.cursor.number if self.cursor else None)

    async def _initial_cursor(self, conn: asyncpg.Connection) -> Cursor:
        number = self.chain.start_block - 1
        if number < 0:
            return Cursor(-1, "")
        (header,) = await self.rpc.headers([number])
        if header is None:
            raise RpcError(f"start block {self.chain.start_block} is beyond the chain head")
        ref = BlockRef.from_header(header)
        await self.store.append(
            conn, events=[], blocks=[ref], tip=ref, confirmations=self.publish_depth, head=None
        )
        return Cursor(ref.number, ref.hash)

    async def _watch_heads(self, stop: asyncio.Event) -> None:
        if self.chain.ws_url is None:
            return
        import websockets

        while not stop.is_set():
            try:
                async with websockets.connect(self.chain.ws_url, max_size=2**22) as ws:
                    await ws.send(
                        orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]})
                    )
                    async for _ in ws:
                        self._wake.set()
            except (OSError, websockets.WebSocketException) as exc:
                self._bound.warning("newheads_disconnected", error=str(exc))
                await asyncio.sleep(1.0)

    # -- one pass ---------------------------------------------------------------------

    async def sync_once(self, conn: asyncpg.Connection, stop: asyncio.Event | None = None) -> None:
        """Index from the cursor up to the current head (repairing reorgs on the way).

        Returns with everything it indexed committed (the last write is awaited).
        """
        try:
            await self._sync(conn, stop)
        finally:
            await self._settle()

    async def _sync(self, conn: asyncpg.Connection, stop: asyncio.Event | None) -> None:
        latest = header_reply(await self.rpc.call("eth_getBlockByNumber", "latest", False))
        if latest is None:
            raise RpcTransportError("the node has no latest block")
        head = BlockRef.from_header(latest)
        self.head = head
        await self._finality(conn, head)
        metrics.CHAIN_HEAD.labels(self.chain_label).set(head.number)
        assert self.cursor is not None
        if head.number <= self.cursor.number:
            # Same height or shorter: the tip may have been replaced under us.
            if head.number == self.cursor.number:
                replaced = head.hash != self.cursor.hash
            else:
                (header,) = await self.rpc.headers([self.cursor.number])
                replaced = header is None or header["hash"] != self.cursor.hash
            if replaced:
                await self.repair(conn)
            self._update_lag()
            return
        while self.cursor.number < head.number and not (stop is not None and stop.is_set()):
            safe_end = head.number - self.chain.finality_depth
            if self.cursor.number + 1 <= safe_end:
                progressed = await self._step_ranges(conn, safe_end)
            else:
                progressed = await self._step_head(conn, head.number)
            if not progressed:
                break
        if stop is not None and stop.is_set():
            self._drop_ahead(self._ahead)
            self._drop_ahead(self._ahead_head)
        self._update_lag()

    def _update_lag(self) -> None:
        if self.cursor is None or self.head is None:
            return
        metrics.INDEXED_BLOCK.labels(self.chain_label).set(self.cursor.number)
        metrics.LAG_BLOCKS.labels(self.chain_label).set(max(0, self.head.number - self.cursor.number))

    def _decode(self, logs: Sequence[dict[str, Any]], timestamps: dict[int, int]) -> list[DecodedLog]:
        """The window's events in chain order (block, then log index), whatever order the
        provider answered in: the log's positions follow this order, and the reorg rollback
        and the confirmation hold-back rely on block numbers never decreasing along it."""
        decoded: list[DecodedLog] = []
        for raw in logs:
            if raw.get("removed"):
                continue
            number = int(raw["blockNumber"], 16)
            try:
                event = self.decoder.decode(self.chain.chain_id, raw, timestamps.get(number))
            except DecodeError as exc:
                # Not our ABI's shape: record it loudly and keep indexing the rest.
                self._bound.error("log_not_decodable", block=number, error=str(exc))
                continue
            if event is not None:
                decoded.append(event)
        decoded.sort(key=lambda e: (e.block_number, e.log_index))
        return decoded

    async def _store(
        self, conn: asyncpg.Connection, events: list[DecodedLog], blocks: list[BlockRef], tip: BlockRef
    ) -> None:
        """Write a piece in the background: the next window is checked and decoded while
        PostgreSQL ingests and commits this one. One write in flight at a time, in order;
        `self.cursor` runs ahead of the committed cursor by at most that write (a failure
        surfaces at the next `_settle` and the run loop restarts from the stored cursor)."""
        await self._settle()
        self._storing = asyncio.create_task(self._write(conn, events, blocks, tip))
        self.cursor = Cursor(tip.number, tip.hash)

    async def _settle(self) -> None:
        """Wait for the write in flight (raising its failure)."""
        task, self._storing = self._storing, None
        if task is not None:
            await task

    async def _write(
        self, conn: asyncpg.Connection, events: list[DecodedLog], blocks: list[BlockRef], tip: BlockRef
    ) -> None:
        last = await self.store.append(
            conn, events=events, blocks=blocks, tip=tip, confirmations=self.publish_depth, head=self.head
        )
        if self._on_commit is not None:
            self._on_commit(self.chain.chain_id, last, events)
        for name, count in Counter(e.event for e in events).items():
            metrics.EVENTS.labels(self.chain_label, name).inc(count)
        if self.head is not None:
            metrics.LAG_SECONDS.labels(self.chain_label).set(max(0, self.head.timestamp - tip.timestamp))

    async def _fetch_range(self, start: int, end: int) -> RangeFetch:
        started = time.perf_counter()
        numbers = [start] if start == end else [start, end]
        replies = await self.rpc.batch_strict(
            [
                (
                    "eth_getLogs",
                    [{"address": self.chain.escrow_addresses, "fromBlock": hex(start), "toBlock": hex(end)}],
                ),
                *[("eth_getBlockByNumber", [hex(n), False]) for n in numbers],
            ],
            _window_reply,
        )
        headers = [BlockRef.from_header(h) if h is not None else None for h in replies[1:]]
        return replies[0], headers, time.perf_counter() - started

    @staticmethod
    def _drop_ahead(ahead: deque[tuple[int, int, asyncio.Task[Any]]]) -> None:
        """Forget what was fetched ahead (the cursor moved elsewhere, or a fetch failed)."""
        while ahead:
            _, _, task = ahead.popleft()
            if task.done():
                if not task.cancelled():
                    task.exception()  # retrieved: a stale failure is not worth a warning
            else:
                task.cancel()

    async def _step_ranges(self, conn: asyncpg.Connection, end: int) -> bool:
        """Backfill one range below the finality depth; False when no progress was possible.

        A pipeline, not a loop: up to `ranges_in_flight` consecutive ranges after the cursor
        are fetched (or being fetched) while the first one is checked, decoded and stored,
        so the node works on the next ranges while PostgreSQL commits this one.
        """
        assert self.cursor is not None
        first = self.cursor.number + 1
        self._drop_ahead(self._ahead_head)
        if self._ahead and self._ahead[0][0] != first:
            self._drop_ahead(self._ahead)
        metrics.RANGE_SIZE.labels(self.chain_label).set(self.sizer.size)
        after = self._ahead[-1][1] + 1 if self._ahead else first
        room = self.chain.ranges_in_flight - len(self._ahead)
        for a, b in plan_ranges(after, end, self.sizer.size, room):
            self._ahead.append((a, b, asyncio.create_task(self._fetch_range(a, b))))
        if not self._ahead:
            return False
        start, end_, task = self._ahead.popleft()
        try:
            logs, headers, seconds = await task
        except RpcRangeTooLarge:
            self._drop_ahead(self._ahead)
            self.sizer = self.sizer.shrink()
            self._bound.info("range_shrunk", size=self.sizer.size, start=start, end=end_)
            return True
        except BaseException:
            self._drop_ahead(self._ahead)
            raise
        started = time.perf_counter()
        if any(h is None for h in headers):
            self._drop_ahead(self._ahead)
            return False
        refs = [h for h in headers if h is not None]
        misplaced = _misplaced(logs, start, end_)
        if misplaced is not None:
            self._drop_ahead(self._ahead)
            self._bound.info("window_inconsistent", reason=misplaced)
            return False
        logs_by_block = _hashes_by_block(logs, {start, end_})
        outcome = check_window(self.cursor.hash or None, refs, logs_by_block)
        if isinstance(outcome, Reorged):
            self._drop_ahead(self._ahead)
            await self.repair(conn)
            return True
        if isinstance(outcome, Inconsistent):
            self._drop_ahead(self._ahead)
            self._bound.info("window_inconsistent", reason=outcome.reason)
            return False
        timestamps = {r.number: r.timestamp for r in refs}
        # Logs without `blockTimestamp` (many providers omit it): the time comes from the
        # headers of their blocks, which must be the blocks the logs claim.
        missing = sorted(
            {int(raw["blockNumber"], 16) for raw in logs if raw.get("blockTimestamp") is None} - timestamps.keys()
        )
        if missing:
            found = [BlockRef.from_header(h) for h in await self.rpc.headers(missing) if h is not None]
            checked = check_window(None, found, _hashes_by_block(logs, set(missing)))
            if len(found) != len(missing) or isinstance(checked, Inconsistent):
                self._drop_ahead(self._ahead)
                self._bound.info("window_inconsistent", reason="headers of logs without timestamps")
                return False
            timestamps.update((ref.number, ref.timestamp) for ref in found)
        events = self._decode(logs, timestamps)
        for chunk, tip in _chunks(events, refs[-1], {}, self.chain.max_events_per_commit):
            await self._store(conn, chunk, [tip], tip)
        metrics.BATCH_SECONDS.labels(self.chain_label).observe(seconds + time.perf_counter() - started)
        self.sizer = self.sizer.observe(logs=len(logs), seconds=seconds)
        return True

    async def _fetch_window(self, start: int, end: int) -> WindowFetch:
        started = time.perf_counter()
        numbers = list(range(start, end + 1))
        replies = await self.rpc.batch_strict(
            [
                (
                    "eth_getLogs",
                    [{"address": self.chain.escrow_addresses, "fromBlock": hex(start), "toBlock": hex(end)}],
                ),
                *[("eth_getBlockByNumber", [hex(n), False]) for n in numbers],
            ],
            _window_reply,
        )
        return replies[0], replies[1:], time.perf_counter() - started

    async def _step_head(self, conn: asyncpg.Connection, head_number: int) -> bool:
        """Near the head: every header of a window, checked, with its logs.

        Windows are sized by their log count (starting at one block, so the first commit
        comes quickly even on dense blocks) and, like ranges, fetched up to
        `ranges_in_flight` ahead while the current one is stored.
        """
        assert self.cursor is not None
        self._drop_ahead(self._ahead)
        first = self.cursor.number + 1
        ahead = self._ahead_head
        if ahead and ahead[0][0] != first:
            self._drop_ahead(ahead)
        after = ahead[-1][1] + 1 if ahead else first
        while len(ahead) < self.chain.ranges_in_flight and after <= head_number:
            end = min(head_number, after + self.head_sizer.size - 1)
            ahead.append((after, end, asyncio.create_task(self._fetch_window(after, end))))
            after = end + 1
        if not ahead:
            return False
        window_start, window_end, task = ahead.popleft()
        try:
            logs, headers, seconds = await task
        except RpcRangeTooLarge:
            self._drop_ahead(ahead)
            self.head_sizer = self.head_sizer.shrink()
            return True
        except BaseException:
            self._drop_ahead(ahead)
            raise
        started = time.perf_counter()
        if any(h is None for h in headers):
            self._drop_ahead(ahead)
            return False
        refs = [BlockRef.from_header(h) for h in headers if h is not None]
        misplaced = _misplaced(logs, window_start, window_end)
        if misplaced is not None:
            self._drop_ahead(ahead)
            self._bound.info("window_inconsistent", reason=misplaced)
            return False
        outcome = check_window(self.cursor.hash or None, refs, _hashes_by_block(logs, None))
        if isinstance(outcome, Reorged):
            self._drop_ahead(ahead)
            await self.repair(conn)
            return True
        if isinstance(outcome, Inconsistent):
            self._drop_ahead(ahead)
            self._bound.info("window_inconsistent", reason=outcome.reason)
            return False
        events = self._decode(logs, {r.number: r.timestamp for r in refs})
        by_number = {r.number: r for r in refs}
        stored_up_to = self.cursor.number
        for chunk, tip in _chunks(events, refs[-1], by_number, self.chain.max_events_per_commit):
            await self._store(conn, chunk, [r for r in refs if stored_up_to < r.number <= tip.number], tip)
            stored_up_to = tip.number
        metrics.BATCH_SECONDS.labels(self.chain_label).observe(seconds + time.perf_counter() - started)
        self.head_sizer = self.head_sizer.observe(logs=len(logs), seconds=seconds)
        return True

    # -- reorgs -----------------------------------------------------------------------

    async def repair(self, conn: asyncpg.Connection) -> None:
        """Walk back to the common ancestor, roll back past it, queue retractions."""
        await self._settle()
        assert self.cursor is not None
        tip = self.cursor.number
        stored = await self.store.stored_hashes(conn, tip, self.chain.keep_blocks)
        numbers = sorted(stored, reverse=True)
        ancestor: int | None = None
        for chunk_start in range(0, len(numbers), 32):
            chunk = numbers[chunk_start : chunk_start + 32]
            headers = await self.rpc.headers(chunk)
            canonical = {n: (h["hash"] if h is not None else None) for n, h in zip(chunk, headers, strict=True)}
            ancestor = common_ancestor({n: stored[n] for n in chunk}, canonical)
            if ancestor is not None:
                break
        if ancestor is None:
            raise ReorgTooDeep(
                f"chain {self.chain.chain_id}: none of the {len(stored)} stored blocks below {tip} is canonical"
            )
        ref = await self.store.block(conn, ancestor)
        assert ref is not None
        removed, retracted = await self.store.rollback_to(conn, ref)
        depth = tip - ancestor
        self.cursor = Cursor(ref.number, ref.hash)
        metrics.REORGS.labels(self.chain_label).inc()
        metrics.REORG_DEPTH.labels(self.chain_label).observe(depth)
        metrics.RETRACTIONS.labels(self.chain_label).inc(retracted)
        if depth > self.publish_depth:
            metrics.DEEP_REORGS.labels(self.chain_label).inc()
        self._bound.warning(
            "reorg_repaired", depth=depth, ancestor=ancestor, events_removed=removed, retractions=retracted
        )


def _chunks(
    events: list[DecodedLog], last: BlockRef, headers: dict[int, BlockRef], limit: int
) -> list[tuple[list[DecodedLog], BlockRef]]:
    """Split a window's events into commits of about `limit` events, at block boundaries.

    Each commit moves the cursor to the last block it holds; the hash of that block comes
    from its header when the window fetched it, else from its own logs (which the window
    already checked against the range's first and last headers). The final commit ends at
    `last`. One block's events are never split: a block is the unit of the cursor.
    """
    chunks: list[tuple[list[DecodedLog], BlockRef]] = []
    current: list[DecodedLog] = []
    for i, event in enumerate(events):
        current.append(event)
        next_block = events[i + 1].block_number if i + 1 < len(events) else None
        if len(current) >= limit and next_block is not None and next_block != event.block_number:
            tip = headers.get(event.block_number) or BlockRef(
                event.block_number, event.block_hash, "", event.block_timestamp
            )
            chunks.append((current, tip))
            current = []
    chunks.append((current, last))
    return chunks


def _misplaced(logs: Sequence[dict[str, Any]], start: int, end: int) -> str | None:
    """Why an `eth_getLogs` reply cannot be the logs of blocks `start`..`end`, or None.

    A log outside the range, or the same (block, log index) twice, would be stored at a
    position that breaks the log's block order (or fail the window on a duplicate id)."""
    seen: set[tuple[int, int]] = set()
    for raw in logs:
        try:
            number, index = int(raw["blockNumber"], 16), int(raw["logIndex"], 16)
        except (KeyError, TypeError, ValueError):
            return "a log without a hex blockNumber and logIndex"
        if not start <= number <= end:
            return f"a log of block {number} outside the range {start}..{end}"
        coordinate = (number, index)
        if coordinate in seen:
            return f"log {coordinate[1]} of block {number} twice"
        seen.add(coordinate)
    return None


def _hashes_by_block(logs: Sequence[dict[str, Any]], only: set[int] | None) -> dict[int, set[str]]:
    by_block: dict[int, set[str]] = {}
    for raw in logs:
        number = int(raw["blockNumber"], 16)
        if only is None or number in only:
            by_block.setdefault(number, set()).add(raw["blockHash"])
    return by_block


def _window_reply(replies: list[Any]) -> list[Any]:
    """A window's batch reply (logs, then headers) checked field by field before anything
    reads it: a malformed reply is a transport fault, retried on another URL."""
    return [logs_reply(replies[0]), *(header_reply(h) for h in replies[1:])]

"""Deploy and drive the escrow on a local anvil devnet (tests, demo, relayer tests).

Synchronous and fast by design: transactions go out as `eth_sendTransaction` from
impersonated accounts (anvil signs, no local signing), with an explicit gas limit so anvil
never runs a gas estimate. That matters beyond speed: an estimate executes at a different
timestamp than the block the transaction lands in, which would make time boundaries
(deadline, appeal window, escalation) untestable. A refused call is therefore mined as a
failed transaction, and its custom error is read back with `debug_traceTransaction` and
raised as `EscrowRevert(name, args)`.

Actors are derived from anvil's well-known test mnemonic; their keys are test keys only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, cast

from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode as abi_encode
from eth_account import Account
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from hexbytes import HexBytes
from web3 import HTTPProvider, Web3
from web3.exceptions import TransactionNotFound
from web3.types import RPCEndpoint, TxReceipt

from chain.abi import Codec, abi_type, devnet_codec
from schemas.task_state import TaskStatus  # re-exported: the escrow's fixed codes

ANVIL_MNEMONIC = "test test test test test test test test test test test junk"
USDC = 10**6  # one token in base units (6 decimals)
TX_GAS = 1_000_000  # above every escrow call (createTask ~150k); fixed so no estimate runs
ETH_PER_ACTOR = 10_000 * 10**18

DAY = 86_400
APPEAL_WINDOW = 3 * DAY
ESCALATION_DELAY = 14 * DAY
JUDGING_GRACE = 7 * DAY  # after the deadline, anyone may escalate unjudged work
FEE_BPS = 1_000
BPS = 10_000
MAX_REWARD = (2**256 - 1) // BPS  # the escrow refuses larger rewards (RewardTooLarge)
MAX_SUBMISSIONS = 3

# Mnemonic indexes of the fixed roles; posters, agents, verifier agents and spares follow.
_OWNER, _ARBITER, _MARKETPLACE_VERIFIER, _FEE_RECIPIENT = 0, 1, 2, 3
_FIRST_FREE_INDEX = 4


class EscrowRevert(Exception):
    """A transaction or call refused by the chain, with its decoded custom error."""

    def __init__(
        self,
        name: str,
        args: tuple[Any, ...] = (),
        *,
        tx_hash: str | None = None,
        data: str = "0x",
    ) -> None:
        super().__init__(name, args)
        self.name = name
        self.error_args = args
        self.tx_hash = tx_hash
        self.data = data

    def __str__(self) -> str:
        return f"{self.name}{self.error_args!r}" if self.error_args else f"{self.name}()"


class DevnetError(RuntimeError):
    """A devnet RPC call failed (not a contract revert)."""


@dataclass(frozen=True)
class Actor:
    """A devnet account: role name, checksum address, and its test private key (0x hex)."""

    name: str
    address: str
    private_key: str

    def __str__(self) -> str:
        return f"{self.name}({self.address})"


@cache
def anvil_key(index: int) -> tuple[str, str]:
    """(checksum address, 0x private key) of the anvil test mnemonic's account `index`."""
    Account.enable_unaudited_hdwallet_features()
    acct = Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}")
    return str(acct.address), "0x" + bytes(acct.key).hex()


def _actor(name: str, index: int) -> Actor:
    address, key = anvil_key(index)
    return Actor(name=name, address=address, private_key=key)


@dataclass(frozen=True)
class TaskView:
    """Every field of `AgentEscrow.getTask`, decoded."""

    task_id: int
    poster: str
    deadline: int
    status: TaskStatus
    attempts: int
    judged_mask: int
    disputed: bool
    agent: str
    failed_at: int
    verifier: str
    escalated_at: int
    reward: int
    task_hash: bytes
    last_evidence_hash: bytes


@dataclass(frozen=True)
class EscrowEvent:
    """One decoded escrow (or token) log."""

    name: str
    args: dict[str, Any]
    address: str
    block_number: int
    log_index: int
    tx_hash: str

    def __getitem__(self, key: str) -> Any:
        return self.args[key]


# ---------------------------------------------------------------------------- artifacts


@cache
def load_artifact(name: str) -> dict[str, Any]:
    """A compiled contract from the `schemas` package (`AgentEscrow`, `MockUSDC`)."""
    text = resources.files("schemas").joinpath("contracts", f"{name}.json").read_text()
    artifact: dict[str, Any] = json.loads(text)
    return artifact


class _Codec:
    """The one ABI codec (`chain.abi`, escrow and token, native values) as the driver uses
    it: calldata as 0x hex, errors as (name, args), logs of raw or web3-formatted receipts."""

    def __init__(self, codec: Codec) -> None:
        self._codec = codec
        self.functions = codec.functions

    def encode_call(self, fn: str, args: Sequence[Any]) -> str:
        return "0x" + self._codec.encode_call(fn, args).hex()

    def decode_error(self, data: bytes) -> tuple[str, tuple[Any, ...]]:
        error = self._codec.decode_error(data)
        return error.name, error.args

    def decode_log(self, log: dict[str, Any]) -> EscrowEvent | None:
        topics = [HexBytes(t).to_0x_hex() for t in log["topics"]]
        decoded = self._codec.decode_log(topics, HexBytes(log["data"]).to_0x_hex())
        if decoded is None:
            return None
        name, args = decoded
        return EscrowEvent(
            name=name,
            args=args,
            address=to_checksum_address(log["address"]),
            block_number=_as_int(log["blockNumber"]),
            log_index=_as_int(log["logIndex"]),
            tx_hash=HexBytes(log["transactionHash"]).to_0x_hex(),
        )


def _as_int(value: int | str) -> int:
    # web3-formatted receipts carry ints, raw JSON-RPC replies hex strings.
    return value if isinstance(value, int) else int(value, 16)


@cache
def _default_codec() -> _Codec:
    return _Codec(devnet_codec())


def _addr(who: Actor | str) -> str:
    return who.address if isinstance(who, Actor) else to_checksum_address(who)


def text_hash(text: str) -> bytes:
    """keccak256 of UTF-8 text: a convenient task or evidence hash for tests."""
    return bytes(keccak(text=text))


def split_fee(amount: int) -> tuple[int, int]:
    """(agent amount, fee) exactly as the escrow computes it: fee = floor(10%)."""
    fee = amount * FEE_BPS // BPS
    return amount - fee, fee


# ---------------------------------------------------------------------------- the devnet


@dataclass
class Devnet:
    """A deployed escrow + token on an anvil chain, with its actors and helpers."""

    w3: Web3
    chain_id: int
    rpc_url: str
    token_address: str
    escrow_address: str
    owner: Actor
    arbiter: Actor
    marketplace_verifier: Actor
    fee_recipient: Actor
    posters: list[Actor]
    agents: list[Actor]
    verifier_agents: list[Actor]
    spare: list[Actor]
    deploy_block: int = 0
    ws_url: str | None = None
    receipt_timeout: float = 30.0
    _codec: _Codec = field(default_factory=_default_codec, repr=False)
    _hash_counter: int = field(default=0, repr=False)

    # ------------------------------------------------------------------ raw RPC

    def rpc(self, method: str, *params: Any) -> Any:
        """One JSON-RPC call; raises DevnetError on an error reply."""
        reply = self.w3.provider.make_request(RPCEndpoint(method), list(params))
        if "error" in reply:
            raise DevnetError(f"{method}: {reply['error']}")
        return reply.get("result")

    @property
    def actors(self) -> list[Actor]:
        """Every actor, fixed roles first."""
        fixed = [self.owner, self.arbiter, self.marketplace_verifier, self.fee_recipient]
        return fixed + self.posters + self.agents + self.verifier_agents + self.spare

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description: endpoints, addresses, actors and their test keys."""

        def actor(a: Actor) -> dict[str, str]:
            return {"name": a.name, "address": a.address, "private_key": a.private_key}

        return {
            "rpc_url": self.rpc_url,
            "ws_url": self.ws_url,
            "chain_id": self.chain_id,
            "deploy_block": self.deploy_block,
            "contracts": {"escrow": self.escrow_address, "token": self.token_address},
            "token": {"symbol": "mUSDC", "decimals": 6},
            "actors": {
                "owner": actor(self.owner),
                "arbiter": actor(self.arbiter),
                "marketplace_verifier": actor(self.marketplace_verifier),
                "fee_recipient": actor(self.fee_recipient),
                "posters": [actor(a) for a in self.posters],
                "agents": [actor(a) for a in self.agents],
                "verifier_agents": [actor(a) for a in self.verifier_agents],
                "spare": [actor(a) for a in self.spare],
            },
            "mnemonic": ANVIL_MNEMONIC,
            "warning": "well-known anvil test keys: never use them on a real network",
        }

    # ------------------------------------------------------------------ time and blocks

    def now(self) -> int:
        """Timestamp of the latest block."""
        return int(self.rpc("eth_getBlockByNumber", "latest", False)["timestamp"], 16)

    def block_number(self) -> int:
        """Number of the latest block."""
        return int(self.rpc("eth_blockNumber"), 16)

    def set_next_timestamp(self, timestamp: int) -> None:
        """The next mined block (e.g. the next transaction's) gets exactly `timestamp`."""
        self.rpc("evm_setNextBlockTimestamp", timestamp)

    def increase_time(self, seconds: int) -> int:
        """Mine one block exactly `seconds` after the latest one; returns its timestamp.

        Uses evm_setNextBlockTimestamp rather than evm_increaseTime so the result does not
        depend on how much wall-clock time passed (anvil adds it to the offset).
        """
        target = self.now() + seconds
        self.set_next_timestamp(target)
        self.mine()
        return target

    def mine(self, blocks: int = 1, interval: int | None = None) -> None:
        """Mine `blocks` empty blocks (optionally `interval` seconds apart)."""
        params: list[Any] = [hex(blocks)]
        if interval is not None:
            params.append(hex(interval))
        self.rpc("anvil_mine", *params)

    def snapshot(self) -> str:
        """Snapshot the chain; anvil's snapshots are single-use (see `revert`)."""
        return str(self.rpc("evm_snapshot"))

    def revert(self, snapshot_id: str) -> None:
        """Return to `snapshot_id` (which is consumed: take a new snapshot to return again)."""
        if not self.rpc("evm_revert", snapshot_id):
            raise DevnetError(f"evm_revert({snapshot_id}) refused: unknown or used snapshot")

    def reorg(self, depth: int, txs: Sequence[tuple[str, int]] = ()) -> None:
        """Replace the last `depth` blocks; `txs` are (signed raw tx, block offset) pairs.

        Offset 0 is the first replaced block. The new blocks get new hashes and anvil
        announces them to `newHeads` subscribers again.
        """
        self.rpc("anvil_reorg", depth, [[raw, offset] for raw, offset in txs])

    def rollback(self, depth: int) -> None:
        """Drop the last `depth` blocks without replacement (silent for subscribers)."""
        self.rpc("anvil_rollback", depth)

    # ------------------------------------------------------------------ transactions

    def send(self, sender: Actor | str, to: str, data: str, *, value: int = 0) -> TxReceipt:
        """Send from an impersonated account; return the receipt or raise EscrowRevert."""
        tx: dict[str, str] = {
            "from": _addr(sender),
            "to": to,
            "data": data,
            "gas": hex(TX_GAS),
        }
        if value:
            tx["value"] = hex(value)
        tx_hash = str(self.rpc("eth_sendTransaction", tx))
        receipt = self.wait_for_receipt(tx_hash)
        if receipt["status"] != 1:
            raise self._revert_of(tx_hash)
        return receipt

    def wait_for_receipt(self, tx_hash: str) -> TxReceipt:
        """The receipt, polled at 1 ms (anvil automines within a few milliseconds)."""
        deadline = time.monotonic() + self.receipt_timeout
        while True:
            try:
                return self.w3.eth.get_transaction_receipt(HexBytes(tx_hash))
            except TransactionNotFound:
                if time.monotonic() > deadline:
                    raise DevnetError(f"no receipt for {tx_hash}") from None
                time.sleep(0.001)

    def _revert_of(self, tx_hash: str) -> EscrowRevert:
        trace = self.rpc("debug_traceTransaction", tx_hash, {"tracer": "callTracer"})
        output = str(trace.get("output") or "0x")
        data = bytes(HexBytes(output))
        if not data and "out of gas" in str(trace.get("error", "")).lower():
            return EscrowRevert("OutOfGas", tx_hash=tx_hash)
        name, args = self._codec.decode_error(data)
        return EscrowRevert(name, args, tx_hash=tx_hash, data=output)

    def escrow_tx(self, sender: Actor | str, fn: str, *args: Any) -> TxReceipt:
        """Call escrow function `fn` with `args` from `sender`."""
        return self.send(sender, self.escrow_address, self._codec.encode_call(fn, args))

    def token_tx(self, sender: Actor | str, fn: str, *args: Any) -> TxReceipt:
        """Call token function `fn` with `args` from `sender`."""
        return self.send(sender, self.token_address, self._codec.encode_call(fn, args))

    def sign_escrow_call(self, sender: Actor, fn: str, *args: Any, nonce: int | None = None) -> str:
        """A signed raw transaction (0x hex) calling the escrow, e.g. to replay in `reorg`."""
        if nonce is None:
            nonce = int(self.rpc("eth_getTransactionCount", sender.address, "pending"), 16)
        base_fee = int(self.rpc("eth_getBlockByNumber", "latest", False)["baseFeePerGas"], 16)
        signed = Account.sign_transaction(
            {
                "chainId": self.chain_id,
                "nonce": nonce,
                "to": self.escrow_address,
                "data": self._codec.encode_call(fn, args),
                "gas": TX_GAS,
                "maxFeePerGas": 2 * base_fee + 10**9,
                "maxPriorityFeePerGas": 10**9,
                "type": 2,
            },
            sender.private_key,
        )
        return HexBytes(signed.raw_transaction).to_0x_hex()

    # ------------------------------------------------------------------ calls and events

    def call(self, to: str, fn: str, *args: Any) -> tuple[Any, ...]:
        """eth_call a view at the latest block; a revert raises EscrowRevert."""
        reply = self.w3.provider.make_request(
            RPCEndpoint("eth_call"),
            [{"to": to, "data": self._codec.encode_call(fn, args)}, "latest"],
        )
        if "error" in reply:
            err = cast(dict[str, Any], reply["error"])
            data = err.get("data")
            if isinstance(data, str) and data.startswith("0x"):
                name, values = self._codec.decode_error(bytes(HexBytes(data)))
                raise EscrowRevert(name, values, data=data)
            raise DevnetError(f"eth_call {fn}: {err}")
        out_types = self._codec.functions[fn].output_types
        return tuple(abi_decode(out_types, HexBytes(str(reply["result"]))))

    def events(self, receipt: TxReceipt) -> list[EscrowEvent]:
        """Decoded escrow and token events of a receipt, in log order."""
        decoded = (self._codec.decode_log(cast(dict[str, Any], log)) for log in receipt["logs"])
        return [e for e in decoded if e is not None]

    def event(self, receipt: TxReceipt, name: str) -> EscrowEvent:
        """The single event `name` in a receipt (AssertionError if absent or repeated)."""
        found = [e for e in self.events(receipt) if e.name == name]
        assert len(found) == 1, f"expected one {name}, got {[e.name for e in self.events(receipt)]}"
        return found[0]

    def logs(
        self, from_block: int | None = None, to_block: int | str = "latest"
    ) -> Iterator[EscrowEvent]:
        """Every escrow event in a block range (default: since deployment)."""
        start = self.deploy_block if from_block is None else from_block
        raw = self.rpc(
            "eth_getLogs",
            {
                "address": self.escrow_address,
                "fromBlock": hex(start),
                "toBlock": to_block if isinstance(to_block, str) else hex(to_block),
            },
        )
        for log in raw:
            event = self._codec.decode_log(log)
            if event is not None:
                yield event

    # ------------------------------------------------------------------ escrow views

    def call_many(self, calls: Sequence[tuple[str, str, Sequence[Any]]]) -> list[tuple[Any, ...]]:
        """Several views, (to, fn, args) each, in one JSON-RPC batch at the latest block."""
        provider = cast(HTTPProvider, self.w3.provider)
        batch = [
            (
                RPCEndpoint("eth_call"),
                [{"to": to, "data": self._codec.encode_call(fn, args)}, "latest"],
            )
            for to, fn, args in calls
        ]
        replies = provider.make_batch_request(batch)
        if not isinstance(replies, list):
            raise DevnetError(f"batch eth_call failed: {replies.get('error')}")
        results: list[tuple[Any, ...]] = []
        for (_, fn, _), reply in zip(calls, replies, strict=True):
            if "error" in reply:
                raise DevnetError(f"eth_call {fn}: {reply['error']}")
            out_types = self._codec.functions[fn].output_types
            results.append(tuple(abi_decode(out_types, HexBytes(str(reply["result"])))))
        return results

    def get_task(self, task_id: int) -> TaskView:
        """`getTask(taskId)` decoded; EscrowRevert("TaskNotFound") for unknown ids."""
        (t,) = self.call(self.escrow_address, "getTask", task_id)
        return decode_task(task_id, t)

    def get_tasks(self, task_ids: Sequence[int]) -> list[TaskView]:
        """Several tasks in one batch (ids must exist)."""
        replies = self.call_many([(self.escrow_address, "getTask", (i,)) for i in task_ids])
        return [decode_task(i, r[0]) for i, r in zip(task_ids, replies, strict=True)]

    def balances_of(self, holders: Sequence[Actor | str]) -> list[int]:
        """Token balances of several holders in one batch."""
        replies = self.call_many([(self.token_address, "balanceOf", (_addr(h),)) for h in holders])
        return [int(r[0]) for r in replies]

    def task_count(self) -> int:
        """Number of tasks created so far (ids are 1..task_count)."""
        return int(self.call(self.escrow_address, "taskCount")[0])

    def is_judged(self, task_id: int, attempt: int) -> bool:
        """True once `attempt` of the task has a verdict."""
        return bool(self.call(self.escrow_address, "isJudged", task_id, attempt)[0])

    def verifier_of(self, task_id: int) -> str:
        """The address whose verdict the task accepts now."""
        return to_checksum_address(self.call(self.escrow_address, "verifierOf", task_id)[0])

    def current_marketplace_verifier(self) -> str:
        """The marketplace verifier address the escrow trusts now."""
        return to_checksum_address(self.call(self.escrow_address, "marketplaceVerifier")[0])

    def balance_of(self, who: Actor | str) -> int:
        """Token balance in base units."""
        return int(self.call(self.token_address, "balanceOf", _addr(who))[0])

    # ------------------------------------------------------------------ escrow transactions

    def create_task(
        self, *, sender: Actor | str, reward: int, deadline: int, task_hash: bytes | None = None,
        verifier: Actor | str | None = None,
    ) -> TxReceipt:
        """`createTask` (marketplace-verified), or `createTaskWithVerifier` judged by `verifier`."""
        h = task_hash if task_hash is not None else self._fresh_hash("task")
        if verifier is None:
            return self.escrow_tx(sender, "createTask", h, reward, deadline)
        return self.escrow_tx(sender, "createTaskWithVerifier", h, reward, deadline, _addr(verifier))

    def create_task_with_verifier(
        self, *, sender: Actor | str, verifier: Actor | str, reward: int, deadline: int, task_hash: bytes | None = None
    ) -> TxReceipt:
        """`createTaskWithVerifier` (judged by `verifier`)."""
        return self.create_task(sender=sender, reward=reward, deadline=deadline, task_hash=task_hash, verifier=verifier)

    def post_task(
        self,
        poster: Actor,
        *,
        reward: int = 10 * USDC,
        duration: int = 7 * DAY,
        verifier: Actor | str | None = None,
        task_hash: bytes | None = None,
    ) -> int:
        """Create a task `duration` seconds from now and return its id."""
        deadline = self.now() + duration
        if verifier is None:
            receipt = self.create_task(
                sender=poster, reward=reward, deadline=deadline, task_hash=task_hash
            )
        else:
            receipt = self.create_task_with_verifier(
                sender=poster,
                verifier=verifier,
                reward=reward,
                deadline=deadline,
                task_hash=task_hash,
            )
        return task_id_of(self, receipt)

    def cancel(self, task_id: int, *, sender: Actor | str) -> TxReceipt:
        """`cancel(taskId)`."""
        return self.escrow_tx(sender, "cancel", task_id)

    def accept_task(self, task_id: int, *, sender: Actor | str) -> TxReceipt:
        """`acceptTask(taskId)`."""
        return self.escrow_tx(sender, "acceptTask", task_id)

    def submit_evidence(
        self, task_id: int, evidence_hash: bytes, *, sender: Actor | str
    ) -> TxReceipt:
        """`submitEvidence(taskId, evidenceHash)`."""
        return self.escrow_tx(sender, "submitEvidence", task_id, evidence_hash)

    def complete_verification(
        self,
        task_id: int,
        attempt: int,
        evidence_hash: bytes,
        passed: bool,
        score: int = 0,
        *,
        sender: Actor | str,
    ) -> TxReceipt:
        """`completeVerification(taskId, attempt, evidenceHash, passed, score)`."""
        return self.escrow_tx(
            sender, "completeVerification", task_id, attempt, evidence_hash, passed, score
        )

    def raise_dispute(self, task_id: int, *, sender: Actor | str) -> TxReceipt:
        """`raiseDispute(taskId)`."""
        return self.escrow_tx(sender, "raiseDispute", task_id)

    def resolve_dispute(
        self, task_id: int, agent_share_bps: int, *, sender: Actor | str | None = None
    ) -> TxReceipt:
        """`resolveDispute(taskId, agentShareBps)`, from the arbiter by default."""
        return self.escrow_tx(sender or self.arbiter, "resolveDispute", task_id, agent_share_bps)

    def claim_timeout(self, task_id: int, *, sender: Actor | str) -> TxReceipt:
        """`claimTimeout(taskId)`."""
        return self.escrow_tx(sender, "claimTimeout", task_id)

    def collect_escalated(self, task_id: int, *, sender: Actor | str) -> TxReceipt:
        """`collectEscalated(taskId)`."""
        return self.escrow_tx(sender, "collectEscalated", task_id)

    def withdraw(self, to: Actor | str, *, sender: Actor | str) -> TxReceipt:
        """`withdraw(to)`: pay `sender`'s credited (undeliverable) payouts to `to`."""
        return self.escrow_tx(sender, "withdraw", _addr(to))

    def owed(self, who: Actor | str) -> int:
        """Payouts credited to `who` that the token refused to deliver."""
        return int(self.call(self.escrow_address, "owed", _addr(who))[0])

    def total_owed(self) -> int:
        """Sum of every credited payout still held by the escrow."""
        return int(self.call(self.escrow_address, "totalOwed")[0])

    def owner_set(self, function: str, address: Actor | str, *, sender: Actor | str | None = None) -> TxReceipt:
        """One of the owner's one-address calls (`setArbiter(addr)`, ...), from the owner by default."""
        return self.escrow_tx(sender or self.owner, function, _addr(address))

    def set_marketplace_verifier(self, new_verifier: Actor | str, *, sender: Actor | str | None = None) -> TxReceipt:
        """`setMarketplaceVerifier(addr)`."""
        return self.owner_set("setMarketplaceVerifier", new_verifier, sender=sender)

    def set_arbiter(self, new_arbiter: Actor | str, *, sender: Actor | str | None = None) -> TxReceipt:
        """`setArbiter(addr)`."""
        return self.owner_set("setArbiter", new_arbiter, sender=sender)

    def set_fee_recipient(self, new_recipient: Actor | str, *, sender: Actor | str | None = None) -> TxReceipt:
        """`setFeeRecipient(addr)`."""
        return self.owner_set("setFeeRecipient", new_recipient, sender=sender)

    def transfer_ownership(self, new_owner: Actor | str, *, sender: Actor | str | None = None) -> TxReceipt:
        """`transferOwnership(addr)`."""
        return self.owner_set("transferOwnership", new_owner, sender=sender)

    # ------------------------------------------------------------------ token

    def mint(self, to: Actor | str, amount: int) -> TxReceipt:
        """Mint test tokens (the mock token's mint is open to anyone)."""
        return self.token_tx(self.owner, "mint", _addr(to), amount)

    def approve_escrow(self, holder: Actor | str, amount: int = 2**256 - 1) -> TxReceipt:
        """Let the escrow pull `holder`'s tokens."""
        return self.token_tx(holder, "approve", self.escrow_address, amount)

    def _fresh_hash(self, kind: str) -> bytes:
        self._hash_counter += 1
        return text_hash(f"{kind}:{self._hash_counter}:{time.time_ns()}")


def decode_task(task_id: int, t: Sequence[Any]) -> TaskView:
    """A TaskView from the decoded `getTask` tuple."""
    return TaskView(
        task_id=task_id,
        poster=to_checksum_address(t[0]),
        deadline=t[1],
        status=TaskStatus(t[2]),
        attempts=t[3],
        judged_mask=t[4],
        disputed=t[5],
        agent=to_checksum_address(t[6]),
        failed_at=t[7],
        verifier=to_checksum_address(t[8]),
        escalated_at=t[9],
        reward=t[10],
        task_hash=bytes(t[11]),
        last_evidence_hash=bytes(t[12]),
    )


def task_id_of(devnet: Devnet, receipt: TxReceipt) -> int:
    """The task id a createTask / createTaskWithVerifier receipt announced."""
    return int(devnet.event(receipt, "TaskCreated")["taskId"])


# ---------------------------------------------------------------------------- deployment


def deploy_contract(
    rpc: Any, sender: str, bytecode: str, abi: list[dict[str, Any]], args: Sequence[Any] = ()
) -> tuple[str, int]:
    """Deploy `bytecode` with constructor `args` via `rpc(method, *params)`.

    Returns (address, block number). Used for the escrow and token, and by tests that need
    a contract of their own (e.g. a hostile token).
    """
    ctor = next((i for i in abi if i["type"] == "constructor"), None)
    types = [abi_type(p) for p in ctor["inputs"]] if ctor else []
    data = bytecode + abi_encode(types, list(args)).hex()
    tx_hash = rpc("eth_sendTransaction", {"from": sender, "data": data, "gas": hex(8_000_000)})
    receipt: dict[str, Any] | None = None
    deadline = time.monotonic() + 30
    while receipt is None:
        receipt = rpc("eth_getTransactionReceipt", tx_hash)
        if receipt is None:
            if time.monotonic() > deadline:
                raise DevnetError(f"deployment {tx_hash} not mined")
            time.sleep(0.001)
    if int(receipt["status"], 16) != 1:
        raise DevnetError(f"deployment {tx_hash} reverted")
    return to_checksum_address(receipt["contractAddress"]), int(receipt["blockNumber"], 16)


def _deploy(rpc: Any, sender: str, name: str, args: Sequence[Any]) -> tuple[str, int]:
    artifact = load_artifact(name)
    return deploy_contract(rpc, sender, artifact["bytecode"], artifact["abi"], args)


def deploy_devnet(
    rpc_url: str,
    *,
    posters: int = 3,
    agents: int = 4,
    verifier_agents: int = 2,
    spare: int = 3,
    poster_funds: int = 1_000_000 * USDC,
    ws_url: str | None = None,
) -> Devnet:
    """Deploy MockUSDC + AgentEscrow on an anvil at `rpc_url` and fund the actors.

    Every actor gets ETH for gas, and is impersonated so `eth_sendTransaction` works from
    any of them; posters get `poster_funds` tokens and an unlimited escrow allowance.
    """
    w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 30}))
    chain_id = int(w3.eth.chain_id)

    def rpc(method: str, *params: Any) -> Any:
        reply = w3.provider.make_request(RPCEndpoint(method), list(params))
        if "error" in reply:
            raise DevnetError(f"{method}: {reply['error']}")
        return reply.get("result")

    index = iter(range(_FIRST_FREE_INDEX, 10_000))
    owner = _actor("owner", _OWNER)
    arbiter = _actor("arbiter", _ARBITER)
    mv = _actor("marketplace_verifier", _MARKETPLACE_VERIFIER)
    fee = _actor("fee_recipient", _FEE_RECIPIENT)
    poster_list = [_actor(f"poster{i}", next(index)) for i in range(posters)]
    agent_list = [_actor(f"agent{i}", next(index)) for i in range(agents)]
    verifier_list = [_actor(f"verifier{i}", next(index)) for i in range(verifier_agents)]
    spare_list = [_actor(f"spare{i}", next(index)) for i in range(spare)]

    # Impersonation lets anvil sign for actors beyond its configured dev accounts.
    rpc("anvil_autoImpersonateAccount", True)
    everyone = [owner, arbiter, mv, fee, *poster_list, *agent_list, *verifier_list, *spare_list]
    for actor in everyone:
        rpc("anvil_setBalance", actor.address, hex(ETH_PER_ACTOR))

    token_address, _ = _deploy(rpc, owner.address, "MockUSDC", [])
    escrow_address, block = _deploy(
        rpc, owner.address, "AgentEscrow", [token_address, mv.address, arbiter.address, fee.address]
    )
    devnet = Devnet(
        w3=w3,
        chain_id=chain_id,
        rpc_url=rpc_url,
        token_address=token_address,
        escrow_address=escrow_address,
        owner=owner,
        arbiter=arbiter,
        marketplace_verifier=mv,
        fee_recipient=fee,
        posters=poster_list,
        agents=agent_list,
        verifier_agents=verifier_list,
        spare=spare_list,
        deploy_block=block,
        ws_url=ws_url,
    )
    for poster in poster_list:
        devnet.mint(poster, poster_funds)
        devnet.approve_escrow(poster)
    return devnet

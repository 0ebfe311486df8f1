// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// @dev The subset of ERC-20 the escrow calls. Return values are read through low-level
///      calls (see `_safeTransfer`) so tokens that return nothing are supported too.
interface IERC20Like {
    function transfer(address to, uint256 amount) external returns (bool);
    function transferFrom(address from, address to, uint256 amount) external returns (bool);
    function balanceOf(address account) external view returns (uint256);
}

/// @title AgentEscrow
/// @notice Escrow for agent work: a poster funds a task, an agent takes it and submits
///         evidence (up to 3 times, before the deadline), and a verifier's verdict pays the
///         agent 90% and the platform 10%. Failed work can be disputed; unjudged work can be
///         escalated (by the poster at the deadline, by anyone 7 days later) and collected
///         after 14 days unless the arbiter rules first. A payout the token refuses to
///         deliver is credited to its recipient, who withdraws it later: no recipient can
///         block a task.
/// @dev Status codes are part of the public interface (consumers store them): never reorder.
///      Every state change emits exactly one task event carrying the resulting `status`.
///      All time comparisons use `block.timestamp`; see docs/contract.md for the boundaries.
contract AgentEscrow {
    // ------------------------------------------------------------------ status codes
    uint8 public constant STATUS_OPEN = 0;
    uint8 public constant STATUS_ACCEPTED = 1;
    uint8 public constant STATUS_SUBMITTED = 2;
    uint8 public constant STATUS_FAILED = 3;
    uint8 public constant STATUS_COMPLETED = 4;
    uint8 public constant STATUS_DISPUTED = 5;
    uint8 public constant STATUS_ESCALATED = 6;
    uint8 public constant STATUS_REFUNDED = 7;
    uint8 public constant STATUS_CANCELLED = 8;
    uint8 public constant STATUS_RESOLVED = 9;

    // ------------------------------------------------------------------ parameters
    uint8 public constant MAX_SUBMISSIONS = 3;
    uint64 public constant APPEAL_WINDOW = 3 days;
    uint64 public constant ESCALATION_DELAY = 14 days;
    uint16 public constant FEE_BPS = 1000; // 10% of every amount paid to an agent
    uint16 public constant BPS_DENOMINATOR = 10_000;
    uint8 public constant MAX_SCORE = 100;
    /// @notice Most items one `completeVerificationBatch` accepts (a bound on calldata and gas).
    uint256 public constant MAX_BATCH = 256;
    /// @notice Gas a pushed payout's token transfer may use. A transfer that needs more (a
    ///         token whose hook lets the recipient spend without end) fails like a refused one:
    ///         the payout is credited to the recipient, who withdraws it (`withdraw` forwards
    ///         all the gas its caller gives). Plain tokens use 25-45k.
    uint256 public constant TRANSFER_GAS = 100_000;
    /// @notice Gas a push must have left before its transfer: the whole stipend for the call
    ///         (a call gets at most 63/64 of what is left), the token's cold access and the
    ///         credit when it fails. With less, the call reverts with `GasTooLow`: a transfer
    ///         never fails for the caller's lack of gas.
    uint256 public constant PUSH_GAS = TRANSFER_GAS + TRANSFER_GAS / 63 + 40_000;
    /// @notice Gas `completeVerificationBatch` must have left to start an item: its checks and
    ///         effects and two pushes at their worst. An item (and every item after it) started
    ///         with less is refused with `GasTooLow`, so no item can make the batch run out.
    uint256 public constant BATCH_ITEM_GAS = 30_000 + 2 * PUSH_GAS;
    /// @dev After the deadline the verifier has this long to judge delivered work before
    ///      anyone (not only the poster) may escalate it.
    uint64 public constant JUDGING_GRACE = 7 days;
    /// @dev The largest reward: `reward * BPS_DENOMINATOR` (the widest product of any payout,
    ///      the arbiter's split at 100%) cannot overflow, so every payout path settles.
    uint256 public constant MAX_REWARD = type(uint256).max / BPS_DENOMINATOR;

    // ------------------------------------------------------------------ storage
    /// @notice One item of `completeVerificationBatch`: the arguments of `completeVerification`.
    struct VerdictItem {
        uint256 taskId;
        uint8 attempt;
        bytes32 evidenceHash;
        bool passed;
        uint8 score;
    }

    /// @dev Packed into 6 slots. `verifier` is zero for marketplace-verified tasks.
    ///      `judgedMask` bit (n-1) is set once attempt n received a verdict.
    struct Task {
        address poster;
        uint64 deadline;
        uint8 status;
        uint8 attempts;
        uint8 judgedMask;
        bool disputed;
        address agent;
        uint64 failedAt;
        address verifier;
        uint64 escalatedAt;
        uint256 reward;
        bytes32 taskHash;
        bytes32 lastEvidenceHash;
    }

    IERC20Like public immutable token;
    address public owner;
    address public marketplaceVerifier;
    address public arbiter;
    address public feeRecipient;

    uint256 private _taskCount;
    mapping(uint256 => Task) private _tasks;

    uint256 private _lock = 1;

    /// @notice Payouts the token refused to deliver, per recipient; `withdraw` pays them.
    mapping(address => uint256) public owed;
    /// @notice Sum of `owed`: the escrow holds it on top of the rewards of live tasks.
    uint256 public totalOwed;

    // ------------------------------------------------------------------ events
    event TaskCreated(
        uint256 indexed taskId,
        address indexed poster,
        address indexed verifier,
        address token,
        uint256 reward,
        uint64 deadline,
        bytes32 taskHash,
        uint8 status
    );
    event TaskCancelled(uint256 indexed taskId, address indexed poster, uint256 refund, uint8 status);
    event TaskAccepted(uint256 indexed taskId, address indexed agent, uint8 status);
    event EvidenceSubmitted(
        uint256 indexed taskId, address indexed agent, uint8 attempt, bytes32 evidenceHash, uint8 status
    );
    event VerificationCompleted(
        uint256 indexed taskId,
        address indexed verifier,
        uint8 attempt,
        bytes32 evidenceHash,
        bool passed,
        uint8 score,
        address agent,
        uint256 agentPayout,
        uint256 fee,
        uint64 failedAt,
        uint8 status
    );
    event DisputeRaised(
        uint256 indexed taskId, address indexed by, uint8 previousStatus, uint8 attempt, uint8 status
    );
    event DisputeResolved(
        uint256 indexed taskId,
        address indexed arbiter,
        uint16 agentShareBps,
        address agent,
        uint256 agentAmount,
        uint256 fee,
        address poster,
        uint256 posterAmount,
        uint8 previousStatus,
        uint8 status
    );
    event TaskRefunded(
        uint256 indexed taskId, address indexed poster, uint256 amount, uint8 previousStatus, uint8 status
    );
    event TaskEscalated(
        uint256 indexed taskId,
        address indexed poster,
        address agent,
        uint8 attempt,
        uint64 escalatedAt,
        uint64 collectibleAt,
        uint8 status
    );
    event EscalationCollected(
        uint256 indexed taskId, address indexed agent, uint256 agentAmount, uint256 fee, uint8 status
    );
    /// @dev Emitted after a task event whose transfer to `account` the token refused;
    ///      `amount` is credited to `account` (see `withdraw`).
    event PaymentDeferred(uint256 indexed taskId, address indexed account, uint256 amount, uint8 status);
    event Withdrawn(address indexed account, address indexed to, uint256 amount);
    event MarketplaceVerifierChanged(address indexed previousVerifier, address indexed newVerifier);
    event ArbiterChanged(address indexed previousArbiter, address indexed newArbiter);
    event FeeRecipientChanged(address indexed previousRecipient, address indexed newRecipient);
    event OwnershipTransferred(address indexed previousOwner, address indexed newOwner);

    // ------------------------------------------------------------------ errors
    error TaskNotFound(uint256 taskId);
    error WrongStatus(uint8 current);
    error ZeroAddress();
    error ZeroReward();
    error RewardTooLarge(uint256 maxReward);
    error ZeroHash();
    error DeadlineInPast();
    error VerifierIsPoster();
    error NotOwner();
    error NotPoster();
    error NotAgent();
    error NotParty();
    error NotArbiter();
    error NotVerifier();
    error PosterCannotAccept();
    error VerifierCannotAccept();
    error VerifierIsWorker();
    error ArbiterIsParty();
    error EscalationNotOpen(uint64 opensAt);
    error NothingOwed();
    error DeadlinePassed();
    error DeadlineNotReached();
    error MaxSubmissionsReached();
    error WrongAttempt(uint8 expected, uint8 given);
    error EvidenceMismatch();
    error AlreadyJudged(uint8 attempt);
    error InvalidScore(uint8 score);
    error InvalidShare(uint16 agentShareBps);
    error AppealWindowClosed();
    error AppealWindowOpen(uint64 closesAt);
    error EscalationNotMature(uint64 collectibleAt);
    error Reentrancy();
    error TokenTransferFailed();
    error BatchTooLarge(uint256 maxItems);
    error GasTooLow();

    // ------------------------------------------------------------------ modifiers
    modifier nonReentrant() {
        if (_lock != 1) revert Reentrancy();
        _lock = 2;
        _;
        _lock = 1;
    }

    modifier onlyOwner() {
        if (msg.sender != owner) revert NotOwner();
        _;
    }

    constructor(address token_, address marketplaceVerifier_, address arbiter_, address feeRecipient_) {
        if (
            token_ == address(0) || marketplaceVerifier_ == address(0) || arbiter_ == address(0)
                || feeRecipient_ == address(0)
        ) revert ZeroAddress();
        token = IERC20Like(token_);
        owner = msg.sender;
        marketplaceVerifier = marketplaceVerifier_;
        arbiter = arbiter_;
        feeRecipient = feeRecipient_;
        // Emitted so an indexer learns the initial configuration from events alone.
        emit OwnershipTransferred(address(0), msg.sender);
        emit MarketplaceVerifierChanged(address(0), marketplaceVerifier_);
        emit ArbiterChanged(address(0), arbiter_);
        emit FeeRecipientChanged(address(0), feeRecipient_);
    }

    // ------------------------------------------------------------------ posting

    /// @notice Post a task judged by the marketplace verifier; pulls `reward` from the caller.
    function createTask(bytes32 taskHash, uint256 reward, uint64 deadline)
        external
        nonReentrant
        returns (uint256 taskId)
    {
        // The marketplace verifier would judge its own task (seed: a verifier never judges
        // its own work); completeVerification re-checks after a rotation.
        if (msg.sender == marketplaceVerifier) revert VerifierIsPoster();
        return _create(taskHash, reward, deadline, address(0));
    }

    /// @notice Post a task judged by a named verifier agent (not the poster).
    function createTaskWithVerifier(bytes32 taskHash, uint256 reward, uint64 deadline, address verifier)
        external
        nonReentrant
        returns (uint256 taskId)
    {
        if (verifier == address(0)) revert ZeroAddress();
        if (verifier == msg.sender) revert VerifierIsPoster();
        return _create(taskHash, reward, deadline, verifier);
    }

    function _create(bytes32 taskHash, uint256 reward, uint64 deadline, address verifier)
        private
        returns (uint256 taskId)
    {
        if (taskHash == bytes32(0)) revert ZeroHash();
        if (reward == 0) revert ZeroReward();
        if (reward > MAX_REWARD) revert RewardTooLarge(MAX_REWARD);
        if (deadline <= block.timestamp) revert DeadlineInPast();
        taskId = ++_taskCount;
        Task storage t = _tasks[taskId];
        t.poster = msg.sender;
        t.deadline = deadline;
        t.status = STATUS_OPEN;
        t.verifier = verifier;
        t.reward = reward;
        t.taskHash = taskHash;
        emit TaskCreated(taskId, msg.sender, verifier, address(token), reward, deadline, taskHash, STATUS_OPEN);
        _pull(msg.sender, reward);
    }

    /// @notice The poster withdraws an Open task and gets the reward back.
    function cancel(uint256 taskId) external nonReentrant {
        Task storage t = _task(taskId);
        if (msg.sender != t.poster) revert NotPoster();
        if (t.status != STATUS_OPEN) revert WrongStatus(t.status);
        t.status = STATUS_CANCELLED;
        uint256 amount = t.reward;
        emit TaskCancelled(taskId, msg.sender, amount, STATUS_CANCELLED);
        _send(taskId, msg.sender, amount, STATUS_CANCELLED);
    }

    // ------------------------------------------------------------------ work

    /// @notice An agent takes an Open task before its deadline.
    function acceptTask(uint256 taskId) external nonReentrant {
        Task storage t = _task(taskId);
        if (t.status != STATUS_OPEN) revert WrongStatus(t.status);
        if (msg.sender == t.poster) revert PosterCannotAccept();
        // The judge may never be the worker: the named verifier, or for marketplace tasks
        // the marketplace verifier address as it stands now.
        if (msg.sender == _judgeOf(t)) revert VerifierCannotAccept();
        if (block.timestamp >= t.deadline) revert DeadlinePassed();
        t.agent = msg.sender;
        t.status = STATUS_ACCEPTED;
        emit TaskAccepted(taskId, msg.sender, STATUS_ACCEPTED);
    }

    /// @notice The holding agent records its result's hash; attempt numbers are 1, 2, 3.
    function submitEvidence(uint256 taskId, bytes32 evidenceHash) external nonReentrant {
        Task storage t = _task(taskId);
        if (msg.sender != t.agent) revert NotAgent();
        uint8 status = t.status;
        if (status != STATUS_ACCEPTED && status != STATUS_FAILED) revert WrongStatus(status);
        if (block.timestamp >= t.deadline) revert DeadlinePassed();
        if (t.attempts >= MAX_SUBMISSIONS) revert MaxSubmissionsReached();
        if (evidenceHash == bytes32(0)) revert ZeroHash();
        uint8 attempt = t.attempts + 1;
        t.attempts = attempt;
        t.lastEvidenceHash = evidenceHash;
        t.status = STATUS_SUBMITTED;
        emit EvidenceSubmitted(taskId, msg.sender, attempt, evidenceHash, STATUS_SUBMITTED);
    }

    /// @notice The verdict on one attempt. Pass pays 90% / 10% now; fail records the time.
    /// @dev Accepted after the deadline too, as long as the task is still Submitted (not yet
    ///      escalated): a submission just before the deadline is judged after it.
    function completeVerification(uint256 taskId, uint8 attempt, bytes32 evidenceHash, bool passed, uint8 score)
        external
        nonReentrant
    {
        bytes memory refusal = _verdictRefusal(taskId, attempt, evidenceHash, score);
        if (refusal.length != 0) _rethrow(refusal);
        _settleVerdict(taskId, attempt, evidenceHash, passed, score);
    }

    /// @notice Many verdicts in one transaction. Each item is checked exactly as
    ///         `completeVerification` from the same sender would check it, on the state the
    ///         items before it left (a task named twice: the second is `AlreadyJudged`). A
    ///         settled item emits its usual `VerificationCompleted` and pays as usual; a
    ///         refused item changes nothing, emits nothing and does not stop the others.
    ///         When less than `BATCH_ITEM_GAS` is left for an item, it and the items after it
    ///         are refused with `GasTooLow` (the sender queues them again): whatever one
    ///         recipient's token costs, the batch itself never runs out of gas.
    /// @return refusals Per item, empty when it settled, else the ABI encoding of the custom
    ///         error `completeVerification` would have reverted with (e.g. `AlreadyJudged(1)`).
    function completeVerificationBatch(VerdictItem[] calldata items)
        external
        nonReentrant
        returns (bytes[] memory refusals)
    {
        if (items.length > MAX_BATCH) revert BatchTooLarge(MAX_BATCH);
        refusals = new bytes[](items.length);
        for (uint256 i = 0; i < items.length; ++i) {
            if (gasleft() < BATCH_ITEM_GAS) {
                bytes memory low = abi.encodeWithSelector(GasTooLow.selector);
                for (uint256 j = i; j < items.length; ++j) {
                    refusals[j] = low;
                }
                break;
            }
            VerdictItem calldata v = items[i];
            bytes memory refusal = _verdictRefusal(v.taskId, v.attempt, v.evidenceHash, v.score);
            if (refusal.length != 0) {
                refusals[i] = refusal;
                continue;
            }
            _settleVerdict(v.taskId, v.attempt, v.evidenceHash, v.passed, v.score);
        }
    }

    /// @dev Why `msg.sender` may not judge this attempt now (the custom error's encoding), or
    ///      empty bytes. The order of the checks is the order of `completeVerification`'s reverts.
    function _verdictRefusal(uint256 taskId, uint8 attempt, bytes32 evidenceHash, uint8 score)
        private
        view
        returns (bytes memory)
    {
        if (taskId == 0 || taskId > _taskCount) return abi.encodeWithSelector(TaskNotFound.selector, taskId);
        Task storage t = _tasks[taskId];
        if (msg.sender != _judgeOf(t)) return abi.encodeWithSelector(NotVerifier.selector);
        if (msg.sender == t.agent) return abi.encodeWithSelector(VerifierIsWorker.selector);
        // Only reachable when the marketplace key is rotated to the poster's address.
        if (msg.sender == t.poster) return abi.encodeWithSelector(VerifierIsPoster.selector);
        if (attempt >= 1 && attempt <= MAX_SUBMISSIONS && (t.judgedMask & (uint8(1) << (attempt - 1))) != 0) {
            return abi.encodeWithSelector(AlreadyJudged.selector, attempt);
        }
        if (t.status != STATUS_SUBMITTED) return abi.encodeWithSelector(WrongStatus.selector, t.status);
        if (attempt != t.attempts) return abi.encodeWithSelector(WrongAttempt.selector, t.attempts, attempt);
        if (evidenceHash != t.lastEvidenceHash) return abi.encodeWithSelector(EvidenceMismatch.selector);
        if (score > MAX_SCORE) return abi.encodeWithSelector(InvalidScore.selector, score);
        return "";
    }

    /// @dev The effects of an accepted verdict (checked by `_verdictRefusal` just before).
    function _settleVerdict(uint256 taskId, uint8 attempt, bytes32 evidenceHash, bool passed, uint8 score) private {
        Task storage t = _tasks[taskId];
        t.judgedMask |= uint8(1) << (attempt - 1);
        address agent = t.agent;
        if (passed) {
            t.status = STATUS_COMPLETED;
            (uint256 agentAmount, uint256 fee) = _split(t.reward);
            emit VerificationCompleted(
                taskId, msg.sender, attempt, evidenceHash, true, score, agent, agentAmount, fee, 0, STATUS_COMPLETED
            );
            _payAgent(taskId, agent, agentAmount, fee, STATUS_COMPLETED);
        } else {
            uint64 nowTs = uint64(block.timestamp);
            t.status = STATUS_FAILED;
            t.failedAt = nowTs;
            emit VerificationCompleted(
                taskId, msg.sender, attempt, evidenceHash, false, score, agent, 0, 0, nowTs, STATUS_FAILED
            );
        }
    }

    /// @dev Revert with already-encoded error data (a custom error from `_verdictRefusal`).
    function _rethrow(bytes memory data) private pure {
        assembly ("memory-safe") {
            revert(add(data, 32), mload(data))
        }
    }

    // ------------------------------------------------------------------ disputes

    /// @notice Before the deadline: poster or agent, on Submitted or Failed. At or after it:
    ///         only the agent, only on Failed, while block.timestamp <= failedAt + 3 days.
    function raiseDispute(uint256 taskId) external nonReentrant {
        Task storage t = _task(taskId);
        bool isPoster = msg.sender == t.poster;
        if (!isPoster && msg.sender != t.agent) revert NotParty();
        uint8 status = t.status;
        if (status != STATUS_SUBMITTED && status != STATUS_FAILED) revert WrongStatus(status);
        if (block.timestamp >= t.deadline) {
            if (isPoster) revert DeadlinePassed();
            if (status != STATUS_FAILED) revert WrongStatus(status);
            if (block.timestamp > uint256(t.failedAt) + APPEAL_WINDOW) revert AppealWindowClosed();
        }
        t.status = STATUS_DISPUTED;
        t.disputed = true;
        emit DisputeRaised(taskId, msg.sender, status, t.attempts, STATUS_DISPUTED);
    }

    /// @notice The arbiter splits the reward of a Disputed or Escalated task. The agent's
    ///         share carries the 10% platform fee like any agent payout; the poster's share
    ///         is refunded whole.
    function resolveDispute(uint256 taskId, uint16 agentShareBps) external nonReentrant {
        Task storage t = _task(taskId);
        if (msg.sender != arbiter) revert NotArbiter();
        // A party never rules on its own dispute; the owner rotates the arbiter instead.
        if (msg.sender == t.poster || msg.sender == t.agent) revert ArbiterIsParty();
        uint8 status = t.status;
        if (status != STATUS_DISPUTED && status != STATUS_ESCALATED) revert WrongStatus(status);
        if (agentShareBps > BPS_DENOMINATOR) revert InvalidShare(agentShareBps);
        t.status = STATUS_RESOLVED;
        uint256 reward = t.reward;
        uint256 agentGross = reward * agentShareBps / BPS_DENOMINATOR;
        (uint256 agentAmount, uint256 fee) = _split(agentGross);
        uint256 posterAmount = reward - agentGross;
        address agent = t.agent;
        address poster = t.poster;
        emit DisputeResolved(
            taskId, msg.sender, agentShareBps, agent, agentAmount, fee, poster, posterAmount, status, STATUS_RESOLVED
        );
        _payAgent(taskId, agent, agentAmount, fee, STATUS_RESOLVED);
        if (posterAmount != 0) _send(taskId, poster, posterAmount, STATUS_RESOLVED);
    }

    // ------------------------------------------------------------------ timeouts

    /// @notice After the deadline (block.timestamp >= deadline) the poster either gets a full
    ///         refund (never delivered; or failed, appeal window closed) or escalates a task
    ///         that was delivered but never judged. Delivered work nobody judged may also be
    ///         escalated by anyone (the agent, a keeper) from deadline + 7 days, so the
    ///         14-day path to payment never depends on the poster.
    function claimTimeout(uint256 taskId) external nonReentrant {
        Task storage t = _task(taskId);
        uint8 status = t.status;
        bool isPoster = msg.sender == t.poster;
        if (!isPoster && status != STATUS_SUBMITTED) revert NotPoster();
        if (status > STATUS_FAILED) revert WrongStatus(status);
        if (block.timestamp < t.deadline) revert DeadlineNotReached();
        if (status == STATUS_SUBMITTED) {
            if (!isPoster) {
                uint64 opensAt = t.deadline + JUDGING_GRACE;
                if (block.timestamp < opensAt) revert EscalationNotOpen(opensAt);
            }
            uint64 nowTs = uint64(block.timestamp);
            t.status = STATUS_ESCALATED;
            t.escalatedAt = nowTs;
            emit TaskEscalated(
                taskId, t.poster, t.agent, t.attempts, nowTs, nowTs + ESCALATION_DELAY, STATUS_ESCALATED
            );
            return;
        }
        if (status == STATUS_FAILED) {
            // Complement of raiseDispute's window: closed once block.timestamp > failedAt + 3 days.
            uint64 closesAt = t.failedAt + APPEAL_WINDOW;
            if (block.timestamp <= closesAt) revert AppealWindowOpen(closesAt);
        }
        t.status = STATUS_REFUNDED;
        uint256 amount = t.reward;
        emit TaskRefunded(taskId, msg.sender, amount, status, STATUS_REFUNDED);
        _send(taskId, msg.sender, amount, STATUS_REFUNDED);
    }

    /// @notice The agent collects an escalated reward at or after escalatedAt + 14 days,
    ///         unless the arbiter ruled first. Same 90% / 10% split as a passed verdict.
    function collectEscalated(uint256 taskId) external nonReentrant {
        Task storage t = _task(taskId);
        if (msg.sender != t.agent) revert NotAgent();
        if (t.status != STATUS_ESCALATED) revert WrongStatus(t.status);
        uint64 collectibleAt = t.escalatedAt + ESCALATION_DELAY;
        if (block.timestamp < collectibleAt) revert EscalationNotMature(collectibleAt);
        t.status = STATUS_COMPLETED;
        (uint256 agentAmount, uint256 fee) = _split(t.reward);
        emit EscalationCollected(taskId, msg.sender, agentAmount, fee, STATUS_COMPLETED);
        _payAgent(taskId, msg.sender, agentAmount, fee, STATUS_COMPLETED);
    }

    // ------------------------------------------------------------------ pull payments

    /// @notice Pay the caller's credited payouts (those the token refused to deliver) to
    ///         `to`, which may be another address than the one the token blocks.
    function withdraw(address to) external nonReentrant {
        if (to == address(0)) revert ZeroAddress();
        uint256 amount = owed[msg.sender];
        if (amount == 0) revert NothingOwed();
        owed[msg.sender] = 0;
        totalOwed -= amount;
        emit Withdrawn(msg.sender, to, amount);
        _safeTransfer(to, amount);
    }

    // ------------------------------------------------------------------ administration

    /// @notice Rotate the key whose verdicts the escrow trusts for marketplace-verified tasks.
    function setMarketplaceVerifier(address newVerifier) external onlyOwner {
        if (newVerifier == address(0)) revert ZeroAddress();
        emit MarketplaceVerifierChanged(marketplaceVerifier, newVerifier);
        marketplaceVerifier = newVerifier;
    }

    function setArbiter(address newArbiter) external onlyOwner {
        if (newArbiter == address(0)) revert ZeroAddress();
        emit ArbiterChanged(arbiter, newArbiter);
        arbiter = newArbiter;
    }

    function setFeeRecipient(address newRecipient) external onlyOwner {
        if (newRecipient == address(0)) revert ZeroAddress();
        emit FeeRecipientChanged(feeRecipient, newRecipient);
        feeRecipient = newRecipient;
    }

    function transferOwnership(address newOwner) external onlyOwner {
        if (newOwner == address(0)) revert ZeroAddress();
        emit OwnershipTransferred(owner, newOwner);
        owner = newOwner;
    }

    // ------------------------------------------------------------------ views

    /// @notice Every field of a task; reverts TaskNotFound for unknown ids.
    function getTask(uint256 taskId) external view returns (Task memory) {
        return _taskView(taskId);
    }

    /// @notice Number of tasks created; ids run from 1 to taskCount().
    function taskCount() external view returns (uint256) {
        return _taskCount;
    }

    /// @notice True once attempt `attempt` of the task has received a verdict.
    function isJudged(uint256 taskId, uint8 attempt) external view returns (bool) {
        Task storage t = _taskView(taskId);
        if (attempt == 0 || attempt > MAX_SUBMISSIONS) return false;
        return (t.judgedMask & (uint8(1) << (attempt - 1))) != 0;
    }

    /// @notice The address whose verdict the task accepts right now.
    function verifierOf(uint256 taskId) external view returns (address) {
        return _judgeOf(_taskView(taskId));
    }

    // ------------------------------------------------------------------ internals

    function _task(uint256 taskId) private view returns (Task storage t) {
        return _taskView(taskId);
    }

    function _taskView(uint256 taskId) private view returns (Task storage t) {
        if (taskId == 0 || taskId > _taskCount) revert TaskNotFound(taskId);
        t = _tasks[taskId];
    }

    function _judgeOf(Task storage t) private view returns (address) {
        address v = t.verifier;
        return v == address(0) ? marketplaceVerifier : v;
    }

    /// @dev Agent share rounds up: the fee is floor(amount * 10%), the agent gets the rest.
    function _split(uint256 amount) private pure returns (uint256 agentAmount, uint256 fee) {
        fee = amount * FEE_BPS / BPS_DENOMINATOR;
        agentAmount = amount - fee;
    }

    function _payAgent(uint256 taskId, address agent, uint256 agentAmount, uint256 fee, uint8 status) private {
        if (agentAmount != 0) _send(taskId, agent, agentAmount, status);
        if (fee != 0) _send(taskId, feeRecipient, fee, status);
    }

    /// @dev Push a payout; if the token refuses it (revert, `false`, malformed return),
    ///      credit it to `to` instead so no recipient can block the task's settlement.
    function _send(uint256 taskId, address to, uint256 amount, uint8 status) private {
        if (_tryTransfer(to, amount)) return;
        owed[to] += amount;
        totalOwed += amount;
        emit PaymentDeferred(taskId, to, amount, status);
    }

    /// @dev A transfer the token cannot turn into a revert: at most `TRANSFER_GAS` (a token
    ///      cannot spend the caller's gas), at most one return word copied (nor make the
    ///      escrow pay for a huge return value), and nothing or exactly `true` accepted.
    function _tryTransfer(address to, uint256 amount) private returns (bool delivered) {
        if (gasleft() < PUSH_GAS) revert GasTooLow();
        bytes memory data = abi.encodeCall(IERC20Like.transfer, (to, amount));
        address tokenAddress = address(token);
        bool ok;
        uint256 size;
        uint256 word;
        assembly ("memory-safe") {
            ok := call(TRANSFER_GAS, tokenAddress, 0, add(data, 32), mload(data), 0, 32)
            size := returndatasize()
            word := mload(0)
        }
        return ok && (size == 0 || (size >= 32 && word == 1));
    }

    /// @dev Pulls exactly `amount`: a fee-on-transfer token would leave tasks underfunded.
    function _pull(address from, uint256 amount) private {
        uint256 before = token.balanceOf(address(this));
        _call(abi.encodeCall(IERC20Like.transferFrom, (from, address(this), amount)));
        if (token.balanceOf(address(this)) != before + amount) revert TokenTransferFailed();
    }

    function _safeTransfer(address to, uint256 amount) private {
        _call(abi.encodeCall(IERC20Like.transfer, (to, amount)));
    }

    /// @dev Accepts tokens that return nothing; refuses a `false` return or a revert.
    function _call(bytes memory data) private {
        (bool ok, bytes memory ret) = address(token).call(data);
        if (!ok || (ret.length != 0 && (ret.length < 32 || !abi.decode(ret, (bool))))) {
            revert TokenTransferFailed();
        }
    }
}

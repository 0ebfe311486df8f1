// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// @title GasBurnToken
/// @notice Test-only hostile ERC-20 (never deployed outside tests; not compiled into
///         schemas/): a transfer to a marked recipient burns every unit of gas it is given,
///         as a token with a transfer hook does when the recipient (a contract wallet)
///         spends without end. Anyone may `mint` and `setBurner`.
contract GasBurnToken {
    uint8 public constant decimals = 6;

    uint256 public totalSupply;
    mapping(address => uint256) public balanceOf;
    mapping(address => mapping(address => uint256)) public allowance;
    mapping(address => bool) public burner;

    event Transfer(address indexed from, address indexed to, uint256 value);
    event Approval(address indexed owner, address indexed spender, uint256 value);

    function mint(address to, uint256 amount) external {
        totalSupply += amount;
        balanceOf[to] += amount;
        emit Transfer(address(0), to, amount);
    }

    function setBurner(address account, bool burns) external {
        burner[account] = burns;
    }

    function approve(address spender, uint256 amount) external returns (bool) {
        allowance[msg.sender][spender] = amount;
        emit Approval(msg.sender, spender, amount);
        return true;
    }

    function transfer(address to, uint256 amount) external returns (bool) {
        if (burner[to]) {
            // The recipient's hook: spends whatever gas is left.
            assembly ("memory-safe") {
                invalid()
            }
        }
        _transfer(msg.sender, to, amount);
        return true;
    }

    function transferFrom(address from, address to, uint256 amount) external returns (bool) {
        uint256 allowed = allowance[from][msg.sender];
        if (allowed != type(uint256).max) allowance[from][msg.sender] = allowed - amount;
        _transfer(from, to, amount);
        return true;
    }

    function _transfer(address from, address to, uint256 amount) private {
        balanceOf[from] -= amount;
        balanceOf[to] += amount;
        emit Transfer(from, to, amount);
    }
}

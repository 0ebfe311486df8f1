-- Seed 002's whole proof of an auto verdict, signed as EIP-712 typed data
-- (relayer/verification/proof.py); served by GET /v1/tasks/{chain}/{escrow}/{task}/proof.
ALTER TABLE verification_results ADD COLUMN IF NOT EXISTS signed_proof jsonb;

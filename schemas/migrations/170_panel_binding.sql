-- Panels that resist farming and sybils, attestations bound to what they judge
-- (docs/panels.md). Forward only.

-- The evidence hash of the task's latest attempt, from EvidenceSubmitted.
ALTER TABLE panel_tasks ADD COLUMN evidence_hash text CHECK (evidence_hash ~ '^0x[0-9a-f]{64}$');

-- A round is bound, when it is drawn, to the attempt it judges and that attempt's on-chain
-- evidence hash (every attestation signs both), and to the minimum confidence it counts.
-- Rounds drawn before this migration carry NULL (no attestation can bind to them) and 0.
ALTER TABLE panel_rounds
    ADD COLUMN attempt            smallint CHECK (attempt BETWEEN 1 AND 255),
    ADD COLUMN evidence_hash      text     CHECK (evidence_hash ~ '^0x[0-9a-f]{64}$'),
    ADD COLUMN min_confidence_ppm integer  NOT NULL DEFAULT 0 CHECK (min_confidence_ppm BETWEEN 0 AND 1000000),
    ADD CONSTRAINT panel_rounds_bound_whole CHECK ((attempt IS NULL) = (evidence_hash IS NULL));

-- A seat keeps the operator its verifier had when it was drawn: later changes never move it.
ALTER TABLE panel_seats ADD COLUMN operator text CHECK (length(operator) BETWEEN 1 AND 64);

CREATE FUNCTION panel_seat_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.verifier <> OLD.verifier OR NEW.operator IS DISTINCT FROM OLD.operator
       OR NEW.calibration_ppm <> OLD.calibration_ppm THEN
        RAISE EXCEPTION 'seat % of round % is frozen (verifier, operator, calibration)', OLD.seat, OLD.round_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER panel_seat_frozen BEFORE UPDATE ON panel_seats FOR EACH ROW EXECUTE FUNCTION panel_seat_frozen();

-- An operator id change takes effect only after a cool-down; until then the old one is the
-- verifier's operator and both exclude it from their parties' rounds.
ALTER TABLE panel_verifiers
    ADD COLUMN pending_operator      text        CHECK (length(pending_operator) BETWEEN 1 AND 64),
    ADD COLUMN operator_effective_at timestamptz,
    ADD CONSTRAINT panel_verifiers_pending_whole
        CHECK ((pending_operator IS NULL) = (operator_effective_at IS NULL)),
    ADD CONSTRAINT panel_verifiers_pending_differs CHECK (pending_operator IS DISTINCT FROM operator);

-- Only seats with at least the round's minimum confidence earn (it was "confidence > 0").
CREATE OR REPLACE FUNCTION panel_fee_needs_weight() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.reason = 'attestation_fee' AND NOT EXISTS (
        SELECT 1 FROM panel_seats s JOIN panel_rounds r USING (round_id)
        WHERE s.round_id = NEW.round_id AND s.verifier = NEW.account
          AND NOT s.timed_out AND s.confidence_ppm >= greatest(1, r.min_confidence_ppm)
    ) THEN
        RAISE EXCEPTION 'no weighted seat of % in round %', NEW.account, NEW.round_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

-- Private briefs, format 2 (docs/agents.md): the ciphertext starts with its format byte 2 and
-- holds at least its header (45 bytes) and tag (16); a wrapped key is 82 bytes, 112 characters
-- of base64. NOT VALID: rows stored before (format 1) stay readable as refusals, new rows obey.
ALTER TABLE task_briefs ADD CONSTRAINT task_briefs_format_2
    CHECK (NOT private OR (get_byte(ciphertext, 0) = 2 AND length(ciphertext) >= 61)) NOT VALID;
ALTER TABLE brief_keys ADD CONSTRAINT brief_keys_format_2
    CHECK (length(wrapped) = 112) NOT VALID;

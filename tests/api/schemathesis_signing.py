"""Schemathesis hook (`SCHEMATHESIS_HOOKS=<this file>`): every generated request carries a valid
EIP-712 request signature (`schemas.request_auth`) for the deployment the API serves, so the
fuzz of the signed routes (agent review, panels) gets past authentication and reaches
validation and the handlers.

The signature is made over the request exactly as it goes on the wire: a `requests` auth
callable runs after the body is serialized and the URL (query included) is built, signs
`METHOD`, the path the server reads (percent-decoded, `?query` appended) and the body bytes,
and sets the four `X-Escrowd-*` headers, replacing whatever schemathesis generated for them.
Each request gets a fresh nonce and a short expiry.

Configuration, from the environment of the `st` process:

- `ESCROWD_FUZZ_SIGNING_KEY`: 0x hex key that signs (a test key);
- `ESCROWD_FUZZ_CHAIN_ID`, `ESCROWD_FUZZ_ESCROW`: the deployment the API serves;
- `ESCROWD_FUZZ_REPORT` (optional): a file that gets one line per answer,
  `METHOD PATH-TEMPLATE STATUS CODE`, so the test can see what the fuzz reached.

Where a body holds what the schema cannot describe, the hook puts a value there that the
rule behind it accepts, so schema-valid bodies get past those rules too: the signer's own
address where a verifier registers itself, and a point of secp256k1 (the signer's public key)
as an executor's `encryptionPublicKey` (the schema can say "33 bytes", not "on the curve").
Schemathesis re-validates a case a hook edited, so a negative case the edit repaired is
judged as the positive one it became.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any
from urllib.parse import unquote, urlsplit

import schemathesis
from coincurve import PrivateKey
from eth_account import Account

from schemas.request_auth import Deployment, UnsignedRequest, sign_request

KEY = os.environ["ESCROWD_FUZZ_SIGNING_KEY"]
SIGNER = Account.from_key(KEY).address
DEPLOYMENT = Deployment(chain_id=int(os.environ["ESCROWD_FUZZ_CHAIN_ID"]), escrow=os.environ["ESCROWD_FUZZ_ESCROW"])
EXPIRES_IN = 120
"""Seconds: below the API's `signature_max_ttl_seconds` (300 by default)."""
PUBLIC_KEY = "0x" + PrivateKey(bytes.fromhex(KEY[2:])).public_key.format(compressed=True).hex()
REALISTIC = {
    "/panels/verifiers": {"address": SIGNER},
    "/v1/executors/me": {"encryptionPublicKey": PUBLIC_KEY},
}
"""Per path: body fields set to values the rules behind the schema accept."""


class SignRequest:
    """`requests` auth: sign the prepared request as sent."""

    def __call__(self, prepared: Any) -> Any:
        url = urlsplit(prepared.url)
        path = unquote(url.path) + (f"?{url.query}" if url.query else "")
        body = prepared.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        headers = sign_request(KEY, UnsignedRequest(prepared.method, path, body, deployment=DEPLOYMENT,
                               expires_at=int(time.time()) + EXPIRES_IN, nonce=secrets.token_urlsafe(16)))
        for name in list(prepared.headers):
            if name.lower().startswith("x-escrowd-"):
                del prepared.headers[name]
        prepared.headers.update(headers)
        return prepared


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if isinstance(case.body, dict):
        for field, value in REALISTIC.get(case.operation.path, {}).items():
            if isinstance(case.body.get(field), str):
                case.body[field] = value
    kwargs["auth"] = SignRequest()


REPORT = os.environ.get("ESCROWD_FUZZ_REPORT")


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    if REPORT is None:
        return
    code = "-"
    try:
        body = json.loads(response.content or b"null")
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = str(body["error"].get("code", "-"))
    except ValueError:
        pass
    with open(REPORT, "a", encoding="utf-8") as handle:
        handle.write(f"{case.method.upper()} {case.operation.path} {response.status_code} {code}\n")

"""`escrowd devnet`: a local chain with the escrow deployed, for manual work and demos."""

from __future__ import annotations

import json
import signal
import sys
import time
from types import FrameType

import typer

from escrowd.devnet import deploy_devnet
from runtime.services.anvil import AnvilProcess


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (docker stop, kill) takes the same path as Ctrl-C so anvil is stopped.
    raise KeyboardInterrupt


def devnet(
    port: int = typer.Option(0, help="RPC port on 127.0.0.1 (0: pick a free one)."),
    block_time: float = typer.Option(
        0.0, help="Seconds between blocks (0: mine each transaction at once)."
    ),
) -> None:
    """Start anvil, deploy the token and escrow, fund the actors, print them as JSON, and
    keep running until interrupted."""
    signal.signal(signal.SIGTERM, _interrupt)
    anvil = AnvilProcess(port=port, block_time=block_time or None)
    try:
        anvil.start()
        dn = deploy_devnet(anvil.rpc_url, ws_url=anvil.ws_url)
        sys.stdout.write(json.dumps(dn.describe(), indent=2) + "\n")
        sys.stdout.flush()
        typer.echo("devnet running; Ctrl-C to stop", err=True)
        while anvil.running:
            time.sleep(0.5)
        typer.echo("anvil exited unexpectedly", err=True)
        raise typer.Exit(code=1)
    except KeyboardInterrupt:
        typer.echo("stopping devnet", err=True)
    finally:
        anvil.stop()

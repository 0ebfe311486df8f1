"""Validate deploy/k8s offline: every object against the Kubernetes OpenAPI schemas shipped in
the `kubernetes-validate` package, strictly (an unknown field is an error). No cluster needed,
unlike `kubectl apply --dry-run=client`.

    python scripts/k8s_validate.py [--version 1.31] [FILE ...]   # default: deploy/k8s/*.yaml

Prints one line per invalid object and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import kubernetes_validate
import yaml

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"
VERSION = "1.31"


def problems(paths: list[Path], version: str = VERSION) -> list[str]:
    """`file: Kind/name: message` for every object that does not validate."""
    found = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc:
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
                name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
                found.append(f"{path.name}: {name}: {str(exc).splitlines()[0][:300]}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=VERSION, help="Kubernetes version of the schemas")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    paths = args.files or sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    found = problems(paths, args.version)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

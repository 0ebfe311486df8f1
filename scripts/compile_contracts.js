#!/usr/bin/env node
// Compiles contracts/*.sol with the pinned npm solc and writes one artifact per contract to
// schemas/contracts/<Name>.json, so the Python side never needs a compiler at run time.
// Output is deterministic (sorted keys, fixed settings): re-running on unchanged sources
// gives byte-identical files, which is what tests/contract/test_artifacts.py relies on.
//
// usage: node scripts/compile_contracts.js [--out DIR]
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const path = require("path");
const solc = require("solc");

const ROOT = path.resolve(__dirname, "..");
const CONTRACTS = ["AgentEscrow", "MockUSDC"];
const SETTINGS = {
  optimizer: { enabled: true, runs: 200 },
  evmVersion: "cancun",
  viaIR: true,
  outputSelection: {
    "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] },
  },
};

function parseArgs(argv) {
  let out = path.join(ROOT, "schemas", "contracts");
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--out" && i + 1 < argv.length) {
      out = path.resolve(argv[++i]);
    } else {
      throw new Error(`unknown argument: ${argv[i]}`);
    }
  }
  return { out };
}

// Stable key order at every level, so the JSON never changes unless the content does.
function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value && typeof value === "object") {
    const sorted = {};
    for (const key of Object.keys(value).sort()) sorted[key] = sortKeys(value[key]);
    return sorted;
  }
  return value;
}

function main() {
  const { out } = parseArgs(process.argv.slice(2));
  const sources = {};
  for (const name of CONTRACTS) {
    const rel = `contracts/${name}.sol`;
    sources[rel] = { content: fs.readFileSync(path.join(ROOT, rel), "utf8") };
  }
  const input = { language: "Solidity", sources, settings: SETTINGS };
  const output = JSON.parse(solc.compile(JSON.stringify(input)));

  const errors = (output.errors || []).filter((e) => e.severity === "error");
  for (const e of output.errors || []) process.stderr.write(`${e.formattedMessage}\n`);
  if (errors.length > 0) process.exit(1);

  fs.mkdirSync(out, { recursive: true });
  for (const name of CONTRACTS) {
    const rel = `contracts/${name}.sol`;
    const compiled = output.contracts[rel][name];
    const artifact = {
      contractName: name,
      abi: compiled.abi,
      bytecode: "0x" + compiled.evm.bytecode.object,
      deployedBytecode: "0x" + compiled.evm.deployedBytecode.object,
      compiler: {
        name: "solc",
        version: solc.version(),
        settings: { optimizer: SETTINGS.optimizer, evmVersion: SETTINGS.evmVersion, viaIR: SETTINGS.viaIR },
      },
      sourcePath: rel,
      sourceHash: "sha256:" + crypto.createHash("sha256").update(sources[rel].content).digest("hex"),
    };
    const file = path.join(out, `${name}.json`);
    fs.writeFileSync(file, JSON.stringify(sortKeys(artifact), null, 2) + "\n");
    process.stdout.write(`wrote ${path.relative(process.cwd(), file) || file}\n`);
  }
}

main();

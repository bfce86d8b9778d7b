#!/usr/bin/env python3
"""Adds seed inputs of each fuzz target to fuzz/corpus/<target>/ from the golden bus
fixtures, the OpenSandbox recording and a few hand-written bodies. The committed corpus
(fuzz/corpus/<target>/) is these seeds minimized with `cargo fuzz cmin` plus whatever later
runs added; see docs/reliability.md ("Fuzzing").

Usage: fuzz/make_seeds.py KEY1 KEY2   (two keys from `differently key generate`)
"""
import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEEDS = ROOT / "fuzz" / "corpus"
RECORDING = ROOT / "adapters" / "tests" / "fixtures" / "opensandbox" / "opensandbox-server-1.1.1-docker.jsonl"


def put(target, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main():
    keys = sys.argv[1:]
    if len(keys) < 2:
        sys.exit("usage: make_seeds.py KEY1 KEY2")
    # api_key: real keys, and near misses of each part.
    for k in keys:
        put("api_key", k)
        put("api_key", k[:-1])
        put("api_key", k[:-1] + ("A" if k[-1] != "A" else "B"))
        put("api_key", k.replace("dly_", "dlx_", 1))
        put("api_key", "Bearer " + k)
    put("api_key", "dly_key_01J00000000000000000000000_" + "A" * 40)
    put("api_key", "dly__")

    # request_body: create, PATCH and exec bodies as clients send them.
    bodies = [
        {},
        {"ttlSeconds": 60, "labels": {"team": "a"}, "idleTimeoutSeconds": 300},
        {"projectId": "prj_01J00000000000000000000000", "template": "python:3.12", "profile": "small",
         "resources": {"cpu": 2, "memoryMb": 1024, "diskMb": 2048}, "env": {"A": "1"},
         "capabilities": ["exec.stream"], "classification": "internal", "region": "local",
         "strategy": "cheapest", "priority": 5},
        {"fromSnapshot": "snp_01J00000000000000000000000"},
        {"idleTimeoutSeconds": None},
        {"command": ["echo", "hi"], "env": {"X": "y"}, "cwd": "/tmp", "stdin": "in\u0000put",
         "timeoutSeconds": 10, "outputEncoding": "base64"},
        {"command": ["cat"], "stdinBase64": "aGVsbG8="},
        {"labels": {"k\u0000": "v"}},
    ]
    for b in bodies:
        put("request_body", json.dumps(b))
    put("request_body", '{"ttlSeconds":60} junk')
    put("request_body", '{"ttlSeconds":18446744073709551615}')
    put("request_body", '{"idleTimeoutSeconds":1e16}')
    put("request_body", "   ")

    # execd_stream: every streamed command answer in the recording, behind a chunk-size byte.
    with RECORDING.open() as f:
        for i, line in enumerate(f):
            r = json.loads(line)
            if i == 0 or r.get("status") != 200 or not r["path"].endswith("/command"):
                continue
            body = r["responseBody"]
            if isinstance(body, str) and body.startswith("{"):
                put("execd_stream", b"\x07" + body.encode())
                sse = "".join(f"data: {l}\n" if l else "\n" for l in body.split("\n"))
                put("execd_stream", b"\x01" + sse.encode())
    put("execd_stream", b"\x03: hi\r\nevent: message\r\ndata: {\"type\":\"stdout\",\r\ndata: \"text\":\"x\\n\"}\r\n\r\n")

    # bus_envelope: the golden fixtures of every message kind.
    for p in sorted((ROOT / "bus-schema" / "tests" / "golden" / "fixtures").glob("*.json")):
        put("bus_envelope", p.read_bytes())


if __name__ == "__main__":
    main()
